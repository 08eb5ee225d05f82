// FP8 / MX / NVFP4 on the GPU: block-scaled low-precision floats. Loaded with CuPy
// (qbench/compress/kernels/cuda/); the per-element maths is kernels/lowfloat_math.h, shared
// with the C loops, so codes, scales, residuals and decoded floats are byte-identical to the
// torch reference (qbench/compress/lowfloat.py: blockscale.py, minifloat.py).
//
// Encode, the fast path (cuda/ takes it when grad, the residuals and the codes are 16-byte
// aligned and a block is 8, 16, ..., 256 values, or one block holds the whole tensor):
//   qb_lf_amax        NVFP4 and FP8 with one scale per tensor only: the largest |v| of the
//                     tensor (v = grad, or grad + residual) into words[1], one pass; every scale
//                     depends on it, so it must end before any is computed;
//   qb_lf_encode_vec  one pass: a thread holds the 8 consecutive values of one group (16-byte
//                     loads of grad and residual), a block of 8 << shift values is 1 << shift
//                     lanes of one warp whose max is a shuffle away; each lane then quantises
//                     its values from its registers and writes its `bits` bytes of codes (one
//                     or two wide stores), its residuals and, on the block's first lane, the
//                     scale. words[0] = 1 when grad holds a NaN or an inf.
// The general path (any alignment, any block), four launches:
//   qb_lf_maxes     one thread per run of QB_LF_RUN values: each block's max |v| as the bits of
//                   a non-negative float, with atomicMax (exact in any order) into
//                   maxes[block]; words[0] = 1 when grad holds a NaN or an inf;
//   qb_lf_top       NVFP4 only: the largest block max into words[1] (its tensor scale);
//   qb_lf_scales    one thread per block: its wire scale (and NVFP4's tensor scale);
//   qb_lf_quantize  one thread per group of 8 values, which fill exactly `bits` bytes of the
//                   packed codes (no two threads write the same byte): codes and residuals.
// Either way the new residual goes to a buffer of its own (never over the old one), and cuda/
// reads words[0] once, after the last launch: on a NaN or inf it drops every output and the
// caller keeps its residual, as the reference refuses such a gradient.
// Decode: qb_lf_decode_vec (one thread per group of 8: one wide load of its codes, 16-byte
// stores; with a 16-byte aligned out and blocks of 8 << shift values, or one block), else
// qb_lf_decode (any alignment or block); both also accumulate.
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

// A block's scale from its max |v| (bits): what is sent (FP8: the float32's bits; MX, NVFP4:
// the E8M0 / E4M3 code), what its decoded values are multiplied by (divisor) and what its values
// are divided by (d; MX: multiplied by, the exact reciprocal: qb_lf_d).
struct LowfloatScale {
  uint32_t wire;
  float divisor, d;
};

__device__ __forceinline__ LowfloatScale qb_lf_scale(int32_t kind, const qb_lf_format &f,
                                                     uint32_t amax, float tensor) {
  LowfloatScale s;
  const float x = qb_lf_float(amax);
  if (kind == QB_LF_FP8) {
    s.divisor = qb_lf_fp8_divisor(QB_FDIV(x, f.max));
    s.wire = qb_lf_bits(s.divisor);
  } else if (kind == QB_LF_MX) {
    s.wire = qb_lf_e8m0(x, f.emax);
    s.divisor = qb_lf_mx_divisor(s.wire);
  } else {
    s.wire = qb_lf_nvfp4_scale(x, tensor);
    s.divisor = qb_lf_nvfp4_divisor(s.wire, tensor);
  }
  const float safe = qb_lf_safe(s.divisor);
  s.d = kind == QB_LF_MX ? qb_lf_mx_reciprocal(safe) : safe;
  return s;
}

