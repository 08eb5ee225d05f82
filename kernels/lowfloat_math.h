// Per-element maths of the scaled low-precision float codecs (FP8 with fp32 scales, OCP MX,
// NVFP4), shared by the C loops (kernels/cpu/qbench_cpu.c) and the CUDA kernels
// (kernels/lowfloat.cu). The reference is torch: qbench/compress/blockscale.py (scales, float32
// operations one at a time) and qbench/compress/minifloat.py (Format.encode: exact rounding on
// the table of a format's values; Format.decode). Codes, scales, residuals and decoded floats
// must be byte-identical to it.
//
// Element rounding, on the float32 bits, equal to Format.encode for every float32 x:
// - c = min(|x|, largest finite value) (inf saturates; NaN is patched at the end);
// - e = max(floor(log2 c), emin), emin = 1 - bias: in the binade of e (and below the smallest
//   normal, where the subnormals share emin's step) the format's values are the multiples of
//   2^(e - man), and t = c * 2^(man - e) is exact (a power-of-two scaling of a float32 that
//   stays normal), so k = floor(t) and frac = t - k are exact too;
// - the code of k * 2^(e - man) is ((e - emin) << man) + k, in every binade and for the
//   subnormals (their exponent field is 0, the first normal's is 1); k + 1 may reach the next
//   binade, whose first code that is; c <= max keeps every code finite;
// - nearest: up when frac > 1/2, or frac = 1/2 and k odd (the reference's "even code": the codes
//   of a binade are consecutive and man >= 1, so the parity of the code is that of k);
//   stochastic: up when the draw u < frac (the reference compares in float64: the same, exact);
// - NaN becomes the format's NaN code (its largest finite code where it has none), without the
//   sign; every other x gets the sign bit of x, -0.0 included (x < 0 or x is -0.0).
#pragma once
#include "qsgd_math.h"  // QB_F* (one rounding per operation), QB_F2I_RZ, QB_HD, fixed-width ints

// Codec kinds and element formats, numbered as qbench/compress/kernel_abi.py passes them.
#define QB_LF_FP8 0
#define QB_LF_MX 1
#define QB_LF_NVFP4 2
#define QB_LF_E4M3 0
#define QB_LF_E5M2 1
#define QB_LF_E3M2 2
#define QB_LF_E2M3 3
#define QB_LF_E2M1 4

#define QB_LF_NONE 0  // every code is a finite number (FP6, FP4)
#define QB_LF_NAN 1   // only S.1111.111 is NaN (E4M3)
#define QB_LF_IEEE 2  // exponent all ones: inf (mantissa 0) or NaN (E5M2)

#define QB_LF_QNAN 0x7fc00000u  // the NaN torch writes for float64 NaN -> float32 (math.nan)
#define QB_LF_E8M0_NAN 255u
#define QB_LF_NVFP4_RANGE 2688.0f  // 448 x 6: the largest E4M3 block scale x the largest E2M1

#if defined(__CUDA_ARCH__)
QB_HD uint32_t qb_lf_bits(float x) { return __float_as_uint(x); }
QB_HD float qb_lf_float(uint32_t b) { return __uint_as_float(b); }
#else
QB_HD uint32_t qb_lf_bits(float x) {
  union {
    float f;
    uint32_t u;
  } v;
  v.f = x;
  return v.u;
}
QB_HD float qb_lf_float(uint32_t b) {
  union {
    float f;
    uint32_t u;
  } v;
  v.u = b;
  return v.f;
}
#endif

typedef struct {
  int32_t bits, man, emin, emax;  // code width; mantissa bits; exponents of the smallest and
                                  // largest normal values
  float max;                      // the largest finite value
  int32_t max_code, nan_code;     // codes of max and of NaN (max_code where there is no NaN)
  int32_t specials;               // QB_LF_NONE, QB_LF_NAN or QB_LF_IEEE
} qb_lf_format;

QB_HD qb_lf_format qb_lf_format_of(int32_t element) {
  qb_lf_format f;
  switch (element) {
    case QB_LF_E4M3: f.bits = 8; f.man = 3; f.emin = -6; f.emax = 8; f.max = 448.0f;
      f.max_code = 0x7e; f.nan_code = 0x7f; f.specials = QB_LF_NAN; break;
    case QB_LF_E5M2: f.bits = 8; f.man = 2; f.emin = -14; f.emax = 15; f.max = 57344.0f;
      f.max_code = 0x7b; f.nan_code = 0x7d; f.specials = QB_LF_IEEE; break;
    case QB_LF_E3M2: f.bits = 6; f.man = 2; f.emin = -2; f.emax = 4; f.max = 28.0f;
      f.max_code = 0x1f; f.nan_code = 0x1f; f.specials = QB_LF_NONE; break;
    case QB_LF_E2M3: f.bits = 6; f.man = 3; f.emin = 0; f.emax = 2; f.max = 7.5f;
      f.max_code = 0x1f; f.nan_code = 0x1f; f.specials = QB_LF_NONE; break;
    default: f.bits = 4; f.man = 1; f.emin = 0; f.emax = 2; f.max = 6.0f;  // E2M1
      f.max_code = 0x7; f.nan_code = 0x7; f.specials = QB_LF_NONE; break;
  }
  return f;
}

