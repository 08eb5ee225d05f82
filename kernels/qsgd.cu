// QSGD on the GPU: quantise + pack, unpack + dequantise (+ accumulate). Loaded with CuPy
// (qbench/compress/kernels/cuda/); `make kernels` compiles it with nvcc so errors show without
// a GPU. The per-element maths is kernels/qsgd_math.h, shared with the C loops: payloads are
// byte-identical to the torch reference (qbench/compress/qsgd.py).
//
// Wire layout: code i at bits [i*bits, (i+1)*bits) of a little-endian byte stream, so a group
// of 8 consecutive codes fills exactly `bits` bytes (16-bit codes: 16 bytes) and one thread
// owns one group: no two threads write the same byte.
//
// bucket_size % 8 == 0 (groups never straddle buckets), buckets up to 8192 values and 16-byte
// aligned tensors: qb_qsgd_encode_vec and qb_qsgd_decode_vec (below), one pass over global
// memory in 16-byte accesses. Otherwise the general kernels: encode, bucket_size % 8 == 0:
// qb_qsgd_encode_fused, one block per bucket, reads the bucket once for its scale and again
// (from cache) for the codes; other bucket sizes: qb_qsgd_scales (block per bucket) then
// qb_qsgd_quantize (thread per group); decode: qb_qsgd_decode (thread per group).
#include "qsgd_math.h"

struct QsgdArgs {
  int64_t n, bucket;
  int32_t bits, layout, top;
  uint32_t key_hash, offset;
};

// Scale of the bucket of cnt values at xb: max |x| or the l2 norm in the reference tree order.
struct SquareLeaf {
  const float *x;
  int64_t cnt;
  __device__ float operator()(int64_t i) const {
    return i < cnt ? QB_FMUL(x[i], x[i]) : 0.0f;
  }
};

__device__ float qb_bucket_scale(const float *xb, int64_t cnt, int64_t bucket, int32_t norm,
                                 float *smem) {
  if (norm == QB_NORM_L2) {
    SquareLeaf leaf = {xb, cnt};
    return QB_FSQRT(qb_block_tree_sum(leaf, qb_tree_width(bucket), smem));
  }
  uint32_t m = 0;  // max of the sign-cleared bit patterns: the float order, NaN included
  for (int64_t i = threadIdx.x; i < cnt; i += blockDim.x) {
    const uint32_t b = __float_as_uint(xb[i]) & 0x7fffffffu;
    m = b > m ? b : m;
  }
  return __uint_as_float(qb_block_max_u32(m, (uint32_t *)smem));
}

// Codes of group g (values 8g .. 8g+7 below n), written as its bytes of the stream. scales: one
// per bucket, or NULL when every value of the group has the scale `scale`.
__device__ void qb_qsgd_encode_group(const float *x, const float *scales, float scale, int64_t g,
                                     const QsgdArgs &a, uint8_t *levels) {
  const int64_t e0 = 8 * g, end = qb_min64(e0 + 8, a.n);
  int64_t b = e0 / a.bucket, next = (b + 1) * a.bucket;
  if (scales) scale = scales[b];
  uint64_t word = 0;
  uint32_t codes[8];
  for (int64_t e = e0; e < end; e++) {
    if (e == next) {  // only in the unfused kernel: the group reaches the next bucket
      next += a.bucket;
      scale = scales[++b];
    }
    int32_t code = 0;
    if (!qb_qsgd_zero_bucket(scale, a.layout)) {
      const float u = qb_uniform32(a.key_hash, a.offset + (uint32_t)e);
      code = qb_qsgd_level(x[e], qb_qsgd_divisor(scale), a.top, u, a.layout);
    }
    codes[e - e0] = (uint32_t)code;
    if (a.bits != 16) word |= (uint64_t)code << ((e - e0) * a.bits);  // a shift < 64
  }
  if (a.bits == 16) {
    for (int64_t e = e0; e < end; e++) {
      levels[2 * e] = (uint8_t)(codes[e - e0] & 0xffu);
      levels[2 * e + 1] = (uint8_t)(codes[e - e0] >> 8);
    }
    return;
  }
  const int64_t nbytes = ((end - e0) * a.bits + 7) / 8;  // `bits`, except in the last group
  uint8_t *out = levels + g * a.bits;
  for (int64_t i = 0; i < nbytes; i++) out[i] = (uint8_t)(word >> (8 * i));
}

