// Fibers for kernels/emulate/cuda_emu_runtime.cpp: a stack and saved registers per CUDA
// thread, and the switch between them. Included by the runtime only.
#pragma once
#include <sys/mman.h>
#include <ucontext.h>

#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

namespace emu {
namespace fiber {

constexpr size_t kStackBytes = 256 << 10;  // per fiber; kernels keep little on the stack

// On x86-64 a switch saves the callee-saved registers on the old stack and loads them from the
// new one, without the signal-mask system call of swapcontext (a launch switches millions of
// times); elsewhere, or with -DEMU_UCONTEXT, ucontext does it.
#if defined(__x86_64__) && !defined(EMU_UCONTEXT)
struct Context {
  void *sp;
};
extern "C" void emu_switch_stack(void **save_sp, void *load_sp);
asm(R"(
  .text
  .p2align 4
  .type emu_switch_stack, @function
emu_switch_stack:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  subq $8, %rsp
  stmxcsr (%rsp)
  fnstcw 4(%rsp)
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  ldmxcsr (%rsp)
  fldcw 4(%rsp)
  addq $8, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
  .size emu_switch_stack, .-emu_switch_stack
)");

inline void switch_context(Context &from, Context &to) { emu_switch_stack(&from.sp, to.sp); }

// A frame emu_switch_stack "returns" from into entry, 16-byte aligned as after a call.
inline void start_context(Context &c, char *stack, void (*entry)()) {
  auto *top = reinterpret_cast<uint64_t *>(
      reinterpret_cast<uintptr_t>(stack + kStackBytes) & ~static_cast<uintptr_t>(15));
  uint32_t mxcsr;
  uint16_t fpucw;
  asm volatile("stmxcsr %0; fnstcw %1" : "=m"(mxcsr), "=m"(fpucw));
  uint64_t *sp = top - 2;  // top[-1]: entry's (never used) return address
  top[-1] = 0;
  top[-2] = reinterpret_cast<uint64_t>(entry);
  sp -= 7;  // rbp, rbx, r12..r15: zero; then mxcsr and the x87 control word
  std::memset(sp, 0, 7 * sizeof(uint64_t));
  std::memcpy(sp, &mxcsr, sizeof mxcsr);
  std::memcpy(reinterpret_cast<char *>(sp) + 4, &fpucw, sizeof fpucw);
  c.sp = sp;
}
#else
struct Context {
  ucontext_t uc;
};

inline void switch_context(Context &from, Context &to) { swapcontext(&from.uc, &to.uc); }

inline void start_context(Context &c, char *stack, void (*entry)()) {
  c.uc.uc_stack.ss_sp = stack;
  c.uc.uc_stack.ss_size = kStackBytes;
  c.uc.uc_link = nullptr;  // entry never returns
  makecontext(&c.uc, entry, 0);
}
#endif

// getcontext returns twice in general; kept out of line so that no caller's locals need to
// survive that (the context is only ever entered through start_context).
__attribute__((noinline)) inline bool init_context(Context &c) {
#if defined(__x86_64__) && !defined(EMU_UCONTEXT)
  c.sp = nullptr;
  return true;
#else
  return getcontext(&c.uc) == 0;
#endif
}

// The fibers of this OS thread: a context and a stack each, made once and reused by every block,
// with a guard page below each stack so that an overflow faults instead of corrupting another.
class Pool {
 public:
  ~Pool() {
    for (auto &slot : slots_) munmap(slot->stack - kGuard, kStackBytes + kGuard);
  }
  // The context of fiber i, or nullptr when no stack can be mapped.
  Context *get(size_t i) {
    while (slots_.size() <= i) {
      void *p = mmap(nullptr, kStackBytes + kGuard, PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
      if (p == MAP_FAILED) return nullptr;
      mprotect(p, kGuard, PROT_NONE);
      auto slot = std::make_unique<Slot>();  // not moved again: a ucontext points into itself
      slot->stack = static_cast<char *>(p) + kGuard;
      if (!init_context(slot->context)) {
        munmap(p, kStackBytes + kGuard);
        return nullptr;
      }
      slots_.push_back(std::move(slot));
    }
    return &slots_[i]->context;
  }
  char *stack(size_t i) { return slots_[i]->stack; }

 private:
  struct Slot {
    Context context;
    char *stack;
  };
  static constexpr size_t kGuard = 4096;
  std::vector<std::unique_ptr<Slot>> slots_;
};

}  // namespace fiber
}  // namespace emu