// The code of x (sign bit at bit bits - 1): nearest, ties to even, or with stochastic set up
// with probability frac (u: the element's draw in [0, 1)). See the top of this file.
QB_HD uint32_t qb_lf_encode(float x, const qb_lf_format f, int32_t stochastic, float u) {
  const uint32_t b = qb_lf_bits(x), ab = b & 0x7fffffffu, max = qb_lf_bits(f.max);
  // min(|x|, max) on the bits, which order as the floats do: inf and NaN (patched below) too
  const uint32_t c = ab < max ? ab : max;
  int32_t e = (int32_t)(c >> 23) - 127;
  e = e > f.emin ? e : f.emin;  // c <= max keeps e <= emax
  const float t = QB_FMUL(qb_lf_float(c), qb_lf_float((uint32_t)(f.man - e + 127) << 23));
  const int32_t k = QB_F2I_RZ(t);
  const float frac = QB_FSUB(t, (float)k);
  // (bitwise, not || and &&: no branches, so that the C loops vectorise)
  const int32_t tie_up = ((int32_t)(frac == 0.5f) & k) & 1;
  const int32_t up = stochastic ? (int32_t)(u < frac) : ((int32_t)(frac > 0.5f) | tie_up);
  const int32_t code = ((e - f.emin) << f.man) + k + up;
  // NaN: the NaN code, no sign; as masks rather than a select, which GCC turns into a branch
  const int32_t nan = -(int32_t)(ab > 0x7f800000u);
  const int32_t sign = (int32_t)(b >> 31) << (f.bits - 1);
  return (uint32_t)(((code | sign) & ~nan) | (f.nan_code & nan));
}

// The float32 value of a code (Format.decode: NaN is 0x7fc00000, negated by its sign bit as
// torch negates the float64 value before the conversion).
QB_HD float qb_lf_value(uint32_t code, const qb_lf_format f) {
  const uint32_t sign_bit = 1u << (f.bits - 1), mag = code & (sign_bit - 1u);
  const uint32_t e = mag >> f.man, m = mag & ((1u << f.man) - 1u);
  const int32_t sig = (int32_t)(e ? (1u << f.man) | m : m);
  const int32_t exponent = f.emin - f.man + (e ? (int32_t)e - 1 : 0);  // >= -16: normal
  const float v = QB_FMUL((float)sig, qb_lf_float((uint32_t)(exponent + 127) << 23));  // exact
  // the specials and the sign on the bits, as masks (no branches: the C loops vectorise)
  const uint32_t top = (e == (1u << (f.bits - 1 - f.man)) - 1u) & (f.specials == QB_LF_IEEE);
  const uint32_t nan = ((mag == sign_bit - 1u) & (f.specials == QB_LF_NAN)) | (top & (m != 0u));
  const uint32_t inf = top & (m == 0u);
  const uint32_t special = -(nan | inf);
  const uint32_t bits = (qb_lf_bits(v) & ~special) | ((nan ? QB_LF_QNAN : 0x7f800000u) & special);
  return qb_lf_float(bits | ((code & sign_bit) ? 0x80000000u : 0u));  // -v, as torch negates
}

// -- block scales (float32, one operation at a time, as blockscale.Scaling.scales) --------------
// max |x| of a block as the max of the sign-cleared bit patterns: the float order, a NaN above
// every number (torch.amax propagates it), and an integer max.
QB_HD uint32_t qb_lf_abs_bits(float x) { return qb_lf_bits(x) & 0x7fffffffu; }

// The E8M0 code of an MX block (minifloat.mx_scale_exponent): floor(log2 amax) - emax + 127 in
// 0..254; 0 for amax 0, 255 for NaN or inf. floor(log2) of a normal float32 is its exponent
// field - 127; a subnormal amax (below 2^-126) gives a code below -126 - emax + 127 < 0 (every
// element format has emax >= 1), so 0, as does the field 0 read the same way.
QB_HD uint32_t qb_lf_e8m0(float amax, int32_t emax) {
  const uint32_t ab = qb_lf_abs_bits(amax);
  if (ab >= 0x7f800000u) return QB_LF_E8M0_NAN;
  const int32_t code = (int32_t)(ab >> 23) - 127 - emax + 127;
  return (uint32_t)(code < 0 ? 0 : (code > 254 ? 254 : code));
}

// The float32 value of an E8M0 code: 2^(code - 127) (code 0: the subnormal 2^-127), NaN for 255.
QB_HD float qb_lf_e8m0_value(uint32_t code) {
  if (code == QB_LF_E8M0_NAN) return qb_lf_float(QB_LF_QNAN);
  return qb_lf_float(code ? code << 23 : 0x00400000u);
}