__device__ QsgdArgs qb_qsgd_args(int64_t n, int64_t bucket, int32_t bits, int32_t layout,
                                 uint32_t key_hash, uint32_t offset) {
  QsgdArgs a = {n, bucket, bits, layout, qb_qsgd_top(bits, layout), key_hash, offset};
  return a;
}

// One block per bucket (grid-stride over buckets); bucket % 8 == 0; dynamic shared memory:
// blockDim.x floats, blockDim.x a power of two >= 32.
extern "C" __global__ void qb_qsgd_encode_fused(const float *x, int64_t n, int64_t bucket,
                                                int32_t bits, int32_t layout, int32_t norm,
                                                uint32_t key_hash, uint32_t offset,
                                                uint8_t *levels, float *scales) {
  extern __shared__ float smem[];
  const QsgdArgs a = qb_qsgd_args(n, bucket, bits, layout, key_hash, offset);
  for (int64_t b = blockIdx.x; b * bucket < n; b += gridDim.x) {
    const int64_t start = b * bucket, cnt = qb_min64(bucket, n - start);
    const float s = qb_bucket_scale(x + start, cnt, bucket, norm, smem);
    if (threadIdx.x == 0) scales[b] = s;
    for (int64_t g = start / 8 + threadIdx.x; 8 * g < start + cnt; g += blockDim.x)
      qb_qsgd_encode_group(x, NULL, s, g, a, levels);
  }
}

// Scales only, one block per bucket (grid-stride); shared memory as above.
extern "C" __global__ void qb_qsgd_scales(const float *x, int64_t n, int64_t bucket, int32_t norm,
                                          float *scales) {
  extern __shared__ float smem[];
  for (int64_t b = blockIdx.x; b * bucket < n; b += gridDim.x) {
    const int64_t start = b * bucket;
    const float s = qb_bucket_scale(x + start, qb_min64(bucket, n - start), bucket, norm, smem);
    if (threadIdx.x == 0) scales[b] = s;
  }
}

// Codes from known scales, one thread per group of 8 (grid-stride).
extern "C" __global__ void qb_qsgd_quantize(const float *x, const float *scales, int64_t n,
                                            int64_t bucket, int32_t bits, int32_t layout,
                                            uint32_t key_hash, uint32_t offset,
                                            uint8_t *levels) {
  const QsgdArgs a = qb_qsgd_args(n, bucket, bits, layout, key_hash, offset);
  const int64_t groups = (n + 7) / 8;
  for (int64_t g = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; g < groups;
       g += (int64_t)gridDim.x * blockDim.x)
    qb_qsgd_encode_group(x, scales, 0.0f, g, a, levels);
}

