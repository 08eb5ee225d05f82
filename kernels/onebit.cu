// 1bitSGD with error feedback on the GPU. Loaded with CuPy (qbench/compress/kernels/cuda/); the
// per-element maths is kernels/qsgd_math.h, shared with the C loops, so signs, means and the
// residual are byte-identical to the torch reference (qbench/compress/onebit.py).
//
// Encode, buckets of a multiple of 8 values up to 256 and 16-byte aligned tensors:
// qb_onebit_encode_fused, one pass (each value read once, from registers after the bucket's
// sums). Other buckets or alignments: qb_onebit_means (one block per bucket: the two sums in the
// reference tree order and the count of negatives), then qb_onebit_signs (one thread per group
// of 8 values: one byte of signs, the 8 residuals). Both update the residual in place safely:
// each residual value is read and written by the same thread (in qb_onebit_signs, after the
// first kernel has finished).
//
// Decode: qb_onebit_decode_vec (buckets of a multiple of 8 values, an aligned output: 16-byte
// accesses), else qb_onebit_decode.
#include "qsgd_math.h"

// The value quantised: grad + residual with error feedback (no residual: + 0.0), else grad.
__device__ __forceinline__ float qb_onebit_v(const float *grad, const float *residual,
                                             int32_t ef, int64_t e) {
  if (!ef) return grad[e];
  return qb_onebit_input(grad[e], residual ? residual[e] : 0.0f);
}

struct OnebitLeaf {
  const float *grad, *residual;
  int32_t ef, negative;
  int64_t start, cnt;
  __device__ float operator()(int64_t i) const {
    if (i >= cnt) return 0.0f;
    const float v = qb_onebit_v(grad, residual, ef, start + i);
    return negative ? qb_onebit_neg_leaf(v) : qb_onebit_pos_leaf(v);
  }
};

// means[2b], means[2b+1] = avg+, avg- of bucket b; one block per bucket (grid-stride), blockDim.x
// a power of two >= 32, dynamic shared memory blockDim.x * 8 bytes.
extern "C" __global__ void qb_onebit_means(const float *grad, const float *residual, int32_t ef,
                                           int64_t n, int64_t bucket, float *means) {
  extern __shared__ int64_t smem64[];
  float *smem = (float *)smem64;
  const int64_t w = qb_tree_width(bucket);
  for (int64_t b = blockIdx.x; b * bucket < n; b += gridDim.x) {
    const int64_t start = b * bucket, cnt = qb_min64(bucket, n - start);
    int64_t nneg = 0;
    for (int64_t i = threadIdx.x; i < cnt; i += blockDim.x)
      nneg += qb_onebit_v(grad, residual, ef, start + i) < 0.0f;
    nneg = qb_block_sum_i64(nneg, smem64);
    const OnebitLeaf pos = {grad, residual, ef, 0, start, cnt};
    const OnebitLeaf neg = {grad, residual, ef, 1, start, cnt};
    const float sum_pos = qb_block_tree_sum(pos, w, smem);
    const float sum_neg = qb_block_tree_sum(neg, w, smem);
    if (threadIdx.x == 0) {
      means[2 * b] = qb_onebit_mean(sum_pos, cnt - nneg);
      means[2 * b + 1] = qb_onebit_mean(sum_neg, nneg);
    }
  }
}

// One byte of signs (bit set = negative) and, with error feedback, the residuals of its 8
// values; one thread per group of 8 (grid-stride). residual_out may equal residual_in.
extern "C" __global__ void qb_onebit_signs(const float *grad, const float *residual_in,
                                           float *residual_out, int32_t ef, const float *means,
                                           int64_t n, int64_t bucket, uint8_t *signs) {
  const int64_t groups = (n + 7) / 8;
  for (int64_t g = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; g < groups;
       g += (int64_t)gridDim.x * blockDim.x) {
    const int64_t e0 = 8 * g, end = qb_min64(e0 + 8, n);
    int64_t b = e0 / bucket, next = (b + 1) * bucket;
    uint32_t byte = 0;
    for (int64_t e = e0; e < end; e++) {
      if (e == next) {
        next += bucket;
        b++;
      }
      const float v = qb_onebit_v(grad, residual_in, ef, e);
      byte |= (uint32_t)(v < 0.0f) << (e - e0);
      if (ef) residual_out[e] = qb_onebit_residual(v, means[2 * b], means[2 * b + 1]);
    }
    signs[g] = (uint8_t)byte;
  }
}

