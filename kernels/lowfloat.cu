// FP8 / MX / NVFP4 on the GPU: block-scaled low-precision floats. Loaded with CuPy
// (qbench/compress/kernels/cuda/); the per-element maths is kernels/lowfloat_math.h, shared
// with the C loops, so codes, scales, residuals and decoded floats are byte-identical to the
// torch reference (qbench/compress/lowfloat.py: blockscale.py, minifloat.py).
//
// Encode, four launches (cuda/ reads `words` between the first two, to refuse a NaN or inf
// gradient before anything is written):
//   qb_lf_maxes     one thread per run of QB_LF_RUN values: each block's max |v| (v = grad, or
//                   grad + residual) as the bits of a non-negative float, with atomicMax (exact
//                   in any order) into maxes[block]; words[0] = 1 when grad holds a NaN or inf;
//   qb_lf_top       NVFP4 only: the largest block max into words[1] (its tensor scale);
//   qb_lf_scales    one thread per block: its wire scale (and NVFP4's tensor scale);
//   qb_lf_quantize  one thread per group of 8 values, which fill exactly `bits` bytes of the
//                   packed codes (no two threads write the same byte): codes and residuals.
// The residual may be updated in place: each value's residual is read and written by one
// thread, after qb_lf_maxes has finished reading it.
// Decode: qb_lf_decode, one thread per group of 8 (+ accumulate).
#include "lowfloat_math.h"

#define QB_LF_RUN 64  // values per thread of qb_lf_maxes: fewer atomics on long blocks

struct LowfloatArgs {
  int64_t n, block;
  int32_t kind, element;
  qb_lf_format f;
};

__device__ LowfloatArgs qb_lf_args(int64_t n, int64_t block, int32_t kind, int32_t element) {
  LowfloatArgs a = {n, block, kind, element, qb_lf_format_of(element)};
  return a;
}

// The value encoded: grad + residual with a residual (error feedback after the first step).
__device__ __forceinline__ float qb_lf_v(const float *grad, const float *residual, int64_t e) {
  return residual ? QB_FADD(grad[e], residual[e]) : grad[e];
}

// What the values of a block with this divisor are divided by (MX: multiplied by, the exact
// reciprocal; see lowfloat_math.h).
__device__ __forceinline__ float qb_lf_d(const LowfloatArgs &a, float divisor) {
  const float safe = qb_lf_safe(divisor);
  return a.kind == QB_LF_MX ? qb_lf_mx_reciprocal(safe) : safe;
}

// Block b's divisor (what its decoded values are multiplied by), as Scaling.divisors.
__device__ float qb_lf_divisor(const LowfloatArgs &a, const void *scales, const float *tensor,
                               int64_t b) {
  if (a.kind == QB_LF_FP8) return qb_lf_fp8_divisor(((const float *)scales)[b]);
  if (a.kind == QB_LF_MX) return qb_lf_mx_divisor(((const uint8_t *)scales)[b]);
  return qb_lf_nvfp4_divisor(((const uint8_t *)scales)[b], tensor[0]);
}

// maxes: one zeroed int32 per block; words: two zeroed int32 (the NaN / inf flag, the top).
extern "C" __global__ void qb_lf_maxes(const float *grad, const float *residual, int64_t n,
                                       int64_t block, int32_t *maxes, int32_t *words) {
  const int64_t runs = (n + QB_LF_RUN - 1) / QB_LF_RUN;
  for (int64_t t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; t < runs;
       t += (int64_t)gridDim.x * blockDim.x) {
    const int64_t e0 = t * QB_LF_RUN, end = qb_min64(e0 + QB_LF_RUN, n);
    int64_t b = e0 / block, next = (b + 1) * block;
    uint32_t m = 0, bad = 0;
    for (int64_t e = e0; e < end; e++) {
      if (e == next) {  // the run reaches the next block: flush this one's max
        atomicMax(maxes + b, (int32_t)m);
        m = 0;
        next += block;
        b++;
      }
      bad |= (qb_lf_bits(grad[e]) & 0x7f800000u) == 0x7f800000u;
      const uint32_t x = qb_lf_abs_bits(qb_lf_v(grad, residual, e));
      m = x > m ? x : m;
    }
    atomicMax(maxes + b, (int32_t)m);
    if (bad) atomicMax(words, 1);
  }
}

