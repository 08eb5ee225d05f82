// CUDA's device side for a host C++ compiler: kernels/*.cu compile unmodified against this
// header and run on CPU fibers, one per CUDA thread (kernels/emulate/cuda_emu_runtime.cpp).
// qbench/compress/kernels/cuda/emulate.py generates the translation unit: this header, one
// EMU_DYNAMIC_SHARED per `extern __shared__` array, the .cu files, one EMU_KERNEL per kernel.
//
// What is modelled, because GPU bugs live there: threads of a block interleave only where the
// scheduler lets them (at __syncthreads, warp shuffles and the yield points below), barriers
// and shuffles check that every thread they need arrives, dynamic shared memory is filled with
// a schedule-dependent pattern before each block, float arithmetic rounds once per operation
// and returns the GPU's one canonical NaN, and float -> int conversions saturate as on the GPU.
#pragma once
#include <climits>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>
#include <utility>

#include "cuda_emu_runtime.h"

// After every system header: libraries test these macros to pick device code paths.
#define __CUDACC__ 1
#define __CUDA_ARCH__ 800  // the oldest architecture `make kernels` builds for
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
// Blocks run one at a time per OS thread, so OS-thread storage is block storage: a
// block-scope `__shared__ T x[N]` becomes a static shared by the block's fibers, and
// `extern __shared__ T x[]` names the EMU_DYNAMIC_SHARED array of that name.
#define __shared__ thread_local
// Reading threadIdx / blockDim is a yield point: index arithmetic sits next to every
// shared-memory access, so the random schedules can switch threads between a read and a write.
#define threadIdx (::emu::yield_point(), static_cast<const ::emu::dim3 &>(::emu::thread_idx))
#define blockDim (::emu::yield_point(), static_cast<const ::emu::dim3 &>(::emu::block_dim))
#define blockIdx (static_cast<const ::emu::dim3 &>(::emu::block_idx))
#define gridDim (static_cast<const ::emu::dim3 &>(::emu::grid_dim))
#define warpSize 32

#define EMU_SHARED_BYTES 49152  // the dynamic shared memory a launch may ask for without opt-in

namespace emu {
// The one NaN the GPU's float units produce (they carry no payload, unlike x86).
inline float canonical(float r) {
  if (r == r) return r;
  const uint32_t nan = 0x7fffffffu;
  std::memcpy(&r, &nan, sizeof r);
  return r;
}

template <class To, class From>
To bits_as(From v) {
  static_assert(sizeof(To) == sizeof(From), "same size");
  To out;
  std::memcpy(&out, &v, sizeof out);
  return out;
}
}  // namespace emu

// -- arithmetic intrinsics: one IEEE rounding each (the build uses -ffp-contract=off) ----------
inline float __fadd_rn(float a, float b) { return emu::yield_point(), emu::canonical(a + b); }
inline float __fsub_rn(float a, float b) { return emu::yield_point(), emu::canonical(a - b); }
inline float __fmul_rn(float a, float b) { return emu::yield_point(), emu::canonical(a * b); }
inline float __fdiv_rn(float a, float b) { return emu::yield_point(), emu::canonical(a / b); }
inline float __fsqrt_rn(float a) { return emu::yield_point(), emu::canonical(std::sqrt(a)); }
// float64 (the integer view's decode): NaN is left as the host makes it; no test looks at it.
inline double __dmul_rn(double a, double b) { return emu::yield_point(), a * b; }
inline double __ddiv_rn(double a, double b) { return emu::yield_point(), a / b; }

// cvt.rzi.s32.f32: NaN gives 0 and out-of-range values saturate (a host cast is undefined there).
inline int __float2int_rz(float a) {
  emu::yield_point();
  if (a != a) return 0;
  if (a >= 2147483648.0f) return INT_MAX;
  if (a < -2147483648.0f) return INT_MIN;
  return static_cast<int>(a);
}

