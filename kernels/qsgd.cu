// QSGD on the GPU: quantise + pack, unpack + dequantise (+ accumulate). Loaded with CuPy
// (qbench/compress/kernels/cuda/); `make kernels` compiles it with nvcc so errors show without
// a GPU. The per-element maths is kernels/qsgd_math.h, shared with the C loops: payloads are
// byte-identical to the torch reference (qbench/compress/qsgd.py).
//
// Wire layout: code i at bits [i*bits, (i+1)*bits) of a little-endian byte stream, so a group
// of 8 consecutive codes fills exactly `bits` bytes (16-bit codes: 16 bytes) and one thread
// owns one group: no two threads write the same byte.
//
// Encode, bucket_size % 8 == 0 (groups never straddle buckets): qb_qsgd_encode_fused, one
// block per bucket, reads the bucket once for its scale and again (from cache) for the codes.
// Other bucket sizes: qb_qsgd_scales (block per bucket) then qb_qsgd_quantize (thread per group).
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
