// The runtime behind kernels/emulate/cuda_emu.h: CUDA threads as fibers on the calling OS
// thread, blocks one after another, a scheduler that picks which thread runs next. Kernels never
// include this directly; qbench/compress/kernels/cuda/emulate.py drives it through the C entry
// points at the end of cuda_emu_runtime.cpp (docs/cuda-emulation.md).
#pragma once
#include <cstddef>
#include <cstdint>

namespace emu {

struct dim3 {
  unsigned x, y, z;
};

// Set by the scheduler for the thread it runs: blocks run on one OS thread each, so the CUDA
// built-ins are OS-thread locals rewritten at every switch between fibers.
extern thread_local dim3 thread_idx, block_idx, block_dim, grid_dim;
// True in the random schedules, where a thread may be suspended at any yield point.
extern thread_local bool preempt;

void maybe_switch();  // at a yield point: perhaps let another thread of the block run
inline void yield_point() {
  if (preempt) maybe_switch();
}
void sync_threads();
// One lane's part of a warp-wide exchange among the lanes in mask (which must all call it):
// returns the value that lane src_lane passed.
uint64_t warp_exchange(unsigned mask, uint64_t value, unsigned src_lane, const char *what);
[[noreturn]] void fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

// Kernels and dynamic shared arrays register themselves from the generated translation unit.
using Invoker = void (*)(void *const *args);
bool register_kernel(const char *name, const char *signature, const size_t *sizes, int arity,
                     Invoker invoke);
bool register_shared(void *(*address)(), size_t bytes);

}  // namespace emu