// NVFP4's tensor scale from the largest block max: max / 2688, at least 2^-126 (the smallest
// normal float32; below it a max under ~1.9e-42 gave 0, and every block of zeros 0 / 0, the
// E4M3 NaN scale: issue 44; blockscale.Scaling.scales says why this floor), 1 when max is 0 or
// NaN. The floor is a comparison: exact, so the three implementations stay byte-identical.
QB_HD float qb_lf_nvfp4_tensor(float top) {
  const float exact = QB_FDIV(top, QB_LF_NVFP4_RANGE), least = qb_lf_float(0x00800000u);
  return top > 0.0f ? (exact < least ? least : exact) : 1.0f;
}

// NVFP4's E4M3 block scale: (amax / 6) / tensor, rounded to E4M3 nearest-even (saturating).
QB_HD uint32_t qb_lf_nvfp4_scale(float amax, float tensor) {
  const float target = QB_FDIV(QB_FDIV(amax, 6.0f), tensor);
  return qb_lf_encode(target, qb_lf_format_of(QB_LF_E4M3), 0, 0.0f);
}

// What the values of a block are multiplied by on decode (Scaling.divisors): the fp8 scale,
// the E8M0 value, or the E4M3 value times the tensor scale.
QB_HD float qb_lf_fp8_divisor(float scale) { return scale; }
QB_HD float qb_lf_mx_divisor(uint32_t code) { return qb_lf_e8m0_value(code); }
QB_HD float qb_lf_nvfp4_divisor(uint32_t code, float tensor) {
  return QB_FMUL(qb_lf_value(code, qb_lf_format_of(QB_LF_E4M3)), tensor);
}

// What the values of a block are divided by on encode: the divisor, or 1 when it is not > 0 (a
// block of zeros, a scale too small for its format, a NaN scale).
QB_HD float qb_lf_safe(float divisor) { return divisor > 0.0f ? divisor : 1.0f; }

// MX encodes x * (1 / safe) instead of x / safe: safe is 2^j (|j| <= 127) or 1, so 1 / safe is
// exact, and x * 2^-j rounds the same real number once, as the division does.
QB_HD float qb_lf_mx_reciprocal(float safe) { return QB_FDIV(1.0f, safe); }

// -- the integer view (qbench/compress/integer_sum.py: FloatUnits) --------------------------------
// Every value of an element format is an integer number of its smallest positive value
// 2^(emin - man): the integer allreduce sums those units on block divisors the ranks share.

// float64 operations, one rounding each (on the device as the QB_F* intrinsics are for float32).
#if defined(__CUDA_ARCH__)
#define QB_DMUL(a, b) __dmul_rn((a), (b))
#define QB_DDIV(a, b) __ddiv_rn((a), (b))
#else
#define QB_DMUL(a, b) ((a) * (b))
#define QB_DDIV(a, b) ((a) / (b))
#endif

// The signed units of a code: sig x 2^(e - 1) for a normal code (exponent field e >= 1), the
// mantissa m for a subnormal one (FloatUnits.units: the table / unit, rounded); 0 for NaN and
// inf (nan_to_num; E5M2, the one format with inf, has no integer view). Branch-free, as
// qb_lf_value, so that the C loops vectorise.
QB_HD int32_t qb_lf_units(uint32_t code, const qb_lf_format f) {
  const uint32_t sign_bit = 1u << (f.bits - 1), mag = code & (sign_bit - 1u);
  const uint32_t e = mag >> f.man, m = mag & ((1u << f.man) - 1u);
  const uint32_t sig = e ? (1u << f.man) | m : m;
  const uint32_t units = sig << (e ? e - 1u : 0u);  // < 2^31 for every format but E5M2
  const uint32_t top = (e == (1u << (f.bits - 1 - f.man)) - 1u) & (f.specials == QB_LF_IEEE);
  const uint32_t nan = (mag == sign_bit - 1u) & (f.specials == QB_LF_NAN);
  const int32_t kept = (int32_t)(units & ~(0u - (nan | top)));
  return (code & sign_bit) ? -kept : kept;
}

// A block's shared divisor from its max |x| (the ranks' MAX; non-negative): Scaling.divisors of
// Scaling.scales (FloatUnits.share), on the scale functions above; tensor: NVFP4's tensor scale.
QB_HD float qb_lf_block_divisor(int32_t kind, const qb_lf_format f, float amax, float tensor) {
  if (kind == QB_LF_FP8) return qb_lf_fp8_divisor(QB_FDIV(amax, f.max));
  if (kind == QB_LF_MX) return qb_lf_mx_divisor(qb_lf_e8m0(amax, f.emax));
  return qb_lf_nvfp4_divisor(qb_lf_nvfp4_scale(amax, tensor), tensor);
}

// What a block's sum of K ranks' units is multiplied by for their mean: divisor x unit / K, in
// float64 (FloatUnits.decode; the product is exact, unit being a power of two).
QB_HD double qb_lf_unit_mean(float divisor, const qb_lf_format f, int32_t world) {
  const double unit = (double)qb_lf_float((uint32_t)(f.emin - f.man + 127) << 23);
  return QB_DDIV(QB_DMUL((double)divisor, unit), (double)world);
}

// The float32 mean of a sum of units: one float64 product, then the rounding to float32.
QB_HD float qb_lf_units_mean(int64_t sum, double per_unit) {
  return (float)QB_DMUL((double)sum, per_unit);
}
