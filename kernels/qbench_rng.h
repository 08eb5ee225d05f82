// Counter-based random draws shared by the C (CPU) and CUDA kernels.
// Must match qbench/compress/rng.py bit for bit: see the docstring there.
#pragma once

#if defined(__CUDACC_RTC__)
// NVRTC (CuPy RawModule) has no C library headers; these are the only fixed-width types used
// (tests/compress/kernels/cuda/test_cuda_nvrtc.py compiles every source with NVRTC, no GPU).
typedef signed char int8_t;
typedef unsigned char uint8_t;
typedef short int16_t;
typedef unsigned short uint16_t;
typedef int int32_t;
typedef unsigned int uint32_t;
typedef long long int64_t;
typedef unsigned long long uint64_t;
#else
#include <stdint.h>
#endif

#if defined(__CUDACC__)
#define QB_HD __host__ __device__ __forceinline__
#else
#define QB_HD static inline
#endif

QB_HD uint32_t qb_lowbias32(uint32_t x) {
  x ^= x >> 16;
  x *= 0x7feb352dU;
  x ^= x >> 15;
  x *= 0x846ca68bU;
  x ^= x >> 16;
  return x;
}

QB_HD uint32_t qb_key_hash(uint32_t seed, uint32_t step, uint32_t rank, uint32_t stream) {
  uint32_t h = qb_lowbias32(stream);
  h = qb_lowbias32(h ^ rank);
  h = qb_lowbias32(h ^ step);
  return qb_lowbias32(h ^ seed);
}

#define QB_GOLDEN 0x9E3779B1U

// The hash input of element index idx (mod 2^32, as rng.py masks): idx * GOLDEN + key_hash.
// Consecutive indices differ by GOLDEN, so a loop may add it instead of multiplying.
QB_HD uint32_t qb_counter(uint32_t key_hash, uint32_t idx) { return idx * QB_GOLDEN + key_hash; }

// The draw of a counter value: the top 24 bits of its hash, as a float in [0, 1). They fit a
// signed int, so the conversion is the plain (vectorisable) int -> float one, exact; the scaling
// by 2^-24 is exact too, so no rounding mode or FMA can change a draw.
QB_HD float qb_uniform_counter(uint32_t counter) {
  return (float)(int32_t)(qb_lowbias32(counter) >> 8) * (1.0f / 16777216.0f);
}

// Uniform float in [0, 1) for element index idx taken modulo 2^32.
QB_HD float qb_uniform32(uint32_t key_hash, uint32_t idx) {
  return qb_uniform_counter(qb_counter(key_hash, idx));
}

// Uniform float in [0, 1) for global element index idx.
QB_HD float qb_uniform(uint32_t key_hash, uint64_t idx) {
  return qb_uniform32(key_hash, (uint32_t)idx);
}
