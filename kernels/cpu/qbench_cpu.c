// Fused CPU loops of the QSGD and 1bitSGD compressors: C99, one thread per call (native/ cuts
// large tensors into ranges and calls these on several threads at once), raw pointers,
// loaded with ctypes by qbench/compress/kernels/native/, which builds it as
//   cc -O3 -funroll-loops -march=native -std=c99 -ffp-contract=off -fno-math-errno -fPIC -shared
// Payloads are byte-identical to the torch reference (qbench/compress/qsgd.py, onebit.py): the
// per-element maths is kernels/qsgd_math.h, shared with the CUDA kernels.
//
// Shape of an encode: one bucket at a time (its values stay in L1): the scale, then the codes
// of up to QB_CHUNK values into a small stack buffer, then the bit packing of that buffer. Every
// inner loop is branch-free over plain arrays so that the compiler vectorises it, the counter
// hash included. A decode unpacks QB_CHUNK codes at a time and scales them bucket by bucket.
//
// Every exported function returns 0, or QB_EINVAL for arguments it cannot take (the Python side
// checks them first, so that is a bug) or QB_ENOMEM.
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "qsgd_math.h"

// AVX-512 (-march=native on a CPU that has it): hand-written 16-lane loops for the QSGD codes
// and the 1bitSGD encode, where the compiler's vectorisation of the plain loops spends about a
// third more instructions (compare + blend clamps, the draw turned into a float, a serial bucket
// sum). Elsewhere the 8-lane AVX2 loops or the plain loops run; all give the same bytes
// (tests/compress/kernels/test_native_portable.py builds the library without -march=native and
// compares).
#if defined(__AVX512F__)
#include <immintrin.h>
#define QB_AVX512 1
#else
#define QB_AVX512 0
#endif
// AVX2 without AVX-512 (AMD Zen 2 and 3, older Intel): the same two loops on 8 lanes, for the
// same reasons (tests/compress/kernels/test_native_portable.py builds this variant too and
// compares).
#if !QB_AVX512 && defined(__AVX2__)
#include <immintrin.h>
#define QB_AVX2 1
#else
#define QB_AVX2 0
#endif
// Large decodes write with non-temporal stores (SSE2: every x86-64 CPU), see stream_floats.
#if defined(__SSE2__)
#include <emmintrin.h>
#define QB_STREAM 1
#else
#define QB_STREAM 0
#endif

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "qbench_cpu.c stores 16-bit codes and packed words in host byte order: little-endian only"
#endif

#define QB_ABI_VERSION 3
#define QB_EINVAL 1
#define QB_ENOMEM 2
#define QB_CHUNK 2048         // codes per stack buffer; a multiple of 8 (one packing group)
#define QB_STACK_FLOATS 4096  // scratch floats kept on the stack; more come from the heap
// Values (8 KiB) a QSGD encode prefetches ahead of its bucket: measured faster with the 8-lane
// loops (Zen 3); the 16-lane loops were measured slower with a prefetch, so they have none.
#define QB_PREFETCH (QB_AVX512 ? 0 : 2048)

#define QB_EXPORT __attribute__((visibility("default")))
#define QB_INLINE static inline __attribute__((always_inline))

static int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

// -- bit packing: value i at bits [i*b, (i+1)*b) of a little-endian byte stream --------------
// Groups of 8 codes fill exactly `bits` bytes, so a stream cut at multiples of 8 codes stays
// byte-aligned; the packer below buffers up to 7 codes to keep it so across buckets.

QB_INLINE void pack_words(const uint8_t *restrict c, int64_t ngroups, uint8_t *restrict out,
                          const int bits) {
  for (int64_t g = 0; g < ngroups; g++) {
    uint64_t w = 0;
    for (int k = 0; k < 8; k++) w |= (uint64_t)c[8 * g + k] << (k * bits);
    memcpy(out + g * bits, &w, (size_t)bits);
  }
}

// Pack ngroups groups of 8 codes (each already < 2^bits) into ngroups * bits bytes.
static void pack_groups(const uint8_t *restrict c, int64_t ngroups, int bits,
                        uint8_t *restrict out) {
  switch (bits) {
    case 1:  // the multiply gathers bit 0 of byte k into bit 56 + k, without carries
      for (int64_t j = 0; j < ngroups; j++) {
        uint64_t w;
        memcpy(&w, c + 8 * j, sizeof w);
        out[j] = (uint8_t)((w * 0x0102040810204080ull) >> 56);
      }
      break;
    case 2:
      for (int64_t j = 0; j < 2 * ngroups; j++)
        out[j] = (uint8_t)(c[4 * j] | c[4 * j + 1] << 2 | c[4 * j + 2] << 4 | c[4 * j + 3] << 6);
      break;
    case 4:
      for (int64_t j = 0; j < 4 * ngroups; j++) out[j] = (uint8_t)(c[2 * j] | c[2 * j + 1] << 4);
      break;
    case 8:
      memcpy(out, c, (size_t)(8 * ngroups));
      break;
    case 3: pack_words(c, ngroups, out, 3); break;
    case 5: pack_words(c, ngroups, out, 5); break;
    case 6: pack_words(c, ngroups, out, 6); break;
    default: pack_words(c, ngroups, out, 7); break;
  }
}

QB_INLINE void unpack_words(const uint8_t *restrict in, int64_t ngroups, uint8_t *restrict c,
                            const int bits) {
  const uint64_t mask = (1u << bits) - 1u;
  for (int64_t g = 0; g < ngroups; g++) {
    uint64_t w = 0;
    memcpy(&w, in + g * bits, (size_t)bits);
    for (int k = 0; k < 8; k++) c[8 * g + k] = (uint8_t)((w >> (k * bits)) & mask);
  }
}

// Inverse of pack_groups.
static void unpack_groups(const uint8_t *restrict in, int64_t ngroups, int bits,
                          uint8_t *restrict c) {
  switch (bits) {
    case 1:  // bit k of the byte to byte k: spread, isolate, then carry each bit to bit 7
      for (int64_t j = 0; j < ngroups; j++) {
        uint64_t w = (in[j] * 0x0101010101010101ull) & 0x8040201008040201ull;
        w = ((w + 0x7f7f7f7f7f7f7f7full) >> 7) & 0x0101010101010101ull;
        memcpy(c + 8 * j, &w, sizeof w);
      }
      break;
    case 2:
      for (int64_t j = 0; j < 2 * ngroups; j++)
        for (int k = 0; k < 4; k++) c[4 * j + k] = (uint8_t)((in[j] >> (2 * k)) & 3u);
      break;
    case 4:
      for (int64_t j = 0; j < 4 * ngroups; j++) {
        c[2 * j] = in[j] & 15u;
        c[2 * j + 1] = in[j] >> 4;
      }
      break;
    case 8:
      memcpy(c, in, (size_t)(8 * ngroups));
      break;
    case 3: unpack_words(in, ngroups, c, 3); break;
    case 5: unpack_words(in, ngroups, c, 5); break;
    case 6: unpack_words(in, ngroups, c, 6); break;
    default: unpack_words(in, ngroups, c, 7); break;
  }
}

typedef struct {
  uint8_t *out;     // next byte of the stream
  int bits;
  int npend;        // codes waiting for a full group of 8
  uint8_t pend[8];
} qb_packer;

static void packer_put(qb_packer *p, const uint8_t *c, int64_t cnt) {
  if (p->npend) {
    while (p->npend < 8 && cnt) {
      p->pend[p->npend++] = *c++;
      cnt--;
    }
    if (p->npend < 8) return;
    pack_groups(p->pend, 1, p->bits, p->out);
    p->out += p->bits;
    p->npend = 0;
  }
  int64_t ngroups = cnt / 8;
  pack_groups(c, ngroups, p->bits, p->out);
  p->out += ngroups * p->bits;
  for (int64_t i = 8 * ngroups; i < cnt; i++) p->pend[p->npend++] = c[i];
}

// Writes the last, partial group: only the bytes holding its codes (ceil(n*bits/8) in all).
static void packer_finish(qb_packer *p) {
  if (!p->npend) return;
  uint8_t tmp[8];
  memset(p->pend + p->npend, 0, (size_t)(8 - p->npend));
  pack_groups(p->pend, 1, p->bits, tmp);
  memcpy(p->out, tmp, (size_t)((p->npend * p->bits + 7) / 8));
  p->npend = 0;
}

// Codes of values [c0, c0 + m) of a packed stream of n codes; c0 is a multiple of 8. Writes up
// to the next multiple of 8 codes into c (at most QB_CHUNK when m < QB_CHUNK).
static void unpack_range(const uint8_t *restrict packed, int bits, int64_t c0, int64_t m,
                         uint8_t *restrict c) {
  const uint8_t *in = packed + c0 / 8 * bits;
  int64_t full = m / 8, rem = m - 8 * full;
  unpack_groups(in, full, bits, c);
  if (rem) {  // the end of the stream: only ceil(rem * bits / 8) bytes exist
    uint8_t tmp[8] = {0};
    memcpy(tmp, in + full * bits, (size_t)((rem * bits + 7) / 8));
    unpack_groups(tmp, 1, bits, c + 8 * full);
  }
}

// -- bucket scales --------------------------------------------------------------------------------
// max |x| as the max of the sign-cleared bit patterns: the same order as the floats (a NaN stays
// a NaN, as with torch.amax) and an integer max that vectorises without -ffast-math.
static float absmax(const float *restrict x, int64_t cnt) {
  uint32_t m = 0;
  for (int64_t i = 0; i < cnt; i++) {
    uint32_t b;
    memcpy(&b, x + i, sizeof b);
    b &= 0x7fffffffu;
    m = b > m ? b : m;
  }
  float s;
  memcpy(&s, &m, sizeof s);
  return s;
}

// The fixed-order sum of qsgd_math.h over t[0..w), w a power of two; t is overwritten. The
// levels h >= 8 add blocks of 8 lanes (straight vector adds), the last three are written out.
static float tree_sum(float *t, int64_t w) {
  if (w < 8) {
    for (int64_t h = w >> 1; h > 0; h >>= 1)
      for (int64_t i = 0; i < h; i++) t[i] += t[i + h];
    return t[0];
  }
  for (int64_t h = w >> 1; h >= 8; h >>= 1)
    for (int64_t k = 0; k < h; k += 8)
      for (int l = 0; l < 8; l++) t[k + l] += t[h + k + l];
  const float a0 = t[0] + t[4], a1 = t[1] + t[5], a2 = t[2] + t[6], a3 = t[3] + t[7];
  return (a0 + a2) + (a1 + a3);
}