// Block b's scale, as its wire type.
__device__ __forceinline__ void qb_lf_put_scale(void *scales, int32_t kind, int64_t b,
                                                uint32_t wire) {
  if (kind == QB_LF_FP8) ((uint32_t *)scales)[b] = wire;  // the float32's bits
  else ((uint8_t *)scales)[b] = (uint8_t)wire;
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
    qb_lf_put_scale(scales, kind, b, qb_lf_scale(kind, f, (uint32_t)maxes[b], tensor).wire);
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

// -- the fast path: one pass, 16-byte accesses (see the top of this file) ---------------------
// 2-byte accesses for 6-bit codes, whose groups of 6 bytes are 4-byte aligned every other group.
__device__ __forceinline__ void qb_lf_st_u16(uint8_t *p, uint16_t v) {
  QB_ALIGNED(p, 2);
  *(uint16_t *)p = v;
}
__device__ __forceinline__ uint32_t qb_lf_ld_u16(const uint8_t *p) {
  QB_ALIGNED(p, 2);
  return *(const uint16_t *)p;
}

// The 8 floats of the group at e0 of p: two 16-byte loads, or one at a time (0.0 from n on) in
// the last group when n is not a multiple of 8, and in groups past the end.
__device__ __forceinline__ void qb_lf_load8(const float *p, int64_t e0, int64_t n, float v[8]) {
  if (e0 + 8 <= n) {
    const float4 a = qb_ld_f4(p + e0), b = qb_ld_f4(p + e0 + 4);
    v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w;
    v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
  } else {
    for (int i = 0; i < 8; i++) v[i] = e0 + i < n ? p[e0 + i] : 0.0f;
  }
}

// p[e0 .. e0 + 8) = v, the values below n only.
__device__ __forceinline__ void qb_lf_store8(float *p, int64_t e0, int64_t n, const float v[8]) {
  if (e0 + 8 <= n) {
    qb_st_f4(p + e0, make_float4(v[0], v[1], v[2], v[3]));
    qb_st_f4(p + e0 + 4, make_float4(v[4], v[5], v[6], v[7]));
  } else {
    for (int i = 0; e0 + i < n; i++) p[e0 + i] = v[i];
  }
}

// max(m, the bits of max |v[i]|): a NaN above every number, as in qb_lf_maxes.
__device__ __forceinline__ uint32_t qb_lf_max8(const float v[8], uint32_t m) {
  for (int i = 0; i < 8; i++) {
    const uint32_t x = qb_lf_abs_bits(v[i]);
    m = x > m ? x : m;
  }
  return m;
}

// The values v = grad (+ residual) of the group at e0 (+0.0 from n on: code 0, and no larger
// block max); returns the bits of max |grad| there: 0x7f800000 or more when one is a NaN or
// an inf (the exponent bits all ones).
__device__ __forceinline__ uint32_t qb_lf_values(const float *grad, const float *residual,
                                                 int64_t e0, int64_t n, float v[8]) {
  qb_lf_load8(grad, e0, n, v);
  const uint32_t top = qb_lf_max8(v, 0);
  if (residual) {
    float r[8];
    qb_lf_load8(residual, e0, n, r);
    for (int i = 0; i < 8; i++) v[i] = QB_FADD(v[i], r[i]);
  }
  return top;
}

// What every group of an encode shares beside its format and scale.
struct LowfloatCoding {
  int32_t kind, stochastic, feedback;  // feedback: the residuals are wanted
  uint32_t key_hash, offset;
};

// The codes of the group at e0 (code i at bit i * bits) on scale s; with c.feedback, v becomes
// the residual v - decoded v. Draws of the elements e0 + i, as qb_lf_quantize's. The kind,
// rounding and feedback branch once per group, not per value.
__device__ __forceinline__ uint64_t qb_lf_codes8(float v[8], const qb_lf_format f,
                                                 const LowfloatScale &s, const LowfloatCoding &c,
                                                 int64_t e0) {
  float x[8], u[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
  if (c.kind == QB_LF_MX) {
    for (int i = 0; i < 8; i++) x[i] = QB_FMUL(v[i], s.d);
  } else {
    for (int i = 0; i < 8; i++) x[i] = QB_FDIV(v[i], s.d);
  }
  if (c.stochastic) {
    for (int i = 0; i < 8; i++) u[i] = qb_uniform32(c.key_hash, c.offset + (uint32_t)e0 + i);
  }
  uint32_t code[8];
  uint64_t word = 0;
  for (int i = 0; i < 8; i++) {
    code[i] = qb_lf_encode(x[i], f, c.stochastic, u[i]);
    word |= (uint64_t)code[i] << (i * f.bits);
  }
  if (c.feedback) {
    for (int i = 0; i < 8; i++) v[i] = QB_FSUB(v[i], QB_FMUL(qb_lf_value(code[i], f), s.divisor));
  }
  return word;
}

// qb_lf_codes8 with the element format a constant in each case, which the compiler folds into
// the element maths: read at run time, it costs about half as many integer instructions again
// per value, and integer instructions (half the rate of float ones) bound these kernels.
__device__ __forceinline__ uint64_t qb_lf_codes8_of(int32_t element, float v[8],
                                                    const LowfloatScale &s,
                                                    const LowfloatCoding &c, int64_t e0) {
  switch (element) {
    case QB_LF_E4M3: return qb_lf_codes8(v, qb_lf_format_of(QB_LF_E4M3), s, c, e0);
    case QB_LF_E5M2: return qb_lf_codes8(v, qb_lf_format_of(QB_LF_E5M2), s, c, e0);
    case QB_LF_E3M2: return qb_lf_codes8(v, qb_lf_format_of(QB_LF_E3M2), s, c, e0);
    case QB_LF_E2M3: return qb_lf_codes8(v, qb_lf_format_of(QB_LF_E2M3), s, c, e0);
    default: return qb_lf_codes8(v, qb_lf_format_of(QB_LF_E2M1), s, c, e0);
  }
}

// v = the decoded values of a group's codes (word) on divisor, or v + them (accumulate).
__device__ __forceinline__ void qb_lf_decode8(uint64_t word, const qb_lf_format f, float divisor,
                                              int32_t accumulate, float v[8]) {
  const uint32_t mask = (1u << f.bits) - 1u;
  float x[8];
  for (int i = 0; i < 8; i++) {
    x[i] = QB_FMUL(qb_lf_value((uint32_t)(word >> (i * f.bits)) & mask, f), divisor);
  }
  if (accumulate) {
    for (int i = 0; i < 8; i++) v[i] = QB_FADD(v[i], x[i]);
  } else {
    for (int i = 0; i < 8; i++) v[i] = x[i];
  }
}

// qb_lf_decode8 with the element format a constant in each case (see qb_lf_codes8_of).
__device__ __forceinline__ void qb_lf_decode8_of(int32_t element, uint64_t word, float d,
                                                 int32_t add, float v[8]) {
  switch (element) {
    case QB_LF_E4M3: return qb_lf_decode8(word, qb_lf_format_of(QB_LF_E4M3), d, add, v);
    case QB_LF_E5M2: return qb_lf_decode8(word, qb_lf_format_of(QB_LF_E5M2), d, add, v);
    case QB_LF_E3M2: return qb_lf_decode8(word, qb_lf_format_of(QB_LF_E3M2), d, add, v);
    case QB_LF_E2M3: return qb_lf_decode8(word, qb_lf_format_of(QB_LF_E2M3), d, add, v);
    default: return qb_lf_decode8(word, qb_lf_format_of(QB_LF_E2M1), d, add, v);
  }
}

// The codes of group g, `bits` bytes at codes + g * bits (no two groups share a byte), in one
// or two stores: 6 bytes are 4 + 2 in an even group (at 12k), 2 + 4 in an odd one (at 12k + 6).
// The last group of n values may hold cnt < 8: its bytes one at a time.
__device__ __forceinline__ void qb_lf_store_codes(uint8_t *codes, int64_t g, int32_t bits,
                                                  uint64_t word, int64_t cnt) {
  uint8_t *p = codes + g * bits;
  if (cnt < 8) {
    for (int64_t i = 0; i < (cnt * bits + 7) / 8; i++) p[i] = (uint8_t)(word >> (8 * i));
  } else if (bits == 8) {
    qb_st_u64(p, word);
  } else if (bits == 4) {
    qb_st_u32(p, (uint32_t)word);
  } else if (g & 1) {
    qb_lf_st_u16(p, (uint16_t)word);
    qb_st_u32(p + 2, (uint32_t)(word >> 16));
  } else {
    qb_st_u32(p, (uint32_t)word);
    qb_lf_st_u16(p + 4, (uint16_t)(word >> 32));
  }
}

// The codes of group g as qb_lf_store_codes wrote them.
__device__ __forceinline__ uint64_t qb_lf_load_codes(const uint8_t *codes, int64_t g,
                                                     int32_t bits, int64_t cnt) {
  const uint8_t *p = codes + g * bits;
  uint64_t word = 0;
  if (cnt < 8) {
    for (int64_t i = 0; i < (cnt * bits + 7) / 8; i++) word |= (uint64_t)p[i] << (8 * i);
  } else if (bits == 8) {
    word = qb_ld_u64(p);
  } else if (bits == 4) {
    word = qb_ld_u32(p);
  } else if (g & 1) {
    word = qb_lf_ld_u16(p) | (uint64_t)qb_ld_u32(p + 2) << 16;
  } else {
    word = qb_ld_u32(p) | (uint64_t)qb_lf_ld_u16(p + 4) << 32;
  }
  return word;
}

// words[1] = max(words[1], the largest |v| of the n values, as bits), v = grad (+ residual):
// NVFP4's tensor scale and FP8's one scale per tensor. Groups of 8 as qb_lf_encode_vec reads
// them, each block of threads a run of consecutive groups, so that the memory is read roughly
// in address order: what it read last is the likeliest to be in L2 still when
// qb_lf_encode_vec, which walks the groups from the last, reads it again. Dynamic shared
// memory: one int32 per warp.
extern "C" __global__ void qb_lf_amax(const float *grad, const float *residual, int64_t n,
                                      int32_t *words) {
  extern __shared__ uint32_t smem_amax[];
  const int64_t groups = (n + 7) / 8, run = (groups + gridDim.x - 1) / gridDim.x;
  const int64_t end = qb_min64(groups, (blockIdx.x + 1) * run);
  uint32_t m = 0;
  for (int64_t g = blockIdx.x * run + threadIdx.x; g < end; g += blockDim.x) {
    float v[8];
    qb_lf_values(grad, residual, 8 * g, n, v);
    m = qb_lf_max8(v, m);
  }
  m = qb_block_max_u32(m, smem_amax);
  if (threadIdx.x == 0) atomicMax(words + 1, (int32_t)m);
}

// One pass over grad (+ residual_in; NULL before the first residual): codes, scales, NVFP4's
// tensor scale and, with residual_out (else NULL), the new residual; words[0] = 1 when grad
// holds a NaN or an inf. A block is 8 << shift values (shift 0..5: 1 << shift lanes of a warp,
// a warp's 32 groups starting at a multiple of 256 values), or with shift < 0 one block holds
// every value and its max is words[1] (qb_lf_amax), as is NVFP4's tensor max. The grid-stride
// loop steps a whole warp at once, over runs of 32 groups from the last (see qb_lf_amax): lanes
// past the last group take part in the shuffles (with max 0) and write nothing. blockDim.x: a
// multiple of 32, at most 256.
extern "C" __global__ void __launch_bounds__(256, 4)  // <= 64 registers: 32 warps per SM
    qb_lf_encode_vec(const float *grad, const float *residual_in, float *residual_out, int64_t n,
                     int32_t kind, int32_t element, int32_t shift, int32_t stochastic,
                     uint32_t key_hash, uint32_t offset, int32_t *words, void *scales,
                     float *tensor_scale, uint8_t *codes) {
  const qb_lf_format f = qb_lf_format_of(element);
  const float tensor = kind == QB_LF_NVFP4 ? qb_lf_nvfp4_tensor(qb_lf_float(words[1])) : 1.0f;
  const LowfloatCoding c = {kind, stochastic, residual_out != 0, key_hash, offset};
  const int32_t lanes = shift < 0 ? 1 : 1 << shift;
  const int64_t runs = (n + 255) / 256, lane = threadIdx.x & 31;
  for (int64_t w = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) / 32; w < runs;
       w += (int64_t)gridDim.x * blockDim.x / 32) {
    const int64_t g = 32 * (runs - 1 - w) + lane, e0 = 8 * g;
    float v[8];
    if (qb_lf_values(grad, residual_in, e0, n, v) >= 0x7f800000u) atomicMax(words, 1);
    uint32_t m = shift < 0 ? (uint32_t)words[1] : qb_lf_max8(v, 0);
    for (int d = lanes >> 1; d > 0; d >>= 1) {  // the block's lanes: any order is exact
      const uint32_t o = __shfl_xor_sync(0xffffffffu, m, d);
      m = o > m ? o : m;
    }
    if (e0 >= n) continue;
    const LowfloatScale s = qb_lf_scale(kind, f, m, tensor);
    if (shift < 0 ? g == 0 : (g & (lanes - 1)) == 0)  // the block's first lane
      qb_lf_put_scale(scales, kind, shift < 0 ? 0 : g >> shift, s.wire);
    if (kind == QB_LF_NVFP4 && g == 0) tensor_scale[0] = tensor;
    const uint64_t word = qb_lf_codes8_of(element, v, s, c, e0);
    qb_lf_store_codes(codes, g, f.bits, word, qb_min64(8, n - e0));
    if (residual_out) qb_lf_store8(residual_out, e0, n, v);
  }
}

// qb_lf_decode with 16-byte stores (and loads of out to accumulate into) and one load of a
// group's codes (qb_lf_load_codes); a block is 8 << shift values, so each group lies in block
// g >> shift (one block for the whole tensor: a shift of 62 or more).
extern "C" __global__ void qb_lf_decode_vec(const uint8_t *codes, const void *scales,
                                            const float *tensor_scale, int64_t n, int32_t kind,
                                            int32_t element, int32_t shift, float *out,
                                            int32_t accumulate) {
  const LowfloatArgs a = qb_lf_args(n, 0, kind, element);
  const int64_t groups = (n + 7) / 8;
  for (int64_t g = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; g < groups;
       g += (int64_t)gridDim.x * blockDim.x) {
    const int64_t e0 = 8 * g;
    const uint64_t word = qb_lf_load_codes(codes, g, a.f.bits, qb_min64(8, n - e0));
    float v[8];
    if (accumulate) qb_lf_load8(out, e0, n, v);
    const float divisor = qb_lf_divisor(a, scales, tensor_scale, g >> shift);
    qb_lf_decode8_of(element, word, divisor, accumulate, v);
    qb_lf_store8(out, e0, n, v);
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