// levels + scales -> out (accumulate: out += values), one thread per group of 8 (grid-stride).
extern "C" __global__ void qb_qsgd_decode(const uint8_t *levels, const float *scales, int64_t n,
                                          int64_t bucket, int32_t bits, int32_t layout,
                                          float *out, int32_t accumulate) {
  const int32_t top = qb_qsgd_top(bits, layout);
  const int64_t groups = (n + 7) / 8;
  for (int64_t g = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; g < groups;
       g += (int64_t)gridDim.x * blockDim.x) {
    const int64_t e0 = 8 * g, end = qb_min64(e0 + 8, n);
    uint64_t word = 0;
    if (bits != 16) {
      const int64_t nbytes = ((end - e0) * bits + 7) / 8;
      for (int64_t i = 0; i < nbytes; i++) word |= (uint64_t)levels[g * bits + i] << (8 * i);
    }
    int64_t b = e0 / bucket, next = (b + 1) * bucket;
    float step = qb_qsgd_step(scales[b], top);
    for (int64_t e = e0; e < end; e++) {
      if (e == next) {
        next += bucket;
        step = qb_qsgd_step(scales[++b], top);
      }
      const int32_t code =
          bits == 16 ? (int32_t)levels[2 * e] | (int32_t)levels[2 * e + 1] << 8
                     : (int32_t)((word >> ((e - e0) * bits)) & ((1u << bits) - 1u));
      const float v = qb_qsgd_value(code, step, top, layout);
      out[e] = accumulate ? QB_FADD(out[e], v) : v;
    }
  }
}

// -- one pass, the bucket in registers ------------------------------------------------------------
// qb_qsgd_encode_vec and qb_qsgd_decode_vec take bucket % 8 == 0 (a group of 8 codes never
// straddles two buckets) and 16-byte aligned tensors (the launcher checks every pointer once; a
// view may start at any float, and then the kernels above run). A thread holds one group of 8
// consecutive values: two float4 loads, then codes from the registers, stored as one access of
// `bits` bytes where bits is a power of two (2: uint16, 4: uint32, 8: uint64, 16: 16 bytes; the
// group starts g * bits bytes into the 16-byte aligned stream, a multiple of that width).

// A group's codes: bits [0, 64) of the stream in lo, [64, 128) in hi (16-bit codes only).
struct QsgdWords {
  uint64_t lo, hi;
};

__device__ __forceinline__ void qb_qsgd_st_u16(uint8_t *p, uint32_t v) {
  QB_ALIGNED(p, 2);
  *(uint16_t *)p = (uint16_t)v;
}
__device__ __forceinline__ uint32_t qb_qsgd_ld_u16(const uint8_t *p) {
  QB_ALIGNED(p, 2);
  return *(const uint16_t *)p;
}
__device__ __forceinline__ void qb_qsgd_st_u128(uint8_t *p, QsgdWords w) {
  QB_ALIGNED(p, 16);
  *(uint4 *)p = make_uint4((uint32_t)w.lo, (uint32_t)(w.lo >> 32), (uint32_t)w.hi,
                           (uint32_t)(w.hi >> 32));
}
__device__ __forceinline__ QsgdWords qb_qsgd_ld_u128(const uint8_t *p) {
  QB_ALIGNED(p, 16);
  const uint4 v = *(const uint4 *)p;
  QsgdWords w = {(uint64_t)v.y << 32 | v.x, (uint64_t)v.w << 32 | v.z};
  return w;
}

// The nbytes bytes of a group at p: one access for a whole group (nbytes == bits) of a width that
// is a power of two, byte by byte otherwise (3, 5, 6, 7 bits; the last group when it is short).
__device__ void qb_qsgd_put(uint8_t *p, QsgdWords w, int32_t bits, int64_t nbytes) {
  const bool whole = nbytes == bits;
  if (whole && bits == 16) {
    qb_qsgd_st_u128(p, w);
  } else if (whole && bits == 8) {
    qb_st_u64(p, w.lo);
  } else if (whole && bits == 4) {
    qb_st_u32(p, (uint32_t)w.lo);
  } else if (whole && bits == 2) {
    qb_qsgd_st_u16(p, (uint32_t)w.lo);
  } else {
    for (int64_t i = 0; i < nbytes; i++) p[i] = (uint8_t)((i < 8 ? w.lo : w.hi) >> (8 * (i & 7)));
  }
}

