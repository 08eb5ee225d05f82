// Per-element maths of QSGD and 1bitSGD, shared by the C loops (kernels/cpu/qbench_cpu.c) and
// the CUDA kernels (kernels/*.cu), so both agree with each other by construction. Each function
// is the float32 operation sequence of the torch reference (qbench/compress/qsgd.py, onebit.py)
// written out one rounding at a time: the payloads must be byte-identical to the reference.
//
// Exactness rules, which every caller relies on:
// - one IEEE single-precision rounding per operation and never a fused multiply-add: on the
//   device the QB_F* intrinsics say so; C must be compiled with -ffp-contract=off (native/
//   does) and without -ffast-math;
// - x / s is a true division: torch divides, and x * (1/s) can differ in the last bit;
// - clamp-then-floor in float equals clamp-then-truncate (see qb_round_level), and truncation
//   vectorises without SSE4.1 rounding;
// - stochastic rounding is exact: floor(t) + [u < t - floor(t)], never floor(t + u), whose float32
//   sum t + u rounds away the low bits of u once t is large (at 16 bits t reaches 65535, where
//   the spacing of float32 is 2^-8, and the rounding is biased by a few thousandths of a level).
#pragma once
#include "qbench_rng.h"

#if defined(__CUDA_ARCH__)
#define QB_FADD(a, b) __fadd_rn((a), (b))
#define QB_FSUB(a, b) __fsub_rn((a), (b))
#define QB_FMUL(a, b) __fmul_rn((a), (b))
#define QB_FDIV(a, b) __fdiv_rn((a), (b))
#define QB_FSQRT(a) __fsqrt_rn(a)
#define QB_F2I_RZ(a) __float2int_rz(a)
#else
#define QB_FADD(a, b) ((a) + (b))
#define QB_FSUB(a, b) ((a) - (b))
#define QB_FMUL(a, b) ((a) * (b))
#define QB_FDIV(a, b) ((a) / (b))
#define QB_FSQRT(a) sqrtf(a)
#define QB_F2I_RZ(a) ((int32_t)(a))
#endif

// Level layouts and bucket norms, numbered as native/ and cuda/ pass them.
#define QB_LAYOUT_INTERVALS 0
#define QB_LAYOUT_SIGN 1
#define QB_NORM_MAX 0
#define QB_NORM_L2 1

// Highest magnitude level: 2^bits - 1 levels endpoints (intervals) or 2^(bits-1) - 1 (sign).
QB_HD int32_t qb_qsgd_top(int32_t bits, int32_t layout) {
  const uint32_t levels = layout == QB_LAYOUT_SIGN ? 1u << (bits - 1) : 1u << bits;
  return (int32_t)(levels - 1u);
}

// The divisor of a bucket: its scale, or 1 for an all-zero bucket (torch.where(s > 0, s, 1)).
QB_HD float qb_qsgd_divisor(float scale) { return scale > 0.0f ? scale : 1.0f; }

// True when every code of the bucket is 0 whatever the values: intervals with scale 0.
QB_HD int qb_qsgd_zero_bucket(float scale, int32_t layout) {
  return layout == QB_LAYOUT_INTERVALS && !(scale > 0.0f);
}

// The level of v (position in level units) with an unbiased up-draw: v clamped to [0, top] in
// float first, then low = floor(v) (truncation, since v >= 0) and low + 1 with probability
// v - low, i.e. when u < v - low. v - low is exact (v and low are within a factor of two, or low
// is 0), so the probability is the fraction itself, to the 2^-24 grid of u; v = top gives
// fraction 0, so the level never exceeds top. v < 0 and NaN give 0 (torch's NaN -> int cast packs
// to code 0 too), v > top gives top, also for v beyond the int32 range, which the host's cast
// leaves undefined. The upper clamp is needed: with an l2 scale of values near the float32
// underflow (x * x subnormal), |x| / s can exceed 1 by ~22%.
QB_HD int32_t qb_round_level(float v, int32_t top, float u) {
  const float top_f = (float)top;
  v = v >= 0.0f ? v : 0.0f;
  v = v <= top_f ? v : top_f;
  const int32_t low = QB_F2I_RZ(v);
  return low + (u < QB_FSUB(v, (float)low) ? 1 : 0);
}

// intervals: t = (x / s + 1) * (top / 2); level = clamp(t, 0, top) rounded up with probability
// of its fraction.
QB_HD int32_t qb_qsgd_level_intervals(float x, float s_div, float half_top, int32_t top, float u) {
  float ratio = QB_FDIV(x, s_div);
  float t = QB_FMUL(QB_FADD(ratio, 1.0f), half_top);
  return qb_round_level(t, top, u);
}