// words[1] = the largest of maxes[0..nblocks); blockDim.x a power of two >= 32, dynamic shared
// memory blockDim.x int32.
extern "C" __global__ void qb_lf_top(const int32_t *maxes, int64_t nblocks, int32_t *words) {
  extern __shared__ uint32_t smem_top[];
  uint32_t m = 0;
  for (int64_t b = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; b < nblocks;
       b += (int64_t)gridDim.x * blockDim.x)
    m = (uint32_t)maxes[b] > m ? (uint32_t)maxes[b] : m;
  m = qb_block_max_u32(m, smem_top);
  if (threadIdx.x == 0) atomicMax(words + 1, (int32_t)m);
}

// The wire scale of every block from its max (NVFP4: and the tensor scale, from words[1]).
extern "C" __global__ void qb_lf_scales(const int32_t *maxes, int64_t nblocks, int32_t kind,
                                        int32_t element, const int32_t *words, void *scales,
                                        float *tensor_scale) {
  const qb_lf_format f = qb_lf_format_of(element);
  const float tensor = kind == QB_LF_NVFP4 ? qb_lf_nvfp4_tensor(qb_lf_float(words[1])) : 1.0f;
  for (int64_t b = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; b < nblocks;
       b += (int64_t)gridDim.x * blockDim.x) {
    const float amax = qb_lf_float((uint32_t)maxes[b]);
    if (kind == QB_LF_FP8) ((float *)scales)[b] = QB_FDIV(amax, f.max);
    else if (kind == QB_LF_MX) ((uint8_t *)scales)[b] = (uint8_t)qb_lf_e8m0(amax, f.emax);
    else ((uint8_t *)scales)[b] = (uint8_t)qb_lf_nvfp4_scale(amax, tensor);
    if (kind == QB_LF_NVFP4 && b == 0) tensor_scale[0] = tensor;
  }
}

// Codes of every group of 8 values (and with error feedback residual_out = v - decoded v);
// residual_in: NULL before the first residual; residual_out may be residual_in.
extern "C" __global__ void qb_lf_quantize(const float *grad, const float *residual_in,
                                          float *residual_out, int32_t error_feedback, int64_t n,
                                          int32_t kind, int32_t element, int64_t block,
                                          int32_t stochastic, uint32_t key_hash, uint32_t offset,
                                          const void *scales, const float *tensor_scale,
                                          uint8_t *codes) {
  const LowfloatArgs a = qb_lf_args(n, block, kind, element);
  const int64_t groups = (n + 7) / 8;
  for (int64_t g = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; g < groups;
       g += (int64_t)gridDim.x * blockDim.x) {
    const int64_t e0 = 8 * g, end = qb_min64(e0 + 8, n);
    int64_t b = e0 / block, next = (b + 1) * block;
    float divisor = qb_lf_divisor(a, scales, tensor_scale, b), d = qb_lf_d(a, divisor);
    uint64_t word = 0;
    for (int64_t e = e0; e < end; e++) {
      if (e == next) {  // the group reaches the next block (block sizes not a multiple of 8)
        next += block;
        divisor = qb_lf_divisor(a, scales, tensor_scale, ++b);
        d = qb_lf_d(a, divisor);
      }
      const float v = qb_lf_v(grad, residual_in, e);
      const float x = kind == QB_LF_MX ? QB_FMUL(v, d) : QB_FDIV(v, d);
      const float u = stochastic ? qb_uniform32(key_hash, offset + (uint32_t)e) : 0.0f;
      const uint32_t code = qb_lf_encode(x, a.f, stochastic, u);
      if (error_feedback)
        residual_out[e] = QB_FSUB(v, QB_FMUL(qb_lf_value(code, a.f), divisor));
      word |= (uint64_t)code << ((e - e0) * a.f.bits);
    }
    const int64_t nbytes = ((end - e0) * a.f.bits + 7) / 8;  // `bits`, except in the last group
    for (int64_t i = 0; i < nbytes; i++) codes[g * a.f.bits + i] = (uint8_t)(word >> (8 * i));
  }
}

