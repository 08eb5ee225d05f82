// Runs a kernel launch the way a GPU may: every block of the grid, every thread of a block as
// a fiber with its own stack, so that __syncthreads, warp shuffles and shared memory behave.
// One OS thread runs the blocks one after another; a scheduler picks which fiber runs next.
// The schedule number chooses the policy:
//   0: the lowest-numbered thread that can run, until it waits; blocks in order;
//   1: the highest-numbered one; blocks from the last;
//   2+: seeded random: a random thread at every switch, switches at yield points too (reads of
//       threadIdx / blockDim, float intrinsics, atomics), blocks shuffled.
// A race-free kernel writes the same bytes under every schedule; the race check compares them
// (qbench/compress/kernels/cuda/racecheck.py, QBENCH_CUDA=racecheck). Misuse a GPU would hang on
// or leave undefined (a barrier not every thread reaches, a shuffle mask naming absent lanes, too
// many threads or too much shared memory) stops the launch with a message instead.
#include "cuda_emu_runtime.h"
#include "cuda_emu_fiber.h"

#include <algorithm>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#define EMU_EXPORT extern "C" __attribute__((visibility("default")))

namespace emu {

thread_local dim3 thread_idx, block_idx, block_dim, grid_dim;
thread_local bool preempt = false;

namespace {

constexpr unsigned kMaxThreads = 1024;      // per block, as on every GPU since sm_20
constexpr uint64_t kMaxShared = 48 << 10;   // dynamic shared memory without an opt-in attribute
constexpr unsigned kSwitchOdds = 4;         // random schedules switch at 1 in 4 yield points

struct Kernel {
  const char *name, *signature;
  const size_t *sizes;
  int arity;
  Invoker invoke;
};
std::vector<Kernel> &kernels() {
  static std::vector<Kernel> all;
  return all;
}

struct SharedArray {
  void *(*address)();  // of the calling OS thread's copy
  size_t bytes;
};
std::vector<SharedArray> &shared_arrays() {
  static std::vector<SharedArray> all;
  return all;
}

// splitmix64: small, seedable, the same sequence on every platform.
struct Rng {
  uint64_t state;
  uint64_t next() {
    uint64_t z = (state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  unsigned below(unsigned n) { return static_cast<unsigned>(next() % n); }
};

enum class State : unsigned char { ready, barrier, warp, done };

struct Fiber {
  State state;
  uint64_t value, result;  // of a warp exchange
  unsigned src;
  const char *what;
};

struct Warp {
  unsigned arrived, mask;
};


thread_local fiber::Pool pool;  // this OS thread's fibers

struct Run {
  const Kernel *kernel;
  void *const *args;
  uint64_t schedule;
  Rng rng;
  unsigned n;  // threads per block
  std::vector<Fiber> fibers;
  std::vector<Warp> warps;
  fiber::Context scheduler;
  unsigned current, at_barrier, done;
  unsigned cursor;  // where pick() starts looking: threads below (above, reversed) wait
  uint64_t smem;
  unsigned char poison;
  std::string error;
};
thread_local Run *active = nullptr;
thread_local std::string last_error;

std::string vformat(const char *fmt, va_list ap) {
  char buf[1024];
  vsnprintf(buf, sizeof buf, fmt, ap);
  return buf;
}

std::string format(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
std::string format(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  std::string s = vformat(fmt, ap);
  va_end(ap);
  return s;
}

Fiber &running() { return active->fibers[active->current]; }

void switch_out() { fiber::switch_context(*pool.get(active->current), active->scheduler); }

void fiber_main() {
  Run &r = *active;
  r.kernel->invoke(r.args);
  running().state = State::done;
  r.done++;
  switch_out();  // never resumed: the next block starts this context afresh
  std::abort();
}

// The next fiber to run, or -1 when none can run: the lowest-numbered ready thread (schedule
// 0), the highest (1), or a random one (2+).
int pick(Run &r) {
  const unsigned n = r.n;
  const unsigned start = r.schedule >= 2 ? r.rng.below(n) : r.cursor;
  for (unsigned k = 0; k < n; k++) {
    const unsigned i = r.schedule == 1 ? (start + n - k) % n : (start + k) % n;
    if (r.fibers[i].state == State::ready) return static_cast<int>(r.cursor = i);
  }
  return -1;
}

// Threads were released by a barrier or a warp exchange: look for the next from the start.
void rewind(Run &r) { r.cursor = r.schedule == 1 ? r.n - 1 : 0; }

std::string deadlock(const Run &r) {
  unsigned warp_waiting = 0, first = r.n;
  for (unsigned i = 0; i < r.n; i++) {
    if (r.fibers[i].state != State::warp) continue;
    warp_waiting++;
    first = std::min(first, i);
  }
  std::string s = format("deadlock: %u of %u threads wait at __syncthreads, %u returned",
                         r.at_barrier, r.n, r.done);
  if (warp_waiting) {
    const Warp &w = r.warps[first / 32];
    s += format(", %u wait in %s (warp %u: lanes 0x%08x of mask 0x%08x arrived)", warp_waiting,
                r.fibers[first].what, first / 32, w.arrived, w.mask);
  }
  return s + ": a barrier or warp operation that not every thread it names reaches";
}

// Fill every dynamic shared array with the schedule's byte: a GPU's shared memory starts with
// whatever the last block left, so a read before a write must not decide the result.
void poison_shared(const Run &r) {
  for (const SharedArray &a : shared_arrays()) std::memset(a.address(), r.poison, a.bytes);
}

// Bytes past the launch's dynamic shared memory must still hold the poison.
std::string check_shared(const Run &r) {
  for (const SharedArray &a : shared_arrays()) {
    const unsigned char *p = static_cast<const unsigned char *>(a.address());
    for (size_t i = r.smem; i < a.bytes; i++) {
      if (p[i] != r.poison)
        return format("wrote shared memory at byte %zu, past the %llu bytes of dynamic shared "
                      "memory the launch asked for", i, static_cast<unsigned long long>(r.smem));
    }
  }
  return "";
}

std::string start_fibers(Run &r) {
  for (unsigned i = 0; i < r.n; i++) {
    r.fibers[i].state = State::ready;
    fiber::Context *c = pool.get(i);
    if (!c) return format("cannot map a stack for thread %u", i);
    fiber::start_context(*c, pool.stack(i), fiber_main);
  }
  return "";
}

std::string run_block(Run &r, unsigned b) {
  block_idx = {b, 0, 0};
  r.current = 0;
  rewind(r);
  r.at_barrier = r.done = 0;
  std::fill(r.warps.begin(), r.warps.end(), Warp{0, 0});
  std::string error = start_fibers(r);
  if (!error.empty()) return error;
  poison_shared(r);
  preempt = r.schedule >= 2;
  while (r.done < r.n && r.error.empty()) {
    const int next = pick(r);
    if (next < 0) {
      r.error = deadlock(r);
      break;
    }
    r.current = static_cast<unsigned>(next);
    thread_idx = {r.current, 0, 0};
    fiber::switch_context(r.scheduler, *pool.get(r.current));
  }
  preempt = false;
  return r.error.empty() ? check_shared(r) : r.error;
}

std::vector<unsigned> block_order(Run &r, unsigned grid) {
  std::vector<unsigned> order(grid);
  for (unsigned b = 0; b < grid; b++) order[b] = r.schedule == 1 ? grid - 1 - b : b;
  if (r.schedule >= 2)
    for (unsigned b = grid; b > 1; b--) std::swap(order[b - 1], order[r.rng.below(b)]);
  return order;
}

std::string check_launch(const Kernel &k, uint32_t grid, uint32_t block, uint64_t smem,
                         int nargs, const uint64_t *sizes) {
  if (block < 1 || block > kMaxThreads)
    return format("invalid configuration: %u threads per block (1..%u)", block, kMaxThreads);
  if (grid < 1) return "invalid configuration: a grid of 0 blocks";
  if (smem > kMaxShared)
    return format("%llu bytes of dynamic shared memory, more than the %llu a launch gets "
                  "without cudaFuncSetAttribute", static_cast<unsigned long long>(smem),
                  static_cast<unsigned long long>(kMaxShared));
  if (nargs != k.arity) return format("%d arguments for %d parameters", nargs, k.arity);
  for (int i = 0; i < nargs; i++) {
    if (sizes[i] != k.sizes[i])
      return format("argument %d has %llu bytes, the parameter %zu", i,
                    static_cast<unsigned long long>(sizes[i]), k.sizes[i]);
  }
  return "";
}

const Kernel *find(const char *name) {
  for (const Kernel &k : kernels())
    if (std::strcmp(k.name, name) == 0) return &k;
  return nullptr;
}

std::string launch(const Kernel &k, uint32_t grid, uint32_t block, uint64_t smem,
                   void *const *args, uint64_t schedule) {
  Run r{};
  r.kernel = &k;
  r.args = args;
  r.schedule = schedule;
  r.rng = Rng{schedule * 0x2545f4914f6cdd1dull};
  r.n = block;
  r.fibers.resize(block);
  r.warps.resize((block + 31) / 32);
  r.smem = smem;
  r.poison = schedule == 0 ? 0xff : schedule == 1 ? 0x00 : static_cast<unsigned char>(r.rng.next());
  grid_dim = {grid, 1, 1};
  block_dim = {block, 1, 1};
  active = &r;
  std::string error;
  for (unsigned b : block_order(r, grid)) {
    error = run_block(r, b);
    if (!error.empty()) {
      error = format("block %u, thread %u: ", b, r.current) + error;
      break;
    }
  }
  active = nullptr;
  return error;
}

}  // namespace

void maybe_switch() {
  if (active && active->rng.below(kSwitchOdds) == 0) switch_out();
}

void fail(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  std::string message = vformat(fmt, ap);
  va_end(ap);
  if (!active) {  // not inside a launch: nothing to unwind to
    std::fprintf(stderr, "cuda emulator: %s\n", message.c_str());
    std::abort();
  }
  if (active->error.empty()) active->error = message;
  switch_out();  // the scheduler stops the launch; this fiber is never resumed
  std::abort();
}

void sync_threads() {
  Run &r = *active;
  running().state = State::barrier;
  if (++r.at_barrier == r.n) {  // the last thread of the block arrived: release them all
    for (Fiber &f : r.fibers) f.state = State::ready;
    r.at_barrier = 0;
    rewind(r);
  }
  switch_out();
}

uint64_t warp_exchange(unsigned mask, uint64_t value, unsigned src_lane, const char *what) {
  Run &r = *active;
  const unsigned lane = r.current & 31, base = r.current - lane;
  const unsigned lanes = std::min(32u, r.n - base);
  const unsigned present = lanes == 32 ? ~0u : (1u << lanes) - 1u;
  if (!(mask >> lane & 1u)) fail("%s: lane %u is not in its mask 0x%08x", what, lane, mask);
  if (mask & ~present)
    fail("%s: mask 0x%08x names lanes that do not exist (this warp has %u threads)", what, mask,
         lanes);
  Warp &w = r.warps[base / 32];
  if (w.arrived && w.mask != mask)
    fail("%s: lanes of one warp pass different masks (0x%08x, 0x%08x)", what, w.mask, mask);
  Fiber &me = running();
  me.value = value;
  me.src = src_lane;
  me.what = what;
  me.state = State::warp;
  w.mask = mask;
  w.arrived |= 1u << lane;
  if (w.arrived == mask) {  // the last lane named: every lane gets its value at once
    for (unsigned l = 0; l < 32; l++) {
      if (!(mask >> l & 1u)) continue;
      Fiber &f = r.fibers[base + l];
      if (f.src >= 32 || !(mask >> f.src & 1u))
        fail("%s: lane %u reads lane %u, which is not in the mask 0x%08x", what, l, f.src, mask);
      f.result = r.fibers[base + f.src].value;
      f.state = State::ready;
    }
    w.arrived = 0;
    rewind(r);
  }
  switch_out();
  return me.result;
}

bool register_kernel(const char *name, const char *signature, const size_t *sizes, int arity,
                     Invoker invoke) {
  kernels().push_back({name, signature, sizes, arity, invoke});
  return true;
}

bool register_shared(void *(*address)(), size_t bytes) {
  shared_arrays().push_back({address, bytes});
  return true;
}

}  // namespace emu

// -- the C entry points qbench/compress/kernels/cuda/emulate.py loads with ctypes ----------------
EMU_EXPORT int emu_kernel_count() { return static_cast<int>(emu::kernels().size()); }

EMU_EXPORT const char *emu_kernel_name(int i) { return emu::kernels().at(i).name; }

EMU_EXPORT const char *emu_kernel_signature(int i) { return emu::kernels().at(i).signature; }

EMU_EXPORT const char *emu_error() { return emu::last_error.c_str(); }

// args[i] points to the bytes of argument i (sizes[i] of them), as cuLaunchKernel's
// kernelParams. Returns 0, or 1 with the reason in emu_error().
EMU_EXPORT int emu_launch(const char *name, uint32_t grid, uint32_t block, uint64_t smem,
                          int nargs, void *const *args, const uint64_t *sizes,
                          uint64_t schedule) {
  const emu::Kernel *k = emu::find(name);
  std::string error = k ? emu::check_launch(*k, grid, block, smem, nargs, sizes)
                        : std::string("no kernel of that name in the emulated library");
  if (error.empty()) error = emu::launch(*k, grid, block, smem, args, schedule);
  emu::last_error = error.empty() ? "" : std::string(name) + ": " + error;
  return error.empty() ? 0 : 1;
}

#ifdef EMU_COVERAGE
extern "C" void __gcov_dump(void);
#endif

// Writes the gcov counters now (a coverage build, -DEMU_COVERAGE; otherwise does nothing).
EMU_EXPORT void emu_coverage_dump() {
#ifdef EMU_COVERAGE
  __gcov_dump();
#endif
}