// signs + means -> out (accumulate: out += values), one thread per group of 8 (grid-stride).
extern "C" __global__ void qb_onebit_decode(const uint8_t *signs, const float *means, int64_t n,
                                            int64_t bucket, float *out, int32_t accumulate) {
  const int64_t groups = (n + 7) / 8;
  for (int64_t g = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; g < groups;
       g += (int64_t)gridDim.x * blockDim.x) {
    const int64_t e0 = 8 * g, end = qb_min64(e0 + 8, n);
    const uint32_t byte = signs[g];
    int64_t b = e0 / bucket, next = (b + 1) * bucket;
    for (int64_t e = e0; e < end; e++) {
      if (e == next) {
        next += bucket;
        b++;
      }
      const float v = qb_onebit_value((byte >> (e - e0)) & 1u, means[2 * b], means[2 * b + 1]);
      out[e] = accumulate ? QB_FADD(out[e], v) : v;
    }
  }
}

// -- one pass: a thread holds a group of 8 consecutive values -------------------------------------
#define QB_ONEBIT_FULL 0xffffffffu

// p[e0 .. e0 + 8) into v, +0.0 at e >= lim: two 16-byte loads for a whole group (p 16-byte
// aligned, e0 a multiple of 8), else one by one (a tensor's last, partial group; nothing for
// lanes past the values).
__device__ __forceinline__ void qb_onebit_get8(const float *p, int64_t e0, int64_t lim,
                                               float v[8]) {
  if (e0 + 8 <= lim) {
    const float4 a = qb_ld_f4(p + e0), b = qb_ld_f4(p + e0 + 4);
    v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
    return;
  }
  for (int k = 0; k < 8; k++) v[k] = e0 + k < lim ? p[e0 + k] : 0.0f;
}

// v into p[e0 .. min(e0 + 8, lim)), as qb_onebit_get8 reads.
__device__ __forceinline__ void qb_onebit_put8(float *p, int64_t e0, int64_t lim,
                                               const float v[8]) {
  if (e0 + 8 <= lim) {
    qb_st_f4(p + e0, make_float4(v[0], v[1], v[2], v[3]));
    qb_st_f4(p + e0 + 4, make_float4(v[4], v[5], v[6], v[7]));
    return;
  }
  for (int k = 0; k < 8; k++)  // k, not e - e0, indexes v: constant indices keep v in registers
    if (e0 + k < lim) p[e0 + k] = v[k];
}