static float l2_norm(const float *restrict x, int64_t cnt, int64_t w, float *restrict t) {
  for (int64_t i = 0; i < cnt; i++) t[i] = x[i] * x[i];
  for (int64_t i = cnt; i < w; i++) t[i] = 0.0f;
  return sqrtf(tree_sum(t, w));
}

// -- streaming stores -----------------------------------------------------------------------------
// A decode of many values writes them with non-temporal stores: an ordinary store reads each line
// before writing it, so a 4-bit QSGD decode would move 8.5 bytes per value, not 4.5, and an output
// this large leaves the caches anyway. Accumulating decodes read out first and store normally.
#define QB_STREAM_MIN (1 << 20)  // values of one call (4 MiB of output)

static int streams(int64_t n, int32_t accumulate) {
  return QB_STREAM && !accumulate && n >= QB_STREAM_MIN;
}

#if QB_STREAM
// dst[0..m) = src[0..m), 16-byte streaming stores from dst's first 16-byte boundary on.
static void stream_floats(float *restrict dst, const float *restrict src, int64_t m) {
  int64_t i = 0;
  for (; i < m && ((uintptr_t)(dst + i) & 15u); i++) dst[i] = src[i];
  for (; i + 4 <= m; i += 4) _mm_stream_ps(dst + i, _mm_loadu_ps(src + i));
  for (; i < m; i++) dst[i] = src[i];
}

// Streaming stores are weakly ordered: this orders them before what the caller does next.
static void stream_fence(void) { _mm_sfence(); }
#else
static void stream_floats(float *restrict dst, const float *restrict src, int64_t m) {
  memcpy(dst, src, sizeof(float) * (size_t)m);
}

static void stream_fence(void) {}
#endif

// -- QSGD -----------------------------------------------------------------------------------------
// The two quantise loops; `layout` is a constant at every call, so each compiles branch-free.
QB_INLINE void quantize_u8(const float *restrict x, int m, float s_div, int32_t top, uint32_t kh,
                           uint32_t idx0, uint8_t *restrict lv, const int layout) {
  const float half_top = (float)top * 0.5f, top_f = (float)top;
  uint32_t counter = qb_counter(kh, idx0);
  for (int i = 0; i < m; i++, counter += QB_GOLDEN) {  // an addition, not idx * GOLDEN
    float u = qb_uniform_counter(counter);
    lv[i] = (uint8_t)(layout == QB_LAYOUT_SIGN
                          ? qb_qsgd_level_sign(x[i], s_div, top_f, top, u)
                          : qb_qsgd_level_intervals(x[i], s_div, half_top, top, u));
  }
}

QB_INLINE void quantize_u16(const float *restrict x, int m, float s_div, int32_t top,
                            uint32_t kh, uint32_t idx0, uint16_t *restrict lv, const int layout) {
  const float half_top = (float)top * 0.5f, top_f = (float)top;
  uint32_t counter = qb_counter(kh, idx0);
  for (int i = 0; i < m; i++, counter += QB_GOLDEN) {
    float u = qb_uniform_counter(counter);
    lv[i] = (uint16_t)(layout == QB_LAYOUT_SIGN
                           ? qb_qsgd_level_sign(x[i], s_div, top_f, top, u)
                           : qb_qsgd_level_intervals(x[i], s_div, half_top, top, u));
  }
}

#if QB_AVX512
// lowbias32 of 16 counters (qbench_rng.h).
QB_INLINE __m512i lowbias32_x16(__m512i x) {
  x = _mm512_xor_si512(x, _mm512_srli_epi32(x, 16));
  x = _mm512_mullo_epi32(x, _mm512_set1_epi32(0x7feb352d));
  x = _mm512_xor_si512(x, _mm512_srli_epi32(x, 15));
  x = _mm512_mullo_epi32(x, _mm512_set1_epi32((int32_t)0x846ca68bU));
  return _mm512_xor_si512(x, _mm512_srli_epi32(x, 16));
}

typedef struct {  // a bucket's constants, broadcast: divisor, t's scale, top * 2^24, sign bit
  __m512 div, scale, top24;
  __m512i sign_bit;
} qb_x16_level;

// The codes of 16 values x whose draws' counters are `counter`: those of quantize_u8 (bits <= 8),
// in 24.8 fixed point instead of a float draw. With T = t * 2^24 (t the clamped level position
// of qb_round_level, so T <= 255 * 2^24 < 2^32) and C = ceil(T) as an unsigned integer:
// low = C >> 24, and the up-draw u < t - low, with u = (h >> 8) * 2^-24 (h the hash), holds
// exactly when h < (C << 8) mod 2^32:
//  - t >= 1/2 has an ulp >= 2^-24, so T is an integer and C = T; t < 1/2 gives C <= 2^23: in both
//    cases C >> 24 = floor(t) = low;
//  - u < t - low <=> (h >> 8) < T - low * 2^24 <=> (h >> 8) < C - low * 2^24 = C mod 2^24 (an
//    integer below a real is below its ceiling) <=> h < 256 * (C mod 2^24) = (C << 8) mod 2^32.
// T is the reference's t scaled by 2^24 because both products round once from the same operands
// (x / s + 1 is 0 or >= 2^-24, never subnormal); for the sign layout a subnormal |x / s| * top
// rounds on a finer grid once scaled, but low is 0 and the draw goes up only for h >> 8 == 0
// either way (|x / s| * top > 0 in both). max(NaN, 0) is 0, as the reference's clamp; -0 -> +0
// changes no code.
QB_INLINE __m512i level_x16(const qb_x16_level *q, __m512 x, __m512i counter, const int layout) {
  const __m512 zero = _mm512_setzero_ps(), ratio = _mm512_div_ps(x, q->div);
  const __m512 t = layout == QB_LAYOUT_SIGN
                       ? _mm512_mul_ps(_mm512_abs_ps(ratio), q->scale)
                       : _mm512_mul_ps(_mm512_add_ps(ratio, _mm512_set1_ps(1.0f)), q->scale);
  const __m512 clamped = _mm512_min_ps(_mm512_max_ps(t, zero), q->top24);
  const __m512i c = _mm512_cvt_roundps_epu32(clamped, _MM_FROUND_TO_POS_INF | _MM_FROUND_NO_EXC);
  const __mmask16 up = _mm512_cmplt_epu32_mask(lowbias32_x16(counter), _mm512_slli_epi32(c, 8));
  const __m512i low = _mm512_srli_epi32(c, 24);
  const __m512i code = _mm512_mask_add_epi32(low, up, low, _mm512_set1_epi32(1));
  if (layout != QB_LAYOUT_SIGN) return code;
  const __mmask16 negative = _mm512_cmp_ps_mask(ratio, zero, _CMP_LT_OQ);
  return _mm512_mask_or_epi32(code, negative, code, q->sign_bit);
}

// quantize_u8 on 16 lanes; writes lv up to the next multiple of 16 (QB_CHUNK is one).
QB_INLINE void quantize_x16(const float *restrict x, int m, float s_div, int32_t top, uint32_t kh,
                            uint32_t idx0, uint8_t *restrict lv, const int layout) {
  const float top24 = (float)top * 16777216.0f;  // exact: top < 2^8
  const float scale = layout == QB_LAYOUT_SIGN ? top24 : (float)top * 8388608.0f;  // top / 2 * 2^24
  const qb_x16_level q = {_mm512_set1_ps(s_div), _mm512_set1_ps(scale), _mm512_set1_ps(top24),
                          _mm512_set1_epi32(top + 1)};
  const __m512i lanes = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  const __m512i golden = _mm512_set1_epi32((int32_t)QB_GOLDEN);
  const __m512i step = _mm512_set1_epi32((int32_t)(16u * QB_GOLDEN));
  __m512i counter = _mm512_add_epi32(_mm512_set1_epi32((int32_t)qb_counter(kh, idx0)),
                                     _mm512_mullo_epi32(lanes, golden));
  int i = 0;
  for (; i + 16 <= m; i += 16, counter = _mm512_add_epi32(counter, step)) {
    const __m512i code = level_x16(&q, _mm512_loadu_ps(x + i), counter, layout);
    _mm_storeu_si128((__m128i *)(lv + i), _mm512_cvtepi32_epi8(code));
  }
  if (i < m) {  // the tail, read under a mask
    const __m512 tail = _mm512_maskz_loadu_ps((__mmask16)((1u << (m - i)) - 1u), x + i);
    const __m512i code = level_x16(&q, tail, counter, layout);
    _mm_storeu_si128((__m128i *)(lv + i), _mm512_cvtepi32_epi8(code));
  }
}
#define quantize_codes quantize_x16
#elif QB_AVX2
// lowbias32 of 8 counters (qbench_rng.h).
QB_INLINE __m256i lowbias32_x8(__m256i x) {
  x = _mm256_xor_si256(x, _mm256_srli_epi32(x, 16));
  x = _mm256_mullo_epi32(x, _mm256_set1_epi32(0x7feb352d));
  x = _mm256_xor_si256(x, _mm256_srli_epi32(x, 15));
  x = _mm256_mullo_epi32(x, _mm256_set1_epi32((int32_t)0x846ca68bU));
  return _mm256_xor_si256(x, _mm256_srli_epi32(x, 16));
}

typedef struct {  // a bucket's constants, broadcast: divisor, t's scale, top, top + 1
  __m256 div, scale, top;
  __m256i sign_bit;
} qb_x8_level;