__device__ QsgdWords qb_qsgd_get(const uint8_t *p, int32_t bits, int64_t nbytes) {
  const bool whole = nbytes == bits;
  QsgdWords w = {0, 0};
  if (whole && bits == 16) {
    w = qb_qsgd_ld_u128(p);
  } else if (whole && bits == 8) {
    w.lo = qb_ld_u64(p);
  } else if (whole && bits == 4) {
    w.lo = qb_ld_u32(p);
  } else if (whole && bits == 2) {
    w.lo = qb_qsgd_ld_u16(p);
  } else {
    for (int64_t i = 0; i < nbytes; i++) {
      if (i < 8) w.lo |= (uint64_t)p[i] << (8 * i);
      else w.hi |= (uint64_t)p[i] << (8 * (i - 8));
    }
  }
  return w;
}

// Swaps N values with thread threadIdx.x ^ d of the same bucket (whose threads are aligned in the
// block to their power-of-two count). Every thread of the block calls it with the same d. Inside
// a warp (d < 32) a shuffle; across warps through shared memory, two buffers of 4 * blockDim.x
// words used in turn, so one barrier per swap is enough: a thread writes a buffer again only
// after the next swap's barrier, which every thread reaches after its reads of the last one.
struct QsgdSwap {
  float *smem;  // 8 * blockDim.x floats when a bucket spans warps
  int buf;
  template <int N>
  __device__ void operator()(float (&v)[N], int d) {
    if (d < 32) {
#pragma unroll
      for (int i = 0; i < N; i++) v[i] = __shfl_xor_sync(0xffffffffu, v[i], d);
      return;
    }
    float *b = smem + buf * 4 * blockDim.x;
    buf ^= 1;
#pragma unroll
    for (int i = 0; i < N; i++) b[i * blockDim.x + threadIdx.x] = v[i];
    __syncthreads();
#pragma unroll
    for (int i = 0; i < N; i++) v[i] = b[i * blockDim.x + (threadIdx.x ^ d)];
  }
};

// a + the partner's a, both partners alike (a + b == b + a, bit for bit).
__device__ __forceinline__ float qb_qsgd_add_swapped(float a, int d, QsgdSwap &swap) {
  float o[1] = {a};
  swap(o, d);
  return QB_FADD(a, o[0]);
}

// One level d of the trees over the bucket's threads while each holds M leaves q[0..M) (leaf
// slots k0 .. k0 + M - 1): threads t and t ^ d hold the same slots, the lower the tree's left
// operands. The lower keeps the sums of the first M/2 slots, the upper those of the last M/2,
// so each sends only the half it drops.
template <int M>
__device__ __forceinline__ void qb_qsgd_scatter(float (&q)[8], int d, QsgdSwap &swap) {
  const bool upper = (threadIdx.x & d) != 0;
  float give[M / 2];
#pragma unroll
  for (int i = 0; i < M / 2; i++) give[i] = upper ? q[i] : q[i + M / 2];
  swap(give, d);
#pragma unroll
  for (int i = 0; i < M / 2; i++) q[i] = QB_FADD(upper ? q[i + M / 2] : q[i], give[i]);
}