// sign: level = |x / s| * top rounded the same way, with the sign (x / s < 0) in bit top+1.
QB_HD int32_t qb_qsgd_level_sign(float x, float s_div, float top_f, int32_t top, float u) {
  float ratio = QB_FDIV(x, s_div);
  float a = ratio < 0.0f ? -ratio : ratio;  // fabsf, spelled so it vectorises everywhere
  int32_t level = qb_round_level(QB_FMUL(a, top_f), top, u);
  return level | (ratio < 0.0f ? top + 1 : 0);
}

// One code from a value, its bucket's divisor, the layout's top level and a uniform draw u.
// Callers skip qb_qsgd_zero_bucket buckets (all codes 0).
QB_HD int32_t qb_qsgd_level(float x, float s_div, int32_t top, float u, int32_t layout) {
  if (layout == QB_LAYOUT_SIGN) return qb_qsgd_level_sign(x, s_div, (float)top, top, u);
  return qb_qsgd_level_intervals(x, s_div, (float)top * 0.5f, top, u);
}

// Spacing of the levels of a bucket: scale / top (torch: s / top, a true division).
QB_HD float qb_qsgd_step(float scale, int32_t top) { return QB_FDIV(scale, (float)top); }

// intervals: code k decodes to (2k - top) * step, exact negatives for k and top - k.
QB_HD float qb_qsgd_value_intervals(int32_t code, float step, int32_t top) {
  return QB_FMUL((float)(2 * code - top), step);
}

// sign: magnitude (k & top) * step, negated (also a zero) when the sign bit is set.
QB_HD float qb_qsgd_value_sign(int32_t code, float step, int32_t top) {
  float magnitude = QB_FMUL((float)(code & top), step);
  return code > top ? -magnitude : magnitude;
}

QB_HD float qb_qsgd_value(int32_t code, float step, int32_t top, int32_t layout) {
  if (layout == QB_LAYOUT_SIGN) return qb_qsgd_value_sign(code, step, top);
  return qb_qsgd_value_intervals(code, step, top);
}

// -- 1bitSGD ------------------------------------------------------------------------------------
// The value quantised: grad + residual with error feedback (a missing residual is +0.0, which
// turns -0.0 into +0.0 exactly as torch's grad + zeros does), else grad itself.
QB_HD float qb_onebit_input(float grad, float residual) { return QB_FADD(grad, residual); }

// Leaves of the two per-bucket sums: avg+ sums the values >= 0, avg- the values < 0; every other
// slot holds +0.0 (torch.where(neg, v, 0.0) and torch.where(neg, 0.0, v)).
QB_HD float qb_onebit_pos_leaf(float v) { return v < 0.0f ? 0.0f : v; }
// On the device NVVM compiles `v < 0 ? v : 0` to min.f32 (even when written as a mask of the
// bits), and the GPU's min(-0, +0) is -0 where torch writes +0: seen on an H100 for a bucket
// holding only -0.0 (docs/results/gpu.md). Adding +0.0 fixes it exactly: a selected v is
// negative and unchanged by it, and -0 + +0 = +0 when rounding to nearest. The C loops need no
// add: x86's minps returns its second operand (+0) when -0 < +0 is false.
QB_HD float qb_onebit_neg_leaf(float v) {
#if defined(__CUDA_ARCH__)
  return QB_FADD(v < 0.0f ? v : 0.0f, 0.0f);
#else
  return v < 0.0f ? v : 0.0f;
#endif
}

// Mean of count values summing to sum; 0 values give sum / 1 (torch: sum / count.clamp(min=1)).
QB_HD float qb_onebit_mean(float sum, int64_t count) {
  return QB_FDIV(sum, (float)(count > 0 ? count : 1));
}

// What a value decodes to: the mean of its sign.
QB_HD float qb_onebit_value(int negative, float avg_pos, float avg_neg) {
  return negative ? avg_neg : avg_pos;
}

// The error carried to the next step: v minus what was sent for it.
QB_HD float qb_onebit_residual(float v, float avg_pos, float avg_neg) {
  return QB_FSUB(v, qb_onebit_value(v < 0.0f, avg_pos, avg_neg));
}

// -- sums -----------------------------------------------------------------------------------------
// Bucket sums (the l2 norm's sum of squares, 1bitSGD's sums) use one fixed order, so that torch,
// C and CUDA round identically: pad the bucket with +0.0 to w = the next power of two, then
// for h = w/2, w/4, ..., 1: leaf[i] += leaf[i + h] for i < h; the sum is leaf[0]
// (qbench/compress/_buckets.py: tree_sum). It is also the classic shared-memory GPU reduction.
QB_HD int64_t qb_tree_width(int64_t n) {
  int64_t w = 1;
  while (w < n) w <<= 1;
  return w;
}