// The codes of 8 values x whose draws' counters are `counter`: quantize_u8's steps one for one
// (AVX2 converts no unsigned integers, so no fixed point as in level_x16). maxps returns its
// second operand (0) for a NaN, as qb_round_level's first clamp; -0 -> +0 changes no code.
QB_INLINE __m256i level_x8(const qb_x8_level *q, __m256 x, __m256i counter, const int layout) {
  const __m256 zero = _mm256_setzero_ps(), ratio = _mm256_div_ps(x, q->div);
  const __m256 magnitude = _mm256_andnot_ps(_mm256_set1_ps(-0.0f), ratio);
  const __m256 t = layout == QB_LAYOUT_SIGN
                       ? _mm256_mul_ps(magnitude, q->scale)
                       : _mm256_mul_ps(_mm256_add_ps(ratio, _mm256_set1_ps(1.0f)), q->scale);
  const __m256 v = _mm256_min_ps(_mm256_max_ps(t, zero), q->top);
  const __m256i low = _mm256_cvttps_epi32(v);
  const __m256 fraction = _mm256_sub_ps(v, _mm256_cvtepi32_ps(low));
  const __m256 u = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_srli_epi32(lowbias32_x8(counter), 8)),
                                 _mm256_set1_ps(1.0f / 16777216.0f));
  const __m256 up = _mm256_cmp_ps(u, fraction, _CMP_LT_OQ);
  const __m256i code = _mm256_sub_epi32(low, _mm256_castps_si256(up));  // up is all ones: +1
  if (layout != QB_LAYOUT_SIGN) return code;
  const __m256 negative = _mm256_cmp_ps(ratio, zero, _CMP_LT_OQ);
  return _mm256_or_si256(code, _mm256_and_si256(_mm256_castps_si256(negative), q->sign_bit));
}

// quantize_u8 on 8 lanes, 32 values a step; writes lv up to the next multiple of 8.
QB_INLINE void quantize_x8(const float *restrict x, int m, float s_div, int32_t top, uint32_t kh,
                           uint32_t idx0, uint8_t *restrict lv, const int layout) {
  const float scale = layout == QB_LAYOUT_SIGN ? (float)top : (float)top * 0.5f;
  const qb_x8_level q = {_mm256_set1_ps(s_div), _mm256_set1_ps(scale), _mm256_set1_ps((float)top),
                         _mm256_set1_epi32(top + 1)};
  const __m256i lanes = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  const __m256i step = _mm256_set1_epi32((int32_t)(8u * QB_GOLDEN));
  __m256i counter = _mm256_add_epi32(_mm256_set1_epi32((int32_t)qb_counter(kh, idx0)),
                                     _mm256_mullo_epi32(lanes, _mm256_set1_epi32((int32_t)QB_GOLDEN)));
  __m256i c[4];
  int i = 0;
  for (; i + 32 <= m; i += 32) {  // codes <= 255: the saturating packs keep them
    for (int k = 0; k < 4; k++, counter = _mm256_add_epi32(counter, step))
      c[k] = level_x8(&q, _mm256_loadu_ps(x + i + 8 * k), counter, layout);
    const __m256i bytes = _mm256_packus_epi16(_mm256_packus_epi32(c[0], c[1]),
                                              _mm256_packus_epi32(c[2], c[3]));
    const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);  // undo the per-lane packs
    _mm256_storeu_si256((__m256i *)(lv + i), _mm256_permutevar8x32_epi32(bytes, order));
  }
  for (; i < m; i += 8, counter = _mm256_add_epi32(counter, step)) {  // the rest, the tail masked
    const __m256i live = _mm256_cmpgt_epi32(_mm256_set1_epi32(m - i), lanes);
    const __m256i code = level_x8(&q, _mm256_maskload_ps(x + i, live), counter, layout);
    const __m128i words = _mm_packus_epi32(_mm256_castsi256_si128(code),
                                           _mm256_extracti128_si256(code, 1));
    _mm_storel_epi64((__m128i *)(lv + i), _mm_packus_epi16(words, words));
  }
}
#define quantize_codes quantize_x8
#else
#define quantize_codes quantize_u8
#endif

// Codes of m values of one bucket (scale s) into the packer, or as 16-bit words at out16.
static void encode_run(const float *restrict x, int m, float s, int32_t bits, int32_t layout,
                       uint32_t kh, uint32_t idx0, qb_packer *pk, uint8_t *restrict out16) {
  union {
    uint8_t u8[QB_CHUNK];
    uint16_t u16[QB_CHUNK];
  } lv;
  const int32_t top = qb_qsgd_top(bits, layout);
  const float s_div = qb_qsgd_divisor(s);
  const int zero = qb_qsgd_zero_bucket(s, layout);
  if (bits == 16) {
    if (zero) memset(lv.u16, 0, sizeof(uint16_t) * (size_t)m);
    else if (layout == QB_LAYOUT_SIGN)
      quantize_u16(x, m, s_div, top, kh, idx0, lv.u16, QB_LAYOUT_SIGN);
    else quantize_u16(x, m, s_div, top, kh, idx0, lv.u16, QB_LAYOUT_INTERVALS);
    memcpy(out16, lv.u16, sizeof(uint16_t) * (size_t)m);
    return;
  }
  if (zero) memset(lv.u8, 0, (size_t)m);
  else if (layout == QB_LAYOUT_SIGN)
    quantize_codes(x, m, s_div, top, kh, idx0, lv.u8, QB_LAYOUT_SIGN);
  else quantize_codes(x, m, s_div, top, kh, idx0, lv.u8, QB_LAYOUT_INTERVALS);
  packer_put(pk, lv.u8, m);
}

static int qsgd_args_ok(int64_t n, int64_t bucket, int32_t bits, int32_t layout) {
  int bits_ok = (bits >= 1 && bits <= 8) || bits == 16;
  int layout_ok = layout == QB_LAYOUT_INTERVALS || (layout == QB_LAYOUT_SIGN && bits >= 2);
  return n >= 0 && bucket >= 1 && bits_ok && layout_ok;
}

// x[0..n) -> levels (ceil(n*bits/8) bytes, or 2n for bits 16) and scales (ceil(n/bucket)).
// Draws are keyed by key_hash and the element index offset + i (mod 2^32).
QB_EXPORT int qb_qsgd_encode(const float *restrict x, int64_t n, int64_t bucket, int32_t bits,
                             int32_t layout, int32_t norm, uint32_t key_hash, uint32_t offset,
                             uint8_t *restrict levels, float *restrict scales) {
  if (!qsgd_args_ok(n, bucket, bits, layout) || (norm != QB_NORM_MAX && norm != QB_NORM_L2))
    return QB_EINVAL;
  float stack_tree[QB_STACK_FLOATS];
  float *tree = stack_tree;
  // The tree of the reference: its width comes from bucket_size even when n is smaller.
  const int64_t w = norm == QB_NORM_L2 && n > 0 ? qb_tree_width(bucket) : 0;
  if (w > QB_STACK_FLOATS && !(tree = malloc(sizeof(float) * (size_t)w))) return QB_ENOMEM;
  qb_packer pk = {levels, bits, 0, {0}};
  for (int64_t start = 0, b = 0; start < n; start += bucket, b++) {
    const int64_t cnt = min64(bucket, n - start);
    const float *xb = x + start;
    // The lines QB_PREFETCH values ahead: this bucket's quantising overlaps their loads.
    const int64_t ahead = min64(start + QB_PREFETCH + cnt, n);
    for (int64_t k = start + QB_PREFETCH; QB_PREFETCH && k < ahead; k += 16)
      __builtin_prefetch(x + k);
    const float s = norm == QB_NORM_MAX ? absmax(xb, cnt) : l2_norm(xb, cnt, w, tree);
    scales[b] = s;
    for (int64_t c0 = 0; c0 < cnt; c0 += QB_CHUNK) {
      const int m = (int)min64(QB_CHUNK, cnt - c0);
      encode_run(xb + c0, m, s, bits, layout, key_hash, offset + (uint32_t)(start + c0), &pk,
                 bits == 16 ? levels + 2 * (start + c0) : NULL);
    }
  }
  if (bits != 16) packer_finish(&pk);
  if (tree != stack_tree) free(tree);
  return 0;
}

QB_INLINE void dequantize(const uint8_t *restrict c8, const uint16_t *restrict c16, int64_t m,
                          float step, int32_t top, float *restrict out, const int wide,
                          const int layout, const int accumulate) {
  for (int64_t i = 0; i < m; i++) {
    const int32_t code = wide ? (int32_t)c16[i] : (int32_t)c8[i];
    const float v = layout == QB_LAYOUT_SIGN ? qb_qsgd_value_sign(code, step, top)
                                             : qb_qsgd_value_intervals(code, step, top);
    out[i] = accumulate ? out[i] + v : v;
  }
}

// The eight specialisations, so that each loop above is straight-line code.
static void dequantize_any(const uint8_t *c8, const uint16_t *c16, int64_t m, float step,
                           int32_t top, float *out, int wide, int layout, int accumulate) {
  const int sign = layout == QB_LAYOUT_SIGN;
  switch ((wide ? 4 : 0) | (sign ? 2 : 0) | (accumulate ? 1 : 0)) {
    case 0: dequantize(c8, c16, m, step, top, out, 0, QB_LAYOUT_INTERVALS, 0); break;
    case 1: dequantize(c8, c16, m, step, top, out, 0, QB_LAYOUT_INTERVALS, 1); break;
    case 2: dequantize(c8, c16, m, step, top, out, 0, QB_LAYOUT_SIGN, 0); break;
    case 3: dequantize(c8, c16, m, step, top, out, 0, QB_LAYOUT_SIGN, 1); break;
    case 4: dequantize(c8, c16, m, step, top, out, 1, QB_LAYOUT_INTERVALS, 0); break;
    case 5: dequantize(c8, c16, m, step, top, out, 1, QB_LAYOUT_INTERVALS, 1); break;
    case 6: dequantize(c8, c16, m, step, top, out, 1, QB_LAYOUT_SIGN, 0); break;
    default: dequantize(c8, c16, m, step, top, out, 1, QB_LAYOUT_SIGN, 1); break;
  }
}