inline unsigned __float_as_uint(float f) { return emu::bits_as<unsigned>(f); }
inline float __uint_as_float(unsigned u) { return emu::bits_as<float>(u); }
inline int __float_as_int(float f) { return emu::bits_as<int>(f); }
inline float __int_as_float(int i) { return emu::bits_as<float>(i); }
inline int __popc(unsigned x) { return __builtin_popcount(x); }
inline int __popcll(unsigned long long x) { return __builtin_popcountll(x); }
inline int __clz(int x) { return x ? __builtin_clz(static_cast<unsigned>(x)) : 32; }
inline unsigned long long __brevll(unsigned long long x) {
  unsigned long long r = 0;
  for (int i = 0; i < 64; i++) r |= ((x >> i) & 1ull) << (63 - i);
  return r;
}
inline unsigned __brev(unsigned x) { return static_cast<unsigned>(__brevll(x) >> 32); }
template <class T>
T __ldg(const T *p) {
  return *p;
}

// -- vector types: as CUDA aligns them, so a misaligned vector access faults here as there --
struct alignas(8) float2 { float x, y; };
struct alignas(16) float4 { float x, y, z, w; };
struct alignas(8) uint2 { unsigned x, y; };
struct alignas(16) uint4 { unsigned x, y, z, w; };
struct alignas(8) int2 { int x, y; };
struct alignas(16) int4 { int x, y, z, w; };
inline float2 make_float2(float x, float y) { return {x, y}; }
inline float4 make_float4(float x, float y, float z, float w) { return {x, y, z, w}; }
inline uint2 make_uint2(unsigned x, unsigned y) { return {x, y}; }
inline uint4 make_uint4(unsigned x, unsigned y, unsigned z, unsigned w) { return {x, y, z, w}; }
// A vector load or store through a pointer not aligned to its size is a misaligned-address
// fault on the GPU; the host would do it silently. kernels/qsgd_math.h's vector accesses
// (qb_ld_f4 ...) call this first, so the emulator stops where the GPU would.
#define QB_ALIGNED(p, n) ::emu::check_aligned((p), (n), __func__)
namespace emu {
inline void check_aligned(const void *p, size_t n, const char *what) {
  if (reinterpret_cast<uintptr_t>(p) % n) fail("%s: misaligned %zu-byte access", what, n);
}
}  // namespace emu

// -- synchronisation ------------------------------------------------------------------------------
inline void __syncthreads() { emu::sync_threads(); }
inline void __threadfence() { emu::yield_point(); }  // fibers see each other's writes at once
inline void __threadfence_block() { emu::yield_point(); }
inline void __syncwarp(unsigned mask = 0xffffffffu) {
  emu::warp_exchange(mask, 0, emu::thread_idx.x & 31, "__syncwarp");
}

namespace emu {
template <class T>
T shuffle(unsigned mask, T var, unsigned src, int width, const char *what) {
  static_assert(std::is_trivially_copyable_v<T> && sizeof(T) <= 8, "shuffles move <= 8 bytes");
  if (width < 1 || width > 32 || (width & (width - 1))) fail("%s: width %d", what, width);
  uint64_t bits = 0;
  std::memcpy(&bits, &var, sizeof var);
  bits = warp_exchange(mask, bits, src, what);
  T out;
  std::memcpy(&out, &bits, sizeof out);
  return out;
}
inline unsigned lane() { return thread_idx.x & 31; }
// Lanes past the caller's group of `width` are out of reach: the caller gets its own value.
inline unsigned in_group(unsigned src, int width) {
  const unsigned end = (lane() / width + 1) * width;
  return src < end ? src : lane();
}
}  // namespace emu