// Encode in one pass, for buckets of a multiple of 8 values whose tree width w is at most 256
// (the launcher checks; grad and the residuals 16-byte aligned). A bucket is T = w / 8 lanes of
// one warp (a power of two, aligned in the warp), lane t holding values 8t .. 8t + 7 of the
// bucket (lanes past bucket / 8 hold the tree's +0.0 padding), so a warp holds 32 / T whole
// buckets; warps take them grid-stride, the whole warp in each iteration (the shuffles name all
// 32 lanes). Each value is read once, into registers; the count of negatives and both sums are
// shuffled within the bucket's lanes, then the sign byte and the residuals come from the
// registers. residual_out may equal residual_in: a thread reads its 8 residuals before it
// writes them, and no other thread touches them. Blocks of 256 threads (the launch bounds; the
// launcher's _GROUP_THREADS), as qb_onebit_decode_vec.
//
// The sums keep the reference tree order (qsgd_math.h: pad to w, then leaf[i] += leaf[i + h]
// for h = w/2, ..., 1). A level h >= 8 pairs leaf 8t + k with leaf 8(t + h/8) + k: slot k of
// lanes t and t + d, d = h/8. So the levels h = w/2 ... 8 are 8 trees over the T lanes, one per
// slot, run as xor shuffles with d = T/2 ... 1: lane t < d adds lane t + d's value to its own
// (leaf[i] + leaf[i + h], the reference's operands in its order). Lane 0 of the bucket then
// holds in slot k the partial sum of the leaves k (mod 8), and the last levels h = 4, 2, 1 add
// its slots k and k + h inside the thread. Every other lane of the bucket gets the same bits: at
// each level it adds the same two partial sums, at most in the other order, and a float sum
// does not depend on the order of its two operands (a NaN is the GPU's one canonical NaN).
extern "C" __global__ void __launch_bounds__(256, 4)  // <= 64 registers: 32 warps per SM
    qb_onebit_encode_fused(const float *grad, const float *residual_in, float *residual_out,
                           int32_t ef, int64_t n, int64_t bucket, float *means, uint8_t *signs) {
  const int T = (int)(qb_tree_width(bucket) / 8), lane = threadIdx.x & 31, t = lane & (T - 1);
  const int64_t buckets = (n + bucket - 1) / bucket, per_warp = 32 / T;
  const int64_t warp = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
  const int64_t stride = ((int64_t)gridDim.x * blockDim.x >> 5) * per_warp;
  for (int64_t first = warp * per_warp; first < buckets; first += stride) {  // warp-uniform
    const int64_t b = first + lane / T, start = b * bucket, e0 = start + 8 * t;
    const int64_t lim = b < buckets ? qb_min64(start + bucket, n) : start;  // end of b's values
    float v[8], r[8], pos[8], neg[8];
    for (int k = 0; k < 8; k++) r[k] = 0.0f;
    qb_onebit_get8(grad, e0, lim, v);
    if (ef && residual_in) qb_onebit_get8(residual_in, e0, lim, r);
    uint32_t byte = 0;
    for (int k = 0; k < 8; k++) {
      v[k] = ef ? qb_onebit_input(v[k], r[k]) : v[k];
      byte |= (uint32_t)(v[k] < 0.0f) << k;
      pos[k] = qb_onebit_pos_leaf(v[k]);
      neg[k] = qb_onebit_neg_leaf(v[k]);
    }
    int32_t nneg = __popc(byte);
    for (int d = T >> 1; d > 0; d >>= 1) {
      nneg += __shfl_xor_sync(QB_ONEBIT_FULL, nneg, d);
      for (int k = 0; k < 8; k++) {
        pos[k] = QB_FADD(pos[k], __shfl_xor_sync(QB_ONEBIT_FULL, pos[k], d));
        neg[k] = QB_FADD(neg[k], __shfl_xor_sync(QB_ONEBIT_FULL, neg[k], d));
      }
    }
    for (int h = 4; h > 0; h >>= 1)
      for (int k = 0; k < h; k++) {
        pos[k] = QB_FADD(pos[k], pos[k + h]);
        neg[k] = QB_FADD(neg[k], neg[k + h]);
      }
    const float avg_pos = qb_onebit_mean(pos[0], lim - start - nneg);
    const float avg_neg = qb_onebit_mean(neg[0], nneg);
    if (t == 0 && b < buckets) {
      means[2 * b] = avg_pos;
      means[2 * b + 1] = avg_neg;
    }
    if (e0 < lim) signs[e0 >> 3] = (uint8_t)byte;
    for (int k = 0; k < 8; k++) r[k] = qb_onebit_residual(v[k], avg_pos, avg_neg);
    if (ef) qb_onebit_put8(residual_out, e0, lim, r);
  }
}

// The bucket of value e: a 32-bit division where both fit (a 64-bit one is a long subroutine on
// the GPU).
__device__ __forceinline__ int64_t qb_onebit_bucket_of(int64_t e, int64_t bucket) {
  return (e | bucket) >> 32 ? e / bucket : (int64_t)((uint32_t)e / (uint32_t)bucket);
}

// v[k] = p[e0 + k] + v[k], read as qb_onebit_get8 reads (the decode's accumulate).
__device__ __forceinline__ void qb_onebit_add8(const float *p, int64_t e0, int64_t lim,
                                               float v[8]) {
  float o[8];
  qb_onebit_get8(p, e0, lim, o);
  for (int k = 0; k < 8; k++) v[k] = QB_FADD(o[k], v[k]);
}

// qb_onebit_decode for buckets of a multiple of 8 values (a group lies in one bucket) with
// 16-byte accesses to out (16-byte aligned; the launcher checks both): one thread per group of 8
// (grid-stride), one byte of signs, 8 values written (accumulate: read, added, written).
extern "C" __global__ void __launch_bounds__(256, 8)  // <= 32 registers: 64 warps per SM
    qb_onebit_decode_vec(const uint8_t *signs, const float *means, int64_t n, int64_t bucket,
                         float *out, int32_t accumulate) {
  const int64_t groups = (n + 7) / 8;
  for (int64_t g = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; g < groups;
       g += (int64_t)gridDim.x * blockDim.x) {
    const int64_t e0 = 8 * g, b = qb_onebit_bucket_of(e0, bucket);
    const uint32_t byte = signs[g];
    const float avg_pos = means[2 * b], avg_neg = means[2 * b + 1];
    float v[8];
    for (int k = 0; k < 8; k++) v[k] = qb_onebit_value((byte >> k) & 1u, avg_pos, avg_neg);
    if (accumulate) qb_onebit_add8(out, e0, n, v);
    qb_onebit_put8(out, e0, n, v);
  }
}