#if defined(__CUDACC__)
// -- device only: block-wide reductions -----------------------------------------------------------
// blockDim.x is a power of two (<= 1024) and smem holds blockDim.x 32-bit words. Every thread
// of the block calls these (they synchronise) and gets the result.

QB_HD int64_t qb_min64(int64_t a, int64_t b) { return a < b ? a : b; }

// -- vector accesses: 16 / 8 / 4 bytes in one instruction. The pointer must be aligned to the
// access (the caller checks the base pointer's alignment once, on the host, and takes a scalar
// path otherwise); under the emulator QB_ALIGNED stops on a misaligned one, as the GPU faults.
#ifndef QB_ALIGNED
#define QB_ALIGNED(p, n) ((void)0)
#endif
__device__ __forceinline__ float4 qb_ld_f4(const float *p) {
  QB_ALIGNED(p, 16);
  return *(const float4 *)p;
}
__device__ __forceinline__ void qb_st_f4(float *p, float4 v) {
  QB_ALIGNED(p, 16);
  *(float4 *)p = v;
}
__device__ __forceinline__ void qb_st_u32(uint8_t *p, uint32_t v) {
  QB_ALIGNED(p, 4);
  *(uint32_t *)p = v;
}
__device__ __forceinline__ void qb_st_u64(uint8_t *p, uint64_t v) {
  QB_ALIGNED(p, 8);
  *(uint64_t *)p = v;
}
__device__ __forceinline__ uint32_t qb_ld_u32(const uint8_t *p) {
  QB_ALIGNED(p, 4);
  return *(const uint32_t *)p;
}
__device__ __forceinline__ uint64_t qb_ld_u64(const uint8_t *p) {
  QB_ALIGNED(p, 8);
  return *(const uint64_t *)p;
}

// Max of one uint32 per thread (any order is exact).
__device__ __forceinline__ uint32_t qb_block_max_u32(uint32_t v, uint32_t *smem) {
  for (int d = 16; d > 0; d >>= 1) {
    uint32_t o = __shfl_xor_sync(0xffffffffu, v, d);
    v = o > v ? o : v;
  }
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = (blockDim.x + 31) >> 5;
  if (lane == 0) smem[warp] = v;
  __syncthreads();
  v = 0;
  for (int i = 0; i < nwarps; i++) v = smem[i] > v ? smem[i] : v;
  __syncthreads();  // smem is reused by the caller
  return v;
}

// Sum of one int64 per thread (any order is exact). smem holds blockDim.x int64.
__device__ __forceinline__ int64_t qb_block_sum_i64(int64_t v, int64_t *smem) {
  smem[threadIdx.x] = v;
  __syncthreads();
  for (unsigned h = blockDim.x >> 1; h > 0; h >>= 1) {
    if (threadIdx.x < h) smem[threadIdx.x] += smem[threadIdx.x + h];
    __syncthreads();
  }
  v = smem[0];
  __syncthreads();
  return v;
}

// The levels h >= T of the tree over w = m * T leaves, for the leaves j, j + T, ..., j + (m-1)T of
// thread j: at those levels leaf j + kT meets j + (k + m/2)T first, then ..., i.e. the same tree
// over k in [0, m). Walked leaf by leaf in the tree's left-to-right order (k = bit-reversed
// position) with a stack of partial sums, so it needs no array of m values.
template <class Leaf>
__device__ float qb_strided_tree(const Leaf &leaf, int64_t j, int64_t T, int64_t m) {
  float stack[64];
  int depth = 0, log2m = 0;
  while ((int64_t)1 << log2m < m) log2m++;
  for (int64_t r = 0; r < m; r++) {
    const int64_t k = (int64_t)(__brevll((unsigned long long)r) >> (64 - log2m));
    float s = leaf(j + k * T);
    for (int64_t c = r + 1; (c & 1) == 0; c >>= 1) s = QB_FADD(stack[--depth], s);
    stack[depth++] = s;
  }
  return stack[0];
}

// The sum of leaf(0), ..., leaf(w - 1) (w a power of two) in the reference tree order.
template <class Leaf>
__device__ float qb_block_tree_sum(const Leaf &leaf, int64_t w, float *smem) {
  const int64_t T = blockDim.x, j = threadIdx.x;
  int64_t h;
  if (w <= T) {
    smem[j] = j < w ? leaf(j) : 0.0f;
    h = w >> 1;
  } else {
    smem[j] = qb_strided_tree(leaf, j, T, w / T);
    h = T >> 1;
  }
  __syncthreads();
  for (; h > 0; h >>= 1) {
    if (j < h) smem[j] = QB_FADD(smem[j], smem[j + h]);
    __syncthreads();
  }
  const float total = smem[0];
  __syncthreads();
  return total;
}
#endif  // __CUDACC__