// levels + scales of n values -> out[0..n) (accumulate: out[i] += value, as out.add_(values)).
QB_EXPORT int qb_qsgd_decode(const uint8_t *restrict levels, const float *restrict scales,
                             int64_t n, int64_t bucket, int32_t bits, int32_t layout,
                             float *restrict out, int32_t accumulate) {
  if (!qsgd_args_ok(n, bucket, bits, layout)) return QB_EINVAL;
  union {
    uint8_t u8[QB_CHUNK];
    uint16_t u16[QB_CHUNK];
  } lv;
  const int32_t top = qb_qsgd_top(bits, layout);
  const int wide = bits == 16;
  float values[QB_CHUNK];  // a chunk's values before their streaming stores
  const int stream = streams(n, accumulate);
  for (int64_t c0 = 0; c0 < n; c0 += QB_CHUNK) {
    const int64_t end = min64(c0 + QB_CHUNK, n);
    if (wide) memcpy(lv.u16, levels + 2 * c0, sizeof(uint16_t) * (size_t)(end - c0));
    else unpack_range(levels, bits, c0, end - c0, lv.u8);
    for (int64_t e = c0; e < end;) {  // one run per bucket met in the chunk
      const int64_t b = e / bucket, stop = min64((b + 1) * bucket, end);
      const float step = qb_qsgd_step(scales[b], top);
      float *dst = stream ? values + (e - c0) : out + e;
      dequantize_any(lv.u8 + (e - c0), lv.u16 + (e - c0), stop - e, step, top, dst, wide, layout,
                     accumulate);
      e = stop;
    }
    if (stream) stream_floats(out + c0, values, end - c0);
  }
  if (stream) stream_fence();
  return 0;
}

// -- 1bitSGD --------------------------------------------------------------------------------------
// One pass over a bucket: its values v, the leaves of both sums and the sign codes. mode 0: no
// error feedback; 1: grad + residual; 2: grad + 0.0 (feedback, no residual yet).
QB_INLINE void onebit_leaves_mode(const float *restrict g, const float *restrict r, int64_t cnt,
                                  float *restrict v, float *restrict pos, float *restrict neg,
                                  uint8_t *restrict lv, const int mode) {
  for (int64_t i = 0; i < cnt; i++) {
    const float x = mode == 0 ? g[i] : qb_onebit_input(g[i], mode == 1 ? r[i] : 0.0f);
    v[i] = x;
    pos[i] = qb_onebit_pos_leaf(x);
    neg[i] = qb_onebit_neg_leaf(x);
    lv[i] = x < 0.0f;
  }
}

static void onebit_leaves(const float *g, const float *r, int64_t cnt, float *v, float *pos,
                          float *neg, uint8_t *lv, int mode) {
  if (mode == 0) onebit_leaves_mode(g, r, cnt, v, pos, neg, lv, 0);
  else if (mode == 1) onebit_leaves_mode(g, r, cnt, v, pos, neg, lv, 1);
  else onebit_leaves_mode(g, r, cnt, v, pos, neg, lv, 2);
}

typedef struct {  // per bucket: its values v, the two sums' leaves, its sign codes
  float *v, *pos, *neg;
  uint8_t *lv;
} qb_onebit_scratch;

// The plain loops, for any bucket size: leaves, counts and sums, then the bit packing.
static void onebit_encode_plain(const float *grad, const float *residual_in, float *residual_out,
                                int mode, int64_t n, int64_t bucket, int64_t w,
                                const qb_onebit_scratch *s, uint8_t *signs, float *means) {
  float *v = s->v, *pos = s->pos, *neg = s->neg;
  qb_packer pk = {signs, 1, 0, {0}};
  for (int64_t start = 0, b = 0; start < n; start += bucket, b++) {
    const int64_t cnt = min64(bucket, n - start);
    onebit_leaves(grad + start, mode == 1 ? residual_in + start : NULL, cnt, v, pos, neg, s->lv,
                  mode);
    int64_t nneg = 0;
    for (int64_t c0 = 0; c0 < cnt; c0 += 1 << 20) {  // 32-bit partial counts vectorise better
      uint32_t part = 0;
      for (int64_t i = c0; i < min64(c0 + (1 << 20), cnt); i++) part += s->lv[i];
      nneg += part;
    }
    for (int64_t i = cnt; i < w; i++) pos[i] = neg[i] = 0.0f;
    const float avg_pos = qb_onebit_mean(tree_sum(pos, w), cnt - nneg);
    const float avg_neg = qb_onebit_mean(tree_sum(neg, w), nneg);
    means[2 * b] = avg_pos;
    means[2 * b + 1] = avg_neg;
    packer_put(&pk, s->lv, cnt);
    if (mode)
      for (int64_t i = 0; i < cnt; i++)
        residual_out[start + i] = qb_onebit_residual(v[i], avg_pos, avg_neg);
  }
  packer_finish(&pk);
}

#if QB_AVX512
// Buckets of w = 16 * 2^k <= QB_X16_MAX values, held in registers as vectors of 16: their
// comparison masks are the sign bits themselves (two bytes of the stream per vector, as bucket
// starts are multiples of 16), the sum tree's levels h >= 16 add whole vectors and the last
// four stay inside one. w is a constant in each copy, so that the arrays below are registers.
#define QB_X16_MAX 256

static __mmask16 lanes_below(int64_t k) {
  return k >= 16 ? (__mmask16)0xffff : k > 0 ? (__mmask16)((1u << k) - 1u) : 0;
}

// tree_sum of the 16 * nv leaves in t[0..nv) (overwritten).
QB_INLINE float vectors_tree_sum(__m512 *t, const int64_t nv) {
  for (int64_t h = nv / 2; h >= 1; h /= 2)
    for (int64_t i = 0; i < h; i++) t[i] = _mm512_add_ps(t[i], t[i + h]);
  const __m256 hi = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(t[0]), 1));
  const __m256 h8 = _mm256_add_ps(_mm512_castps512_ps256(t[0]), hi);  // t[i] + t[i + 8]
  const __m128 h4 = _mm_add_ps(_mm256_castps256_ps128(h8), _mm256_extractf128_ps(h8, 1));
  const __m128 h2 = _mm_add_ps(h4, _mm_movehl_ps(h4, h4));
  return _mm_cvtss_f32(_mm_add_ss(h2, _mm_movehdup_ps(h2)));
}

// One bucket: grad g (+ r, mode as onebit_leaves_mode) of cnt <= w values, lanes past cnt read
// as +0.0 (the padding); its sign bytes, means and residuals at signs, means and r_out.
QB_INLINE void onebit_bucket_x16(const float *g, const float *r, float *r_out, int mode,
                                 int64_t cnt, uint8_t *signs, float *means, const int64_t w) {
  __m512 v[QB_X16_MAX / 16], pos[QB_X16_MAX / 16], neg[QB_X16_MAX / 16];
  __mmask16 negative[QB_X16_MAX / 16];
  const __m512 zero = _mm512_setzero_ps();
  int64_t nneg = 0;
  for (int64_t j = 0; j < w / 16; j++) {
    const __mmask16 live = lanes_below(cnt - 16 * j);
    v[j] = _mm512_maskz_loadu_ps(live, g + 16 * j);
    if (mode == 1) v[j] = _mm512_add_ps(v[j], _mm512_maskz_loadu_ps(live, r + 16 * j));
    if (mode == 2) v[j] = _mm512_add_ps(v[j], zero);  // qb_onebit_input(g, 0.0f): -0.0 -> +0.0
    negative[j] = _mm512_cmp_ps_mask(v[j], zero, _CMP_LT_OQ);
    pos[j] = _mm512_maskz_mov_ps((__mmask16)~negative[j], v[j]);  // qb_onebit_pos_leaf
    neg[j] = _mm512_maskz_mov_ps(negative[j], v[j]);              // qb_onebit_neg_leaf
    nneg += __builtin_popcount(negative[j]);
  }
  const float avg_pos = qb_onebit_mean(vectors_tree_sum(pos, w / 16), cnt - nneg);
  const float avg_neg = qb_onebit_mean(vectors_tree_sum(neg, w / 16), nneg);
  means[0] = avg_pos;
  means[1] = avg_neg;
  const __m512 sent_pos = _mm512_set1_ps(avg_pos), sent_neg = _mm512_set1_ps(avg_neg);
  for (int64_t j = 0; j < w / 16 && 16 * j < cnt; j++) {
    if (cnt - 16 * j > 8) memcpy(signs + 2 * j, &negative[j], 2);
    else signs[2 * j] = (uint8_t)negative[j];  // the stream's last byte
    if (!mode) continue;
    const __m512 sent = _mm512_mask_blend_ps(negative[j], sent_pos, sent_neg);
    _mm512_mask_storeu_ps(r_out + 16 * j, lanes_below(cnt - 16 * j), _mm512_sub_ps(v[j], sent));
  }
}

QB_INLINE void onebit_encode_x16_w(const float *grad, const float *residual_in,
                                   float *residual_out, int mode, int64_t n, uint8_t *signs,
                                   float *means, const int64_t w) {
  int64_t start = 0;
  for (; start + w <= n; start += w)  // full buckets: cnt = w, a constant (no masks)
    onebit_bucket_x16(grad + start, mode == 1 ? residual_in + start : NULL,
                      mode ? residual_out + start : NULL, mode, w, signs + start / 8,
                      means + 2 * (start / w), w);
  if (start < n)
    onebit_bucket_x16(grad + start, mode == 1 ? residual_in + start : NULL,
                      mode ? residual_out + start : NULL, mode, n - start, signs + start / 8,
                      means + 2 * (start / w), w);
}

// The encode through the 16-lane loops, returning 1, when they take this bucket size; else 0.
static int onebit_encode_x16(const float *grad, const float *r_in, float *r_out, int mode,
                             int64_t n, int64_t bucket, uint8_t *signs, float *means) {
  switch (bucket) {
    case 16: onebit_encode_x16_w(grad, r_in, r_out, mode, n, signs, means, 16); return 1;
    case 32: onebit_encode_x16_w(grad, r_in, r_out, mode, n, signs, means, 32); return 1;
    case 64: onebit_encode_x16_w(grad, r_in, r_out, mode, n, signs, means, 64); return 1;
    case 128: onebit_encode_x16_w(grad, r_in, r_out, mode, n, signs, means, 128); return 1;
    case QB_X16_MAX: onebit_encode_x16_w(grad, r_in, r_out, mode, n, signs, means, 256); return 1;
    default: return 0;
  }
}
#elif QB_AVX2
// The same on 8 lanes (buckets of w = 8 * 2^k <= QB_X8_MAX): one sign byte per vector (its
// movemask), the sum tree's levels h >= 8 add whole vectors and the last three stay inside one.
#define QB_X8_MAX 128  // 256 spills more registers than it saves (Zen 3)
#define QB_X8_PREFETCH 1024  // values (4 KiB a stream) prefetched ahead: measured faster (Zen 3)

