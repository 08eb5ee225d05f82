// 1bitSGD with error feedback on the GPU. Loaded with CuPy (qbench/compress/kernels/cuda/); the
// per-element maths is kernels/qsgd_math.h, shared with the C loops, so signs, means and the
// residual are byte-identical to the torch reference (qbench/compress/onebit.py).
//
// Encode: qb_onebit_means (one block per bucket: the two sums in the reference tree order and
// the count of negatives), then qb_onebit_signs (one thread per group of 8 values: one byte of
// signs, the 8 residuals). The residual may be updated in place: the second kernel reads each
// residual value in the thread that overwrites it, after the first kernel has finished.
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