// The l2 norm of a bucket in the reference tree order (qsgd_math.h, "sums"): pad the bucket's
// squares with +0.0 to w = 8 * lanes leaves (more +0.0 leaves than the next power of two of the
// bucket change nothing: x + +0.0 == x for every square), then for h = w/2 ... 1: leaf[i] +=
// leaf[i + h]. Thread t holds leaves 8t + k, k = 0..7, in slot k. A level h >= 8 adds slot k of
// thread t + h/8 to slot k of thread t (t < h/8): for each slot a tree over the threads, levels
// d = lanes/2 ... 1. Then h = 4, 2, 1 add the slots' totals S_k: ((S0 + S4) + (S2 + S6)) +
// ((S1 + S5) + (S3 + S7)). Run as a butterfly: at d = lanes/2, lanes/4, lanes/8 each pair of
// threads splits its slots (qb_qsgd_scatter: 4 + 2 + 1 swaps instead of 8 + 8 + 8), after which
// thread t holds only slot k whose bits 2, 1, 0 are t's bits lanes/2, lanes/4, lanes/8; the
// levels d < lanes/8 are one swap each, and the levels h = 4, 2, 1 pair threads across those
// same bits: lanes/2, lanes/4, lanes/8. Every thread ends with the norm. lanes >= 8.
__device__ float qb_qsgd_l2(const float (&v)[8], int lanes, QsgdSwap &swap) {
  float q[8];
#pragma unroll
  for (int k = 0; k < 8; k++) q[k] = QB_FMUL(v[k], v[k]);
  qb_qsgd_scatter<8>(q, lanes >> 1, swap);
  qb_qsgd_scatter<4>(q, lanes >> 2, swap);
  qb_qsgd_scatter<2>(q, lanes >> 3, swap);
  for (int d = lanes >> 4; d > 0; d >>= 1) q[0] = qb_qsgd_add_swapped(q[0], d, swap);
  for (int d = lanes >> 1; d >= lanes >> 3; d >>= 1) q[0] = qb_qsgd_add_swapped(q[0], d, swap);
  return QB_FSQRT(q[0]);
}

// max |x| of a bucket: the max of the sign-cleared bit patterns (the float order, NaN included).
__device__ float qb_qsgd_max(const float (&v)[8], int lanes, QsgdSwap &swap) {
  uint32_t m = 0;
#pragma unroll
  for (int k = 0; k < 8; k++) {
    const uint32_t b = __float_as_uint(v[k]) & 0x7fffffffu;
    m = b > m ? b : m;
  }
  for (int d = lanes >> 1; d >= 32; d >>= 1) {  // across warps first (a max: any order)
    float o[1] = {__uint_as_float(m)};          // bits moved, never computed on
    swap(o, d);
    m = __float_as_uint(o[0]) > m ? __float_as_uint(o[0]) : m;
  }
#pragma unroll
  for (int d = 16; d > 0; d >>= 1) {  // unrolled: partners d >= lanes are another bucket's
    const uint32_t o = __shfl_xor_sync(0xffffffffu, m, d);
    m = d < lanes && o > m ? o : m;
  }
  return __uint_as_float(m);
}

// Bits [0, nbits) set, nbits clamped to [0, 64].
__device__ __forceinline__ uint64_t qb_qsgd_low_bits(int64_t nbits) {
  return nbits <= 0 ? 0 : nbits >= 64 ? ~(uint64_t)0 : ((uint64_t)1 << nbits) - 1;
}

// The codes of the 8 values v from element index idx on (mod 2^32, as the draws take it), packed
// in 32-bit words of two codes each, joined once: codes 0..3 and 4..7 are a 64-bit word each, one
// after the other in lo for widths up to 8 bits, lo and hi for 16 bits.
template <int LAYOUT>
__device__ __forceinline__ QsgdWords qb_qsgd_pack(const float (&v)[8], uint32_t idx, float s,
                                                  const QsgdArgs &a) {
  const float div = qb_qsgd_divisor(s);
  uint32_t pair[4] = {0, 0, 0, 0};
#pragma unroll
  for (int k = 0; k < 8; k++) {
    const float u = qb_uniform32(a.key_hash, idx + (uint32_t)k);
    const uint32_t code = (uint32_t)qb_qsgd_level(v[k], div, a.top, u, LAYOUT);
    pair[k >> 1] |= code << ((k & 1) * a.bits);
  }
  const int32_t bits = a.bits;
  const uint64_t h0 = pair[0] | (uint64_t)pair[1] << (2 * bits);
  const uint64_t h1 = pair[2] | (uint64_t)pair[3] << (2 * bits);
  QsgdWords w = {bits == 16 ? h0 : h0 | h1 << (4 * bits), bits == 16 ? h1 : 0};
  return w;
}