static __m256i lanes_below_x8(int64_t k) {
  const __m256i lanes = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  return _mm256_cmpgt_epi32(_mm256_set1_epi32((int32_t)(k < 8 ? k : 8)), lanes);
}

// tree_sum of the leaves of v[0..nv) (their values < 0 when neg_side, else the others, as
// qb_onebit_neg_leaf and qb_onebit_pos_leaf) in the reference order.
QB_INLINE float leaves_tree_sum_x8(const __m256 *v, const int64_t nv, const int neg_side) {
  __m256 t[QB_X8_MAX / 8];
  for (int64_t i = 0; i < nv; i++) {
    const __m256 negative = _mm256_cmp_ps(v[i], _mm256_setzero_ps(), _CMP_LT_OQ);
    t[i] = neg_side ? _mm256_and_ps(negative, v[i]) : _mm256_andnot_ps(negative, v[i]);
  }
  for (int64_t h = nv / 2; h >= 1; h /= 2)
    for (int64_t i = 0; i < h; i++) t[i] = _mm256_add_ps(t[i], t[i + h]);
  const __m128 h4 = _mm_add_ps(_mm256_castps256_ps128(t[0]), _mm256_extractf128_ps(t[0], 1));
  const __m128 h2 = _mm_add_ps(h4, _mm_movehl_ps(h4, h4));  // (a0 + a2, a1 + a3) of tree_sum
  return _mm_cvtss_f32(_mm_add_ss(h2, _mm_movehdup_ps(h2)));
}

// One bucket as onebit_bucket_x16; lanes past cnt read as +0.0 (the padding).
QB_INLINE void onebit_bucket_x8(const float *g, const float *r, float *r_out, int mode,
                                int64_t cnt, uint8_t *signs, float *means, const int64_t w,
                                const int tail) {
  __m256 v[QB_X8_MAX / 8];  // the masks are recomputed where needed: fewer registers spilled
  const __m256 zero = _mm256_setzero_ps();
  int64_t nneg = 0;
  for (int64_t j = 0; j < w / 8; j++) {
    const int full = !tail || cnt >= 8 * (j + 1);  // full buckets: plain loads, no masks
    const __m256i live = lanes_below_x8(cnt - 8 * j);
    v[j] = full ? _mm256_loadu_ps(g + 8 * j) : _mm256_maskload_ps(g + 8 * j, live);
    if (mode == 1)
      v[j] = _mm256_add_ps(v[j], full ? _mm256_loadu_ps(r + 8 * j)
                                      : _mm256_maskload_ps(r + 8 * j, live));
    if (mode == 2) v[j] = _mm256_add_ps(v[j], zero);  // qb_onebit_input(g, 0.0f): -0.0 -> +0.0
    nneg += __builtin_popcount((unsigned)_mm256_movemask_ps(_mm256_cmp_ps(v[j], zero, _CMP_LT_OQ)));
  }
  const float avg_pos = qb_onebit_mean(leaves_tree_sum_x8(v, w / 8, 0), cnt - nneg);
  const float avg_neg = qb_onebit_mean(leaves_tree_sum_x8(v, w / 8, 1), nneg);
  means[0] = avg_pos;
  means[1] = avg_neg;
  const __m256 sent_pos = _mm256_set1_ps(avg_pos), sent_neg = _mm256_set1_ps(avg_neg);
  for (int64_t j = 0; j < w / 8 && 8 * j < cnt; j++) {
    const __m256 negative = _mm256_cmp_ps(v[j], zero, _CMP_LT_OQ);
    signs[j] = (uint8_t)_mm256_movemask_ps(negative);  // bit k: value 8j + k is negative
    if (!mode) continue;
    const __m256 left = _mm256_sub_ps(v[j], _mm256_blendv_ps(sent_pos, sent_neg, negative));
    if (!tail || cnt >= 8 * (j + 1)) _mm256_storeu_ps(r_out + 8 * j, left);
    else _mm256_maskstore_ps(r_out + 8 * j, lanes_below_x8(cnt - 8 * j), left);
  }
}

QB_INLINE void onebit_encode_x8_w(const float *grad, const float *residual_in,
                                  float *residual_out, int mode, int64_t n, uint8_t *signs,
                                  float *means, const int64_t w) {
  int64_t start = 0;
  for (; start + w <= n; start += w) {  // full buckets: cnt = w, a constant (no masks)
    const int64_t ahead = min64(start + QB_X8_PREFETCH + w, n);
    for (int64_t k = start + QB_X8_PREFETCH; k < ahead; k += 16) {  // as QB_PREFETCH
      __builtin_prefetch(grad + k);
      if (mode == 1) __builtin_prefetch(residual_in + k);
    }
    onebit_bucket_x8(grad + start, mode == 1 ? residual_in + start : NULL,
                     mode ? residual_out + start : NULL, mode, w, signs + start / 8,
                     means + 2 * (start / w), w, 0);
  }
  if (start < n)
    onebit_bucket_x8(grad + start, mode == 1 ? residual_in + start : NULL,
                     mode ? residual_out + start : NULL, mode, n - start, signs + start / 8,
                     means + 2 * (start / w), w, 1);
}

// The encode through the 8-lane loops, returning 1, when they take this bucket size; else 0.
static int onebit_encode_x8(const float *grad, const float *r_in, float *r_out, int mode,
                            int64_t n, int64_t bucket, uint8_t *signs, float *means) {
  switch (bucket) {
    case 8: onebit_encode_x8_w(grad, r_in, r_out, mode, n, signs, means, 8); return 1;
    case 16: onebit_encode_x8_w(grad, r_in, r_out, mode, n, signs, means, 16); return 1;
    case 32: onebit_encode_x8_w(grad, r_in, r_out, mode, n, signs, means, 32); return 1;
    case 64: onebit_encode_x8_w(grad, r_in, r_out, mode, n, signs, means, 64); return 1;
    case QB_X8_MAX: onebit_encode_x8_w(grad, r_in, r_out, mode, n, signs, means, 128); return 1;
    default: return 0;
  }
}
#endif

// grad[0..n) (+ residual_in with error feedback; a NULL residual counts as +0.0) -> signs
// (bit set = negative, ceil(n/8) bytes), means ([avg+, avg-] per bucket) and, with error
// feedback, residual_out = v - decoded v. residual_out may be residual_in (updated in place).
QB_EXPORT int qb_onebit_encode(const float *grad, const float *residual_in, float *residual_out,
                               int32_t error_feedback, int64_t n, int64_t bucket,
                               uint8_t *restrict signs, float *restrict means) {
  if (n < 0 || bucket < 1 || (error_feedback && n > 0 && !residual_out)) return QB_EINVAL;
  const int mode = !error_feedback ? 0 : residual_in ? 1 : 2;  // as onebit_leaves_mode
#if QB_AVX512
  if (onebit_encode_x16(grad, residual_in, residual_out, mode, n, bucket, signs, means)) return 0;
#elif QB_AVX2
  if (onebit_encode_x8(grad, residual_in, residual_out, mode, n, bucket, signs, means)) return 0;
#endif
  // Sums over the padded width of a full bucket even when n is smaller, as the reference does:
  // an all -0.0 bucket sums to -0.0 only when nothing pads it.
  const int64_t size = n > 0 ? bucket : 1, w = qb_tree_width(size);
  const int64_t floats = size + 2 * w + (size + 3) / 4;  // v, pos, neg, size bytes of codes
  float stack[QB_STACK_FLOATS];
  float *scratch = stack;
  if (floats > QB_STACK_FLOATS && !(scratch = malloc(sizeof(float) * (size_t)floats)))
    return QB_ENOMEM;
  const qb_onebit_scratch s = {scratch, scratch + size, scratch + size + w,
                               (uint8_t *)(scratch + size + 2 * w)};
  onebit_encode_plain(grad, residual_in, residual_out, mode, n, bucket, w, &s, signs, means);
  if (scratch != stack) free(scratch);
  return 0;
}

// signs + means of n values -> out[0..n) (accumulate: out[i] += value).
QB_EXPORT int qb_onebit_decode(const uint8_t *restrict signs, const float *restrict means,
                               int64_t n, int64_t bucket, float *restrict out,
                               int32_t accumulate) {
  if (n < 0 || bucket < 1) return QB_EINVAL;
  uint8_t lv[QB_CHUNK];
  float values[QB_CHUNK];  // a chunk's values before their streaming stores
  const int stream = streams(n, accumulate);
  for (int64_t c0 = 0; c0 < n; c0 += QB_CHUNK) {
    const int64_t end = min64(c0 + QB_CHUNK, n);
    unpack_range(signs, 1, c0, end - c0, lv);
    for (int64_t e = c0; e < end;) {
      const int64_t b = e / bucket, stop = min64((b + 1) * bucket, end);
      const float avg_pos = means[2 * b], avg_neg = means[2 * b + 1];
      const uint8_t *c = lv + (e - c0);
      float *o = stream ? values + (e - c0) : out + e;
      if (accumulate)
        for (int64_t i = 0; i < stop - e; i++) o[i] += qb_onebit_value(c[i], avg_pos, avg_neg);
      else
        for (int64_t i = 0; i < stop - e; i++) o[i] = qb_onebit_value(c[i], avg_pos, avg_neg);
      e = stop;
    }
    if (stream) stream_floats(out + c0, values, end - c0);
  }
  if (stream) stream_fence();
  return 0;
}

// -- for the loader's self-check --------------------------------------------------------------
QB_EXPORT int qb_abi_version(void) { return QB_ABI_VERSION; }

QB_EXPORT void qb_uniform_fill(uint32_t key_hash, uint32_t offset, int64_t n, float *out) {
  for (int64_t i = 0; i < n; i++) out[i] = qb_uniform32(key_hash, offset + (uint32_t)i);
}

/* Integer allreduce (qbench/aggregate/integer_allreduce.py): the same float32 operations, in
 * the same order, as its torch `quantize` / `dequantize`, so both give identical integers.
 * quantize: t = (x / s) * top; q = floor(t) + (u < t - floor(t)), clamped to [-top, top];
 * s <= 0 (an all-zero bucket) divides by 1. out is int8 (width 1), int16 (width 2) or int32
 * (width 4); each width has its own straight-line loop so that the compiler vectorises it. */
