// A thread block's threads as fibers on the calling OS thread (shim.h's RunBlockThreads), for the
// host emulations of the CUDA kernels (scripts/*_emulate.sh). They were std::threads with
// std::barrier: on CI's two cores, 256 OS threads a block meeting at every barrier and warp
// collective took ~19 min of a CI run (as fibers: ~3.5 min of one core). A fiber runs until it waits at a barrier
// or returns, then the next one runs; a barrier is passed when all its threads have arrived. What
// the emulations check is unchanged (each thread's own order, what a barrier orders); a block
// whose threads wait for each other without a barrier (a spin on a flag) or at a barrier some of
// them never reach is reported as a deadlock instead of hanging.
#pragma once
#include <sys/mman.h>
#include <ucontext.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <type_traits>
#include <vector>

namespace emu {

// A suspended fiber (or the scheduler): on x86-64 its stack pointer, the callee-saved registers
// pushed below it (a switch is a call, so the ABI lets the rest be clobbered; no system call,
// unlike swapcontext's signal mask, which was a third of the run); elsewhere a ucontext_t.
#if defined(__x86_64__)
struct Context {
  void* sp = nullptr;
};
extern "C" void EmuSwitch(void** save_sp, void* load_sp);
asm(R"(
  .text
  .globl EmuSwitch
  .type EmuSwitch, @function
EmuSwitch:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
  .size EmuSwitch, .-EmuSwitch
)");
inline void Switch(Context& save, const Context& load) { EmuSwitch(&save.sp, load.sp); }
// A new fiber's stack as EmuSwitch leaves one: six registers, then `entry` for its ret, then a
// null return address for entry (which never returns), 16-byte aligned as at a call.
inline void Prepare(Context& c, char* stack, size_t bytes, void (*entry)()) {
  auto* top = reinterpret_cast<void**>(reinterpret_cast<uintptr_t>(stack + bytes) & ~uintptr_t{15});
  top[-1] = nullptr;
  top[-2] = reinterpret_cast<void*>(entry);
  for (int i = 3; i <= 8; ++i) top[-i] = nullptr;
  c.sp = top - 8;
}
#else
struct Context {
  ucontext_t uc;
};
inline void Switch(Context& save, const Context& load) { swapcontext(&save.uc, &load.uc); }
// Out of line: getcontext returns twice, which the compiler takes as clobbering the caller's
// loop counter.
[[gnu::noinline]] inline void Prepare(Context& c, char* stack, size_t bytes, void (*entry)()) {
  getcontext(&c.uc);
  c.uc.uc_stack.ss_sp = stack;
  c.uc.uc_stack.ss_size = bytes;
  c.uc.uc_link = nullptr;
  makecontext(&c.uc, entry, 0);
}
#endif

struct FiberRun {
  Context scheduler;
  std::vector<Context> fibers;
  std::vector<char> done;
  unsigned current = 0;
  uint64_t progress = 0;  // arrivals and returns: a sweep with none is a deadlock
  void (*body)(void*, unsigned) = nullptr;
  void* body_arg = nullptr;
};
inline FiberRun* g_run = nullptr;
inline uint64_t g_blocks = 0;  // RunFibers calls so far: shim.h's PerThread starts each block afresh

[[noreturn]] inline void FiberFail(const char* what) {
  std::fprintf(stderr, "emulation: %s\n", what);
  std::abort();
}

// Stacks for up to 1,024 threads, kept across blocks, each below a no-access guard page so an
// overflow faults instead of writing over its neighbour.
constexpr size_t kStackBytes = 256 * 1024, kGuardBytes = 4096;
inline char* StackOf(unsigned i) {
  static char* base = nullptr;
  constexpr unsigned kMax = 1024;
  if (i >= kMax) FiberFail("a block of more than 1,024 threads");
  if (base == nullptr) {
    const size_t bytes = kMax * (kStackBytes + kGuardBytes);
    void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) FiberFail("no memory for the fibers' stacks");
    base = static_cast<char*>(p);
    for (unsigned s = 0; s < kMax; ++s) mprotect(base + s * (kStackBytes + kGuardBytes), kGuardBytes, PROT_NONE);
  }
  return base + i * (kStackBytes + kGuardBytes) + kGuardBytes;
}

inline void FiberEntry() {
  FiberRun& r = *g_run;
  r.body(r.body_arg, r.current);
  r.done[r.current] = 1;
  ++r.progress;
  Switch(r.fibers[r.current], r.scheduler);  // never resumed
  FiberFail("a returned fiber resumed");
}

// The running fiber gives the thread to the next one (back to the scheduler's sweep).
inline void Yield() {
  FiberRun& r = *g_run;
  Switch(r.fibers[r.current], r.scheduler);
}

// Runs body(i) for i = 0 .. n - 1 as fibers, resume(i) before each turn of fiber i (the caller's
// per-thread state: threadIdx). Returns when all have returned.
template <class Resume, class Body>
void RunFibers(unsigned n, Resume&& resume, Body&& body) {
  if (g_run != nullptr) FiberFail("a block launched from inside a block");
  ++g_blocks;
  FiberRun r;
  r.fibers.resize(n);
  r.done.assign(n, 0);
  r.body = [](void* b, unsigned i) { (*static_cast<std::remove_reference_t<Body>*>(b))(i); };
  r.body_arg = static_cast<void*>(&body);
  for (unsigned i = 0; i < n; ++i) Prepare(r.fibers[i], StackOf(i), kStackBytes, FiberEntry);
  g_run = &r;
  for (unsigned left = n; left > 0;) {
    const uint64_t before = r.progress;
    left = 0;
    for (unsigned i = 0; i < n; ++i) {
      if (r.done[i]) continue;
      r.current = i;
      resume(i);
      Switch(r.scheduler, r.fibers[i]);
      left += r.done[i] ? 0 : 1;
    }
    if (left > 0 && r.progress == before) FiberFail("deadlock: the block's threads wait at barriers none can pass");
  }
  g_run = nullptr;
}

// A barrier of `count` threads of the running block (__syncthreads, a warp's collectives): the
// arrival that completes a generation passes on; the others yield until it has.
class Barrier {
 public:
  explicit Barrier(int count) : count_(count) {}
  void arrive_and_wait() {
    if (g_run == nullptr) FiberFail("a barrier outside a block's threads");
    const uint64_t gen = generation_;
    ++g_run->progress;
    if (++arrived_ == count_) {
      arrived_ = 0;
      ++generation_;
      return;
    }
    while (generation_ == gen) Yield();
  }

 private:
  int count_, arrived_ = 0;
  uint64_t generation_ = 0;
};

}  // namespace emu