// One pass: 2^log2_lanes threads per bucket (a power of two >= bucket / 8; >= 8 for l2), so a
// block holds blockDim.x >> log2_lanes whole buckets; blocks take batches of them grid-stride
// (the launcher sizes the grid for a few per block, so a thread's setup is paid once for them).
// buckets = ceil(n / bucket), from the host: no 64-bit division here. smem: 8 * blockDim.x
// floats when a bucket spans warps (lanes > 32), else unused.
__device__ __forceinline__ void qb_qsgd_encode_one_pass(
    const float *x, int64_t n, int64_t bucket, int64_t buckets, int32_t bits, int32_t layout,
    int32_t norm, uint32_t key_hash, uint32_t offset, int32_t log2_lanes, uint8_t *levels,
    float *scales, float *smem) {
  const QsgdArgs a = qb_qsgd_args(n, bucket, bits, layout, key_hash, offset);
  const int lanes = 1 << log2_lanes, t = threadIdx.x & (lanes - 1);  // t: the group in its bucket
  const bool mine = 8 * t < bucket;  // else a thread past the bucket's groups: +0.0 padding
  const int64_t per_block = blockDim.x >> log2_lanes, stride = gridDim.x * per_block;
  QsgdSwap swap = {smem, 0};
  for (int64_t first = blockIdx.x * per_block; first < buckets; first += stride) {
    const int64_t b = first + (threadIdx.x >> log2_lanes), e0 = b * bucket + 8 * t;
    const bool live = mine && b < buckets;
    int64_t cnt = 8;
    float v[8];
    if (live && e0 + 8 <= n) {
      const float4 v0 = qb_ld_f4(x + e0), v1 = qb_ld_f4(x + e0 + 4);
      v[0] = v0.x, v[1] = v0.y, v[2] = v0.z, v[3] = v0.w;
      v[4] = v1.x, v[5] = v1.y, v[6] = v1.z, v[7] = v1.w;
    } else {  // the last bucket: a short group, or none
      cnt = live && e0 < n ? n - e0 : 0;
#pragma unroll
      for (int k = 0; k < 8; k++) v[k] = k < cnt ? x[e0 + k] : 0.0f;
    }
    const float s = norm == QB_NORM_L2 ? qb_qsgd_l2(v, lanes, swap) : qb_qsgd_max(v, lanes, swap);
    if (t == 0 && b < buckets) scales[b] = s;
    if (cnt == 0) continue;
    const uint32_t idx = a.offset + (uint32_t)e0;
    QsgdWords w = {0, 0};  // every code 0 in a zero bucket
    if (layout == QB_LAYOUT_SIGN)
      w = qb_qsgd_pack<QB_LAYOUT_SIGN>(v, idx, s, a);
    else if (!qb_qsgd_zero_bucket(s, layout))
      w = qb_qsgd_pack<QB_LAYOUT_INTERVALS>(v, idx, s, a);
    if (cnt < 8) {  // the values past n are no values: their code bits stay 0
      w.lo &= qb_qsgd_low_bits(cnt * bits);
      w.hi &= qb_qsgd_low_bits(cnt * bits - 64);
    }
    qb_qsgd_put(levels + (e0 >> 3) * bits, w, bits, (cnt * bits + 7) / 8);
  }
}

// At most 32 registers (__launch_bounds__): 64 warps per SM, and two blocks of 1024 threads (a
// bucket of 8192 values each) per SM, where one alone would stall at each barrier of its l2 sum.
extern "C" __global__ void __launch_bounds__(1024, 2)
    qb_qsgd_encode_vec(const float *x, int64_t n, int64_t bucket, int64_t buckets, int32_t bits,
                       int32_t layout, int32_t norm, uint32_t key_hash, uint32_t offset,
                       int32_t log2_lanes, uint8_t *levels, float *scales) {
  extern __shared__ float smem[];
  qb_qsgd_encode_one_pass(x, n, bucket, buckets, bits, layout, norm, key_hash, offset, log2_lanes,
                          levels, scales, smem);
}