// floor(t) as truncation minus (truncation > t), in integers: it vectorises without SSE4.1
// rounding and equals floorf since |t| <= top < 2^24 (|x| <= s, the max over ranks).
#define QB_INT_QUANTIZE(T)                                                                   \
  QB_INLINE void int_quantize_##T(const float *restrict x, int64_t m, float s, int32_t top,  \
                                  uint32_t counter, T *restrict out) {                       \
    const float ftop = (float)top;                                                           \
    for (int64_t i = 0; i < m; i++, counter += QB_GOLDEN) {                                  \
      const float t = (x[i] / s) * ftop;                                                     \
      const int32_t trunc = (int32_t)t;                                                      \
      const int32_t low = trunc - ((float)trunc > t);                                        \
      const float u = qb_uniform_counter(counter);                                           \
      int32_t q = low + (u < t - (float)low);                                                \
      q = q < -top ? -top : (q > top ? top : q);                                             \
      out[i] = (T)q;                                                                         \
    }                                                                                        \
  }
QB_INT_QUANTIZE(int8_t)
QB_INT_QUANTIZE(int16_t)
QB_INT_QUANTIZE(int32_t)

QB_EXPORT int qb_int_quantize(const float *restrict x, const float *restrict scales, int64_t n,
                              int64_t bucket, int32_t top, uint32_t key_hash, uint32_t offset,
                              void *restrict out, int32_t width) {
  if ((width != 1 && width != 2 && width != 4) || bucket < 1 || n < 0) return QB_EINVAL;
  for (int64_t b0 = 0; b0 < n; b0 += bucket) {
    const int64_t m = min64(bucket, n - b0);
    const float s = scales[b0 / bucket] > 0.0f ? scales[b0 / bucket] : 1.0f;
    const uint32_t counter = qb_counter(key_hash, offset + (uint32_t)b0);
    if (width == 1) int_quantize_int8_t(x + b0, m, s, top, counter, (int8_t *)out + b0);
    else if (width == 2) int_quantize_int16_t(x + b0, m, s, top, counter, (int16_t *)out + b0);
    else int_quantize_int32_t(x + b0, m, s, top, counter, (int32_t *)out + b0);
  }
  return 0;
}

/* value = (sum / denom) * s, float32, written to out. */
#define QB_INT_DEQUANTIZE(T)                                                                 \
  QB_INLINE void int_dequantize_##T(const T *restrict q, int64_t m, float fd, float s,      \
                                    float *restrict out) {                                   \
    for (int64_t i = 0; i < m; i++) out[i] = ((float)q[i] / fd) * s;                         \
  }
QB_INT_DEQUANTIZE(int8_t)
QB_INT_DEQUANTIZE(int16_t)
QB_INT_DEQUANTIZE(int32_t)

QB_EXPORT int qb_int_dequantize(const void *restrict sums, const float *restrict scales, int64_t n,
                                int64_t bucket, int32_t denom, float *restrict out, int32_t width) {
  if ((width != 1 && width != 2 && width != 4) || bucket < 1 || n < 0) return QB_EINVAL;
  const float fd = (float)denom;
  for (int64_t b0 = 0; b0 < n; b0 += bucket) {
    const int64_t m = min64(bucket, n - b0);
    const float s = scales[b0 / bucket];
    if (width == 1) int_dequantize_int8_t((const int8_t *)sums + b0, m, fd, s, out + b0);
    else if (width == 2) int_dequantize_int16_t((const int16_t *)sums + b0, m, fd, s, out + b0);
    else int_dequantize_int32_t((const int32_t *)sums + b0, m, fd, s, out + b0);
  }
  return 0;
}

/* max |x| of each bucket of x[0..n) into scales[0..ceil(n / bucket)), as torch's
 * x.abs().amax(dim=1) per bucket (one pass, no temporary). */
QB_EXPORT int qb_bucket_absmax(const float *restrict x, int64_t n, int64_t bucket,
                               float *restrict scales) {
  if (bucket < 1 || n < 0) return QB_EINVAL;
  for (int64_t b0 = 0, b = 0; b0 < n; b0 += bucket, b++) {
    scales[b] = absmax(x + b0, min64(bucket, n - b0));
  }
  return 0;
}

/* -- FP8 / MX / NVFP4 (qbench/compress/lowfloat.py) ---------------------------------------------
 * Block-scaled low-precision floats, byte-identical to the torch reference (blockscale.py,
 * minifloat.py); the per-element maths is kernels/lowfloat_math.h, shared with the CUDA kernels.
 * An encode walks chunks of whole blocks (or, for blocks longer than a chunk, one block at a
 * time): the values v (grad, or grad + residual with error feedback), each block's max |v| and
 * scale, the scales spread to one per value (so that the long loops need no block index), the
 * codes, the new residual v - decoded v, and the bit packing. NVFP4 first takes every block's
 * max into a scratch array: its tensor scale is the largest of them. */
#include "lowfloat_math.h"

#define QB_NONFINITE 3  // a gradient value is NaN or inf (see qb_lowfloat_encode)
#define QB_LF_CHUNK 1024  // values per chunk; a multiple of 8 (one packing group)

static int lf_args_ok(int64_t n, int32_t kind, int32_t element, int64_t block) {
  const int element_ok = element >= QB_LF_E4M3 && element <= QB_LF_E2M1;
  const int pair_ok = kind == QB_LF_MX || (kind == QB_LF_FP8 && element <= QB_LF_E5M2) ||
                      (kind == QB_LF_NVFP4 && element == QB_LF_E2M1);
  return n >= 0 && block >= 1 && element_ok && pair_ok;
}

// The value of every code (both signs) of a format, for the residual and the decode loops.
static void lf_table(int32_t element, float table[256]) {
  const qb_lf_format f = qb_lf_format_of(element);
  for (uint32_t c = 0; c < 256u; c++) table[c] = qb_lf_value(c & ((1u << f.bits) - 1u), f);
}

// 1 when x[0..n) holds a NaN or an inf (exponent bits all ones).
static int lf_any_nonfinite(const float *restrict x, int64_t n) {
  uint32_t bad = 0;
  for (int64_t i = 0; i < n; i++) bad |= (qb_lf_bits(x[i]) & 0x7f800000u) == 0x7f800000u;
  return bad != 0;
}

// v[0..cnt) = g + r (float32 sums, as torch's grad + residual).
static void lf_sum(const float *restrict g, const float *restrict r, int64_t cnt,
                   float *restrict v) {
  for (int64_t i = 0; i < cnt; i++) v[i] = g[i] + r[i];
}

// Bits of max |v| of each block of v[0..cnt) (blocks of B values, the last may be partial).
QB_INLINE void lf_maxes_of(const float *restrict v, int64_t cnt, uint32_t *restrict m,
                           const int64_t B) {
  for (int64_t b = 0, i = 0; i < cnt; b++) {
    const int64_t stop = min64(i + B, cnt);
    uint32_t x = 0;
    for (; i < stop; i++) {
      const uint32_t a = qb_lf_abs_bits(v[i]);
      x = a > x ? a : x;
    }
    m[b] = x;
  }
}

static void lf_maxes(const float *v, int64_t cnt, int64_t block, uint32_t *m) {
  if (block == 16) lf_maxes_of(v, cnt, m, 16);  // NVFP4: constant trip counts
  else if (block == 32) lf_maxes_of(v, cnt, m, 32);  // MX
  else lf_maxes_of(v, cnt, m, block);
}

// Codes of m values: x = v / d (or v * d for MX, d then the exact reciprocal), one d per value;
// draws from counter on, stepping by the golden increment. element, multiply and stochastic
// are constants at every call.
QB_INLINE void lf_quantize(const float *restrict v, int64_t m, const float *restrict d,
                           uint32_t counter, uint8_t *restrict lv, const int element,
                           const int multiply, const int stochastic) {
  const qb_lf_format f = qb_lf_format_of(element);
  for (int64_t i = 0; i < m; i++, counter += QB_GOLDEN) {
    const float x = multiply ? v[i] * d[i] : v[i] / d[i];
    const float u = stochastic ? qb_uniform_counter(counter) : 0.0f;
    lv[i] = (uint8_t)qb_lf_encode(x, f, stochastic, u);
  }
}

#define QB_LF_CASE(E, M)                                                                     \
  case (E) * 4 + (M) * 2:                                                                    \
    lf_quantize(v, m, d, counter, lv, E, M, 0);                                              \
    break;                                                                                   \
  case (E) * 4 + (M) * 2 + 1:                                                                \
    lf_quantize(v, m, d, counter, lv, E, M, 1);                                              \
    break;

// The specialisations the codecs use: FP8 E4M3 / E5M2 and NVFP4 E2M1 divide, MX multiplies.
static void lf_quantize_any(const float *v, int64_t m, const float *d, uint32_t counter,
                            uint8_t *lv, int element, int multiply, int stochastic) {
  switch (element * 4 + multiply * 2 + stochastic) {
    QB_LF_CASE(QB_LF_E4M3, 0)
    QB_LF_CASE(QB_LF_E5M2, 0)
    QB_LF_CASE(QB_LF_E2M1, 0)
    QB_LF_CASE(QB_LF_E4M3, 1)
    QB_LF_CASE(QB_LF_E5M2, 1)
    QB_LF_CASE(QB_LF_E3M2, 1)
    QB_LF_CASE(QB_LF_E2M3, 1)
    QB_LF_CASE(QB_LF_E2M1, 1)
    default: break;  // no other pair passes lf_args_ok
  }
}