template <class T>
T __shfl_xor_sync(unsigned mask, T var, int lane_mask, int width = 32) {
  const unsigned src = emu::in_group(emu::lane() ^ static_cast<unsigned>(lane_mask), width);
  return emu::shuffle(mask, var, src, width, "__shfl_xor_sync");
}
template <class T>
T __shfl_down_sync(unsigned mask, T var, unsigned delta, int width = 32) {
  const unsigned src = emu::in_group(emu::lane() + delta, width);
  return emu::shuffle(mask, var, src, width, "__shfl_down_sync");
}
template <class T>
T __shfl_sync(unsigned mask, T var, int src_lane, int width = 32) {
  const unsigned base = emu::lane() / width * width;
  return emu::shuffle(mask, var, base + src_lane % width, width, "__shfl_sync");
}

// -- atomics: a fiber is never switched inside one, so read-modify-write is enough -------------
template <class T>
T atomicAdd(T *p, T v) {
  emu::yield_point();
  const T old = *p;
  if constexpr (std::is_floating_point_v<T>) *p = emu::canonical(old + v);
  else *p = old + v;
  return old;
}
template <class T>
T atomicMax(T *p, T v) {
  emu::yield_point();
  const T old = *p;
  *p = old > v ? old : v;
  return old;
}
template <class T>
T atomicMin(T *p, T v) {
  emu::yield_point();
  const T old = *p;
  *p = old < v ? old : v;
  return old;
}
template <class T>
T atomicExch(T *p, T v) {
  emu::yield_point();
  const T old = *p;
  *p = v;
  return old;
}
template <class T>
T atomicCAS(T *p, T compare, T v) {
  emu::yield_point();
  const T old = *p;
  if (old == compare) *p = v;
  return old;
}

// -- registration, used by the generated translation unit -----------------------------------------
namespace emu {
// Kernel parameter types as the launcher checks them: i/u/f/b + bytes, pointers as *T (c*T when
// the pointee is const), anything else x + bytes.
template <class T>
std::string type_code() {
  if constexpr (std::is_pointer_v<T>) {
    using P = std::remove_pointer_t<T>;
    return (std::is_const_v<P> ? "c*" : "*") + type_code<std::remove_cv_t<P>>();
  } else if constexpr (std::is_void_v<T>) {
    return "v";
  } else if constexpr (std::is_same_v<T, bool>) {
    return "b1";
  } else if constexpr (std::is_floating_point_v<T>) {
    return "f" + std::to_string(sizeof(T));
  } else if constexpr (std::is_integral_v<T>) {
    return (std::is_signed_v<T> ? "i" : "u") + std::to_string(sizeof(T));
  } else {
    return "x" + std::to_string(sizeof(T));
  }
}

template <class... A>
constexpr int arity(void (*)(A...)) {
  return sizeof...(A);
}
template <class... A>
const char *signature(void (*)(A...)) {
  static const std::string joined = [] {
    std::string s;
    ((s += type_code<A>() + ","), ...);
    if (!s.empty()) s.pop_back();
    return s;
  }();
  return joined.c_str();
}
template <class... A>
const size_t *param_sizes(void (*)(A...)) {
  static const size_t sizes[] = {sizeof(A)..., 0};
  return sizes;
}

// Each parameter is copied from the bytes the launcher marshalled, as the driver does.
template <class T>
T load(void *p) {
  T v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
template <class... A, size_t... I>
void apply(void (*fn)(A...), void *const *args, std::index_sequence<I...>) {
  fn(load<A>(args[I])...);
}
template <auto Fn>
void invoke(void *const *args) {
  apply(Fn, args, std::make_index_sequence<arity(Fn)>{});
}
}  // namespace emu

#define EMU_KERNEL(fn)                                                                 \
  static const bool emu_kernel_##fn = ::emu::register_kernel(                          \
      #fn, ::emu::signature(fn), ::emu::param_sizes(fn), ::emu::arity(fn), &::emu::invoke<fn>);

#define EMU_DYNAMIC_SHARED(T, name)                                                    \
  alignas(16) thread_local T name[EMU_SHARED_BYTES / sizeof(T)];                       \
  static const bool emu_shared_##name =                                                \
      ::emu::register_shared([]() -> void * { return name; }, sizeof(name));