// codes + scales (+ NVFP4's tensor_scale) -> out (accumulate: out += values), one thread per
// group of 8 (grid-stride).
extern "C" __global__ void qb_lf_decode(const uint8_t *codes, const void *scales,
                                        const float *tensor_scale, int64_t n, int32_t kind,
                                        int32_t element, int64_t block, float *out,
                                        int32_t accumulate) {
  const LowfloatArgs a = qb_lf_args(n, block, kind, element);
  const uint32_t mask = (1u << a.f.bits) - 1u;
  const int64_t groups = (n + 7) / 8;
  for (int64_t g = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; g < groups;
       g += (int64_t)gridDim.x * blockDim.x) {
    const int64_t e0 = 8 * g, end = qb_min64(e0 + 8, n);
    const int64_t nbytes = ((end - e0) * a.f.bits + 7) / 8;
    uint64_t word = 0;
    for (int64_t i = 0; i < nbytes; i++) word |= (uint64_t)codes[g * a.f.bits + i] << (8 * i);
    int64_t b = e0 / block, next = (b + 1) * block;
    float divisor = qb_lf_divisor(a, scales, tensor_scale, b);
    for (int64_t e = e0; e < end; e++) {
      if (e == next) {
        next += block;
        divisor = qb_lf_divisor(a, scales, tensor_scale, ++b);
      }
      const uint32_t code = (uint32_t)(word >> ((e - e0) * a.f.bits)) & mask;
      const float v = QB_FMUL(qb_lf_value(code, a.f), divisor);
      out[e] = accumulate ? QB_FADD(out[e], v) : v;
    }
  }
}

// -- the integer view (qbench/compress/integer_sum.py: FloatUnits; the C loops of
// qb_lf_units_encode / qb_lf_units_decode in qbench_cpu.c say what each end computes) ----------
// Integers of width 1, 2, 4 or 8 bytes (int8 ... int64), one thread per value (grid-stride).
__device__ void qb_lf_int_store(void *out, int32_t width, int64_t e, int32_t q) {
  if (width == 1) ((int8_t *)out)[e] = (int8_t)q;
  else if (width == 2) ((int16_t *)out)[e] = (int16_t)q;
  else if (width == 4) ((int32_t *)out)[e] = q;
  else ((int64_t *)out)[e] = q;
}

__device__ int64_t qb_lf_int_load(const void *sums, int32_t width, int64_t e) {
  if (width == 1) return ((const int8_t *)sums)[e];
  if (width == 2) return ((const int16_t *)sums)[e];
  if (width == 4) return ((const int32_t *)sums)[e];
  return ((const int64_t *)sums)[e];
}

// The divisors of nblocks blocks from the ranks' MAX of each block's max |x|; words[1]: the
// largest of them (qb_lf_top), read for NVFP4's tensor scale.
extern "C" __global__ void qb_lf_units_divisors(const float *amax, int64_t nblocks, int32_t kind,
                                                int32_t element, const int32_t *words,
                                                float *divisors) {
  const qb_lf_format f = qb_lf_format_of(element);
  const float tensor = kind == QB_LF_NVFP4 ? qb_lf_nvfp4_tensor(qb_lf_float(words[1])) : 1.0f;
  for (int64_t b = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; b < nblocks;
       b += (int64_t)gridDim.x * blockDim.x)
    divisors[b] = qb_lf_block_divisor(kind, f, amax[b], tensor);
}

// x[0..n) on the block divisors ceil(n / block) -> their units at out.
extern "C" __global__ void qb_lf_units_encode(const float *x, const float *divisors, int64_t n,
                                              int32_t element, int64_t block, int32_t stochastic,
                                              uint32_t key_hash, uint32_t offset, void *out,
                                              int32_t width) {
  const qb_lf_format f = qb_lf_format_of(element);
  for (int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; e < n;
       e += (int64_t)gridDim.x * blockDim.x) {
    const float v = QB_FDIV(x[e], qb_lf_safe(divisors[e / block]));
    const float u = stochastic ? qb_uniform32(key_hash, offset + (uint32_t)e) : 0.0f;
    qb_lf_int_store(out, width, e, qb_lf_units(qb_lf_encode(v, f, stochastic, u), f));
  }
}

// The sums of `world` ranks' units of n values on the block divisors -> their float32 means.
extern "C" __global__ void qb_lf_units_decode(const void *sums, int32_t width,
                                              const float *divisors, int64_t n, int32_t element,
                                              int64_t block, int32_t world, float *out) {
  const qb_lf_format f = qb_lf_format_of(element);
  for (int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; e < n;
       e += (int64_t)gridDim.x * blockDim.x) {
    const double per_unit = qb_lf_unit_mean(divisors[e / block], f, world);
    out[e] = qb_lf_units_mean(qb_lf_int_load(sums, width, e), per_unit);
  }
}