// The scales of nb blocks from their max |v| (bits m[k]; written to scales[b0 + k]), what
// their values are multiplied by on decode (divisor[k]) and what they are divided by on
// encode (d[k]; for MX the exact reciprocal, multiplied by). One loop per kind, so that each
// vectorises.
static void lf_block_scales(int32_t kind, const qb_lf_format *f, const uint32_t *restrict m,
                            int64_t nb, float tensor, void *restrict scales, int64_t b0,
                            float *restrict divisor, float *restrict d) {
  if (kind == QB_LF_FP8) {
    float *out = (float *)scales + b0;
    const float max = f->max;
    for (int64_t k = 0; k < nb; k++) {
      out[k] = qb_lf_float(m[k]) / max;
      divisor[k] = qb_lf_fp8_divisor(out[k]);
      d[k] = qb_lf_safe(divisor[k]);
    }
  } else if (kind == QB_LF_MX) {
    uint8_t *out = (uint8_t *)scales + b0;
    const int32_t emax = f->emax;
    for (int64_t k = 0; k < nb; k++) {
      const uint32_t code = qb_lf_e8m0(qb_lf_float(m[k]), emax);
      out[k] = (uint8_t)code;
      divisor[k] = qb_lf_mx_divisor(code);
      d[k] = qb_lf_mx_reciprocal(qb_lf_safe(divisor[k]));
    }
  } else {
    uint8_t *out = (uint8_t *)scales + b0;
    for (int64_t k = 0; k < nb; k++) {
      const uint32_t code = qb_lf_nvfp4_scale(qb_lf_float(m[k]), tensor);
      out[k] = (uint8_t)code;
      divisor[k] = qb_lf_nvfp4_divisor(code, tensor);
      d[k] = qb_lf_safe(divisor[k]);
    }
  }
}

// 1 when a block max is a NaN or inf: a gradient value was (without error feedback v = grad).
static int lf_any_nonfinite_max(const uint32_t *m, int64_t nb) {
  uint32_t top = 0;
  for (int64_t k = 0; k < nb; k++) top = m[k] > top ? m[k] : top;
  return top >= 0x7f800000u;
}

// A decode's divisor of block b (Scaling.divisors).
static float lf_divisor(int32_t kind, const void *scales, int64_t b, float tensor) {
  if (kind == QB_LF_FP8) return qb_lf_fp8_divisor(((const float *)scales)[b]);
  if (kind == QB_LF_MX) return qb_lf_mx_divisor(((const uint8_t *)scales)[b]);
  return qb_lf_nvfp4_divisor(((const uint8_t *)scales)[b], tensor);
}

// out[0..cnt) = per_block[value's block] (blocks of `block` values from out[0]).
static void lf_spread(const float *restrict per_block, int64_t cnt, int64_t block,
                      float *restrict out) {
  for (int64_t b = 0, i = 0; i < cnt; b++) {
    const int64_t stop = min64(i + block, cnt);
    const float x = per_block[b];
    for (; i < stop; i++) out[i] = x;
  }
}

// The error carried to the next step: v - (value of the code x its divisor).
static void lf_residual(const float *restrict v, const uint8_t *restrict lv, int64_t m,
                        const float *restrict table, const float *restrict divisor,
                        float *restrict r_out) {
  for (int64_t i = 0; i < m; i++) r_out[i] = v[i] - table[lv[i]] * divisor[i];
}

typedef struct {  // what every chunk of an encode shares
  int32_t kind, element, multiply, stochastic, error_feedback;
  qb_lf_format f;
  float tensor;
  uint32_t key_hash, offset;
  const float *table;
  qb_packer *pk;
} lf_encoder;

// Codes (and residuals) of v[0..m), values start.. of the input, whose divisors are known.
static void lf_encode_run(const lf_encoder *e, const float *v, int64_t m, int64_t start,
                          const float *d, const float *divisor, uint8_t *lv, float *r_out) {
  lf_quantize_any(v, m, d, qb_counter(e->key_hash, e->offset + (uint32_t)start), lv, e->element,
                  e->multiply, e->stochastic);
  if (e->error_feedback) lf_residual(v, lv, m, e->table, divisor, r_out + start);
  packer_put(e->pk, lv, m);
}

// grad[0..n) (+ residual_in with error feedback; NULL: no residual yet, v = grad) -> codes
// (ceil(n * bits / 8) bytes), scales (ceil(n / block): float32 for FP8, E8M0 / E4M3 bytes for
// MX / NVFP4), NVFP4's tensor_scale, and with error feedback residual_out = v - decoded v
// (residual_out may be residual_in: updated in place). Draws (stochastic) are keyed by
// key_hash and the element index offset + i (mod 2^32). block: values per scale (FP8 with one
// scale per tensor: max(n, 1)). Returns QB_NONFINITE when grad holds a NaN or an inf, as the
// reference refuses them: nothing is written to residual_out, the other outputs are undefined.
QB_EXPORT int qb_lowfloat_encode(const float *grad, const float *residual_in, float *residual_out,
                                 int32_t error_feedback, int64_t n, int32_t kind, int32_t element,
                                 int64_t block, int32_t stochastic, uint32_t key_hash,
                                 uint32_t offset, uint8_t *restrict codes, void *restrict scales,
                                 float *restrict tensor_scale) {
  if (!lf_args_ok(n, kind, element, block) || (error_feedback && n > 0 && !residual_out) ||
      (kind == QB_LF_NVFP4 && !tensor_scale))
    return QB_EINVAL;
  if (!error_feedback) residual_in = NULL;
  // With error feedback the residual is written as the encode goes: check grad first.
  if (error_feedback && lf_any_nonfinite(grad, n)) return QB_NONFINITE;
  const int small = block <= QB_LF_CHUNK;  // else one block at a time, in chunks
  const int64_t per_chunk = small ? QB_LF_CHUNK / block * block : QB_LF_CHUNK;
  float vbuf[QB_LF_CHUNK], dbuf[QB_LF_CHUNK], divbuf[QB_LF_CHUNK];
  float bd[QB_LF_CHUNK], bdiv[QB_LF_CHUNK], table[256];
  uint32_t maxes[QB_LF_CHUNK];
  uint8_t lv[QB_LF_CHUNK];
  qb_packer pk = {codes, qb_lf_format_of(element).bits, 0, {0}};
  lf_encoder e = {kind, element, kind == QB_LF_MX, stochastic, error_feedback,
                  qb_lf_format_of(element), 1.0f, key_hash, offset, table, &pk};
  if (error_feedback) lf_table(element, table);
  uint32_t *pre = NULL;  // NVFP4: every block's max, taken first
  if (kind == QB_LF_NVFP4) {
    const int64_t nblocks = (n + block - 1) / block;
    if (nblocks && !(pre = malloc(sizeof(uint32_t) * (size_t)nblocks))) return QB_ENOMEM;
    uint32_t top = 0;
    for (int64_t start = 0; start < n; start += per_chunk) {
      const int64_t cnt = min64(per_chunk, n - start);
      const float *v = grad + start;
      if (residual_in) lf_sum(v, residual_in + start, cnt, vbuf);
      lf_maxes(residual_in ? vbuf : v, cnt, block, pre + start / block);
    }
    for (int64_t b = 0; b < nblocks; b++) top = pre[b] > top ? pre[b] : top;
    if (!error_feedback && top >= 0x7f800000u) {  // the largest block max
      free(pre);
      return QB_NONFINITE;
    }
    e.tensor = qb_lf_nvfp4_tensor(qb_lf_float(top));
    *tensor_scale = e.tensor;
  }
  if (small) {
    for (int64_t start = 0; start < n; start += per_chunk) {
      const int64_t cnt = min64(per_chunk, n - start), b0 = start / block;
      const int64_t nb = (cnt + block - 1) / block;
      const float *v = grad + start;
      if (residual_in) {
        lf_sum(v, residual_in + start, cnt, vbuf);
        v = vbuf;
      }
      const uint32_t *m = maxes;
      if (pre) m = pre + b0;
      else lf_maxes(v, cnt, block, maxes);
      if (!error_feedback && lf_any_nonfinite_max(m, nb)) return QB_NONFINITE;
      lf_block_scales(kind, &e.f, m, nb, e.tensor, scales, b0, bdiv, bd);
      lf_spread(bd, cnt, block, dbuf);
      if (error_feedback) lf_spread(bdiv, cnt, block, divbuf);
      lf_encode_run(&e, v, cnt, start, dbuf, divbuf, lv, residual_out);
    }
  } else {  // FP8 with long blocks, or one scale for the whole tensor
    for (int64_t start = 0, b = 0; start < n; start += block, b++) {
      const int64_t cnt = min64(block, n - start);
      const float *g = grad + start, *r = residual_in ? residual_in + start : NULL;
      uint32_t amax = 0;
      for (int64_t c0 = 0; c0 < cnt; c0 += QB_LF_CHUNK) {
        const int64_t m = min64(QB_LF_CHUNK, cnt - c0);
        if (r) lf_sum(g + c0, r + c0, m, vbuf);
        lf_maxes(r ? vbuf : g + c0, m, m, maxes);
        amax = maxes[0] > amax ? maxes[0] : amax;
      }
      if (!error_feedback && amax >= 0x7f800000u) return QB_NONFINITE;
      lf_block_scales(kind, &e.f, &amax, 1, e.tensor, scales, b, bdiv, bd);
      for (int64_t i = 0; i < QB_LF_CHUNK; i++) dbuf[i] = bd[0], divbuf[i] = bdiv[0];
      for (int64_t c0 = 0; c0 < cnt; c0 += QB_LF_CHUNK) {
        const int64_t m = min64(QB_LF_CHUNK, cnt - c0);
        const float *v = g + c0;
        if (r) {
          lf_sum(v, r + c0, m, vbuf);
          v = vbuf;
        }
        lf_encode_run(&e, v, m, start + c0, dbuf, divbuf, lv, residual_out);
      }
    }
  }
  packer_finish(&pk);
  free(pre);
  return 0;
}

// out[i] = value of code i x its divisor (accumulate: out[i] += that).
QB_INLINE void lf_dequantize(const uint8_t *restrict lv, int64_t m, const float *restrict table,
                             const float *restrict divisor, float *restrict out,
                             const int accumulate) {
  for (int64_t i = 0; i < m; i++) {
    const float v = table[lv[i]] * divisor[i];
    out[i] = accumulate ? out[i] + v : v;
  }
}