// The values of a group's codes w: code k times step (split as qb_qsgd_pack joins them).
template <int LAYOUT>
__device__ __forceinline__ void qb_qsgd_unpack(QsgdWords w, int32_t bits, int32_t top, float step,
                                               float (&v)[8]) {
  const uint64_t h1 = bits == 16 ? w.hi : w.lo >> (4 * bits);
  const uint32_t pair[4] = {(uint32_t)w.lo, (uint32_t)(w.lo >> (2 * bits)), (uint32_t)h1,
                            (uint32_t)(h1 >> (2 * bits))};
  const uint32_t mask = (1u << bits) - 1u;
#pragma unroll
  for (int k = 0; k < 8; k++) {
    const int32_t code = (int32_t)((pair[k >> 1] >> ((k & 1) * bits)) & mask);
    v[k] = qb_qsgd_value(code, step, top, LAYOUT);
  }
}

// levels + scales -> out (accumulate: out += values), one thread per group of 8 (grid-stride):
// one load of the group's `bits` bytes. A warp's 32 whole groups leave through shared memory
// (dynamic: 8 floats per thread), so each float4 store of the warp writes 512 contiguous bytes:
// a thread's own 32 bytes as two float4 would leave every store instruction half of each 32-byte
// sector, twice the L2 write transactions (on an H200 that capped the decode at ~2.1 TB/s).
extern "C" __global__ void qb_qsgd_decode_vec(const uint8_t *levels, const float *scales, int64_t n,
                                              int64_t bucket, int32_t bits, int32_t layout,
                                              float *out, int32_t accumulate) {
  extern __shared__ float smem[];
  const int32_t top = qb_qsgd_top(bits, layout);
  const int64_t groups = (n + 7) / 8;
  const int lane = threadIdx.x & 31;
  float *tile = smem + 8 * (threadIdx.x - lane);  // the warp's 256 values
  for (int64_t g = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; g < groups;
       g += (int64_t)gridDim.x * blockDim.x) {
    const int64_t e0 = 8 * g, cnt = qb_min64(8, n - e0);
    const QsgdWords w = qb_qsgd_get(levels + g * bits, bits, (cnt * bits + 7) / 8);
    const float step = qb_qsgd_step(scales[e0 / bucket], top);
    float v[8];
    if (layout == QB_LAYOUT_SIGN) qb_qsgd_unpack<QB_LAYOUT_SIGN>(w, bits, top, step, v);
    else qb_qsgd_unpack<QB_LAYOUT_INTERVALS>(w, bits, top, step, v);
    const int64_t w0 = e0 - 8 * lane;  // the warp's first value: every lane takes this branch
    if (w0 + 256 > n) {                // or none: the last warp's groups, one by one
      for (int64_t k = 0; k < cnt; k++)
        out[e0 + k] = accumulate ? QB_FADD(out[e0 + k], v[k]) : v[k];
      continue;
    }
    qb_st_f4(tile + 8 * lane, make_float4(v[0], v[1], v[2], v[3]));
    qb_st_f4(tile + 8 * lane + 4, make_float4(v[4], v[5], v[6], v[7]));
    __syncwarp();
    for (int h = 0; h < 256; h += 128) {  // values h + 4 lane .. + 3: lane's 16 bytes
      float4 r = qb_ld_f4(tile + h + 4 * lane);
      if (accumulate) {
        const float4 o = qb_ld_f4(out + w0 + h + 4 * lane);
        r = make_float4(QB_FADD(o.x, r.x), QB_FADD(o.y, r.y), QB_FADD(o.z, r.z),
                        QB_FADD(o.w, r.w));
      }
      qb_st_f4(out + w0 + h + 4 * lane, r);
    }
    __syncwarp();  // the tile is written again in the next iteration
  }
}