// The 6-bit codes of values [c0, c0 + m) of a packed stream (c0 a multiple of 8): four codes
// per 3 bytes, with 24-bit words (unpack_range's generic path is several times slower for 6).
static void lf_unpack6(const uint8_t *restrict packed, int64_t c0, int64_t m,
                       uint8_t *restrict c) {
  const uint8_t *in = packed + c0 / 8 * 6;
  const int64_t quads = m / 4;
  for (int64_t q = 0; q < quads; q++) {
    const uint32_t w = in[3 * q] | (uint32_t)in[3 * q + 1] << 8 | (uint32_t)in[3 * q + 2] << 16;
    c[4 * q] = (uint8_t)(w & 63u);
    c[4 * q + 1] = (uint8_t)((w >> 6) & 63u);
    c[4 * q + 2] = (uint8_t)((w >> 12) & 63u);
    c[4 * q + 3] = (uint8_t)(w >> 18);
  }
  if (m > 4 * quads) {  // the end of the stream: only the bytes holding its codes exist
    uint8_t tmp[3] = {0, 0, 0};
    memcpy(tmp, in + 3 * quads, (size_t)((6 * (m - 4 * quads) + 7) / 8));
    const uint32_t w = tmp[0] | (uint32_t)tmp[1] << 8 | (uint32_t)tmp[2] << 16;
    for (int64_t i = 4 * quads; i < m; i++) c[i] = (uint8_t)((w >> (6 * (i - 4 * quads))) & 63u);
  }
}

// codes + scales (+ NVFP4's tensor_scale) of n values -> out[0..n) (accumulate: out[i] += value,
// as out.add_(values)).
QB_EXPORT int qb_lowfloat_decode(const uint8_t *restrict codes, const void *restrict scales,
                                 const float *restrict tensor_scale, int64_t n, int32_t kind,
                                 int32_t element, int64_t block, float *restrict out,
                                 int32_t accumulate) {
  if (!lf_args_ok(n, kind, element, block) || (kind == QB_LF_NVFP4 && n > 0 && !tensor_scale))
    return QB_EINVAL;
  const int bits = qb_lf_format_of(element).bits;
  const float tensor = kind == QB_LF_NVFP4 && n > 0 ? *tensor_scale : 1.0f;
  float table[256], divbuf[QB_LF_CHUNK];
  lf_table(element, table);
  uint8_t lv[QB_LF_CHUNK];
  for (int64_t c0 = 0; c0 < n; c0 += QB_LF_CHUNK) {
    const int64_t end = min64(c0 + QB_LF_CHUNK, n);
    if (bits == 6) lf_unpack6(codes, c0, end - c0, lv);
    else unpack_range(codes, bits, c0, end - c0, lv);
    for (int64_t i = c0; i < end;) {  // the divisor of each value, block run by block run
      const int64_t b = i / block, stop = min64((b + 1) * block, end);
      const float divisor = lf_divisor(kind, scales, b, tensor);
      for (; i < stop; i++) divbuf[i - c0] = divisor;
    }
    if (accumulate) lf_dequantize(lv, end - c0, table, divbuf, out + c0, 1);
    else lf_dequantize(lv, end - c0, table, divbuf, out + c0, 0);
  }
  return 0;
}

/* -- the integer view of FP8 / MX / NVFP4 (qbench/compress/integer_sum.py: FloatUnits) ----------
 * The integer allreduce's two ends for the float formats, equal to the torch reference: value i
 * of block b becomes the code of x / d_b (d_b the block's shared divisor, 1 where it is not > 0;
 * a true division, as torch's), rounded by qb_lf_encode with the draw of element offset + i, and
 * is sent as that code's units (qb_lf_units); a sum comes back as sum x (d_b x unit / K) in
 * float64, rounded once to float32. Integers are int8, int16, int32 or int64 (width 1, 2, 4, 8).
 * Chunks of QB_LF_CHUNK values: each value's divisor first (block run by block run), so that the
 * long loops need no block index. */
static int units_args_ok(int64_t n, int32_t element, int64_t block, int32_t width) {
  const int element_ok = element >= QB_LF_E4M3 && element <= QB_LF_E2M1;
  const int width_ok = width == 1 || width == 2 || width == 4 || width == 8;
  return n >= 0 && block >= 1 && element_ok && width_ok;
}

// The units of x[i] / d[i], i < m, drawing from counter on; element and stochastic are constants
// at every call.
QB_INLINE void units_of(const float *restrict x, int64_t m, const float *restrict d,
                        uint32_t counter, int32_t *restrict q, const int element,
                        const int stochastic) {
  const qb_lf_format f = qb_lf_format_of(element);
  for (int64_t i = 0; i < m; i++, counter += QB_GOLDEN) {
    const float u = stochastic ? qb_uniform_counter(counter) : 0.0f;
    q[i] = qb_lf_units(qb_lf_encode(x[i] / d[i], f, stochastic, u), f);
  }
}

#define QB_UNITS_CASE(E)                                                                     \
  case (E) * 2: units_of(x, m, d, counter, q, E, 0); break;                                  \
  case (E) * 2 + 1: units_of(x, m, d, counter, q, E, 1); break;

static void units_any(const float *x, int64_t m, const float *d, uint32_t counter, int32_t *q,
                      int element, int stochastic) {
  switch (element * 2 + (stochastic != 0)) {
    QB_UNITS_CASE(QB_LF_E4M3)
    QB_UNITS_CASE(QB_LF_E5M2)
    QB_UNITS_CASE(QB_LF_E3M2)
    QB_UNITS_CASE(QB_LF_E2M3)
    QB_UNITS_CASE(QB_LF_E2M1)
    default: break;  // no other element passes units_args_ok
  }
}

// q[0..m) into the integers at out + at (each fits: |q| <= the format's top).
#define QB_UNITS_STORE(T)                                                                    \
  static void units_store_##T(const int32_t *restrict q, int64_t m, T *restrict out) {       \
    for (int64_t i = 0; i < m; i++) out[i] = (T)q[i];                                        \
  }
QB_UNITS_STORE(int8_t)
QB_UNITS_STORE(int16_t)
QB_UNITS_STORE(int32_t)
QB_UNITS_STORE(int64_t)

// The divisors of nblocks blocks from the ranks' MAX of each block's max |x| (NVFP4: the largest
// of them sets the tensor scale).
QB_EXPORT int qb_lf_units_divisors(const float *restrict amax, int64_t nblocks, int32_t kind,
                                   int32_t element, float *restrict divisors) {
  if (!lf_args_ok(nblocks, kind, element, 1)) return QB_EINVAL;
  const qb_lf_format f = qb_lf_format_of(element);
  uint32_t top = 0;
  if (kind == QB_LF_NVFP4)
    for (int64_t b = 0; b < nblocks; b++) {
      const uint32_t a = qb_lf_abs_bits(amax[b]);
      top = a > top ? a : top;
    }
  const float tensor = kind == QB_LF_NVFP4 ? qb_lf_nvfp4_tensor(qb_lf_float(top)) : 1.0f;
  for (int64_t b = 0; b < nblocks; b++)
    divisors[b] = qb_lf_block_divisor(kind, f, amax[b], tensor);
  return 0;
}

// x[0..n) on the block divisors ceil(n / block) -> their units at out (width bytes each).
QB_EXPORT int qb_lf_units_encode(const float *restrict x, const float *restrict divisors,
                                 int64_t n, int32_t element, int64_t block, int32_t stochastic,
                                 uint32_t key_hash, uint32_t offset, void *restrict out,
                                 int32_t width) {
  if (!units_args_ok(n, element, block, width)) return QB_EINVAL;
  float d[QB_LF_CHUNK];
  int32_t q[QB_LF_CHUNK];
  for (int64_t c0 = 0; c0 < n; c0 += QB_LF_CHUNK) {
    const int64_t end = min64(c0 + QB_LF_CHUNK, n), m = end - c0;
    for (int64_t i = c0; i < end;) {  // each value's divisor, block run by block run
      const int64_t b = i / block, stop = min64((b + 1) * block, end);
      const float safe = qb_lf_safe(divisors[b]);
      for (; i < stop; i++) d[i - c0] = safe;
    }
    units_any(x + c0, m, d, qb_counter(key_hash, offset + (uint32_t)c0), q, element, stochastic);
    if (width == 1) units_store_int8_t(q, m, (int8_t *)out + c0);
    else if (width == 2) units_store_int16_t(q, m, (int16_t *)out + c0);
    else if (width == 4) units_store_int32_t(q, m, (int32_t *)out + c0);
    else units_store_int64_t(q, m, (int64_t *)out + c0);
  }
  return 0;
}

// out[i] = sums[i] x per[i] (qb_lf_units_mean), sums of type T.
#define QB_UNITS_MEAN(T)                                                                     \
  static void units_mean_##T(const T *restrict sums, int64_t m, const double *restrict per,  \
                             float *restrict out) {                                          \
    for (int64_t i = 0; i < m; i++) out[i] = qb_lf_units_mean((int64_t)sums[i], per[i]);     \
  }
QB_UNITS_MEAN(int8_t)
QB_UNITS_MEAN(int16_t)
QB_UNITS_MEAN(int32_t)
QB_UNITS_MEAN(int64_t)

// The sums of `world` ranks' units of n values (width bytes each) on the block divisors
// ceil(n / block) -> their float32 means at out.
QB_EXPORT int qb_lf_units_decode(const void *restrict sums, int32_t width,
                                 const float *restrict divisors, int64_t n, int32_t element,
                                 int64_t block, int32_t world, float *restrict out) {
  if (!units_args_ok(n, element, block, width) || world < 1) return QB_EINVAL;
  const qb_lf_format f = qb_lf_format_of(element);
  double per[QB_LF_CHUNK];
  for (int64_t c0 = 0; c0 < n; c0 += QB_LF_CHUNK) {
    const int64_t end = min64(c0 + QB_LF_CHUNK, n), m = end - c0;
    for (int64_t i = c0; i < end;) {
      const int64_t b = i / block, stop = min64((b + 1) * block, end);
      const double p = qb_lf_unit_mean(divisors[b], f, world);
      for (; i < stop; i++) per[i - c0] = p;
    }
    if (width == 1) units_mean_int8_t((const int8_t *)sums + c0, m, per, out + c0);
    else if (width == 2) units_mean_int16_t((const int16_t *)sums + c0, m, per, out + c0);
    else if (width == 4) units_mean_int32_t((const int32_t *)sums + c0, m, per, out + c0);
    else units_mean_int64_t((const int64_t *)sums + c0, m, per, out + c0);
  }
  return 0;
}
