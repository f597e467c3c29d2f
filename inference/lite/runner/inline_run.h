// Lite's graph runs on the thread that calls Predict.
//
// Lite 2.0's MindrtExecutor hands every Predict to its actor thread pool and waits for the result: a wake-up of
// the actor thread and one of the caller per step, which on a small policy cost more than the graph itself
// (measured in bench/results/inference_latency.md). Lite has no option to run inline, so this file defines
// mindspore::ActorThreadPool::PushActorToQueue, which the dynamic linker then binds in place of Lite's own
// (the executable's symbols, and those of a library loaded RTLD_GLOBAL before Lite's plugins, come first).
// Inside an InlineScope the pushed actor runs at once on the pushing thread, exactly as Lite's worker would
// run it: same kernels, same order, and the same denormal flushing Lite's workers compute with (FloatMode), so
// outputs are bitwise those of the worker. Outside a scope (Lite's own threads, other pools) and past
// kMaxDepth nested actors, the call goes to Lite's own definition: the queue, as before.
//
// This relies on how one Lite build schedules its actors, so it is on by default only for the Lite versions and
// architectures it was tested on: build_lite.sh decides that from its list of tested builds and compiles the
// answer in (MSRL_LITE_INLINE_DEFAULT, recorded as "inline" in msrl-lite-runner.json). MSRL_LITE_INLINE=1 asks for
// it elsewhere, MSRL_LITE_INLINE=0 turns it off.
#pragma once

#include <cstdint>
#if defined(__x86_64__) || defined(__i386__)
#include <xmmintrin.h>
#endif

namespace msrl {

// The calling thread's float mode (x86: the SSE control register MXCSR; aarch64: FPCR), restored when this goes out
// of scope; `set` bits are switched on meanwhile. Lite's libraries switch the thread that loads them to flush
// denormals (x86: flush-to-zero and denormals-are-zero; aarch64: FPCR.FZ), and Lite's workers compute in that mode:
// kFlushDenormals. Elsewhere a no-op.
class FloatMode {
 public:
#if defined(__x86_64__) || defined(__i386__)
  static constexpr uint32_t kFlushDenormals = 0x8040u;  // FTZ (bit 15) | DAZ (bit 6)
  static uint32_t Get() { return _mm_getcsr(); }
  static void Set(uint32_t mode) { _mm_setcsr(mode); }
#elif defined(__aarch64__)
  static constexpr uint32_t kFlushDenormals = 1u << 24;  // FPCR.FZ
  static uint32_t Get() {
    uint64_t v;
    asm volatile("mrs %0, fpcr" : "=r"(v));
    return static_cast<uint32_t>(v);  // FPCR's upper half is reserved
  }
  static void Set(uint32_t mode) { asm volatile("msr fpcr, %0" : : "r"(static_cast<uint64_t>(mode))); }
#else
  static constexpr uint32_t kFlushDenormals = 0;
  static uint32_t Get() { return 0; }
  static void Set(uint32_t) {}
#endif
  explicit FloatMode(uint32_t set = 0) : saved_(Get()) {
    if (set != 0) Set(saved_ | set);
  }
  ~FloatMode() {
    if (Get() != saved_) Set(saved_);
  }
  FloatMode(const FloatMode &) = delete;
  FloatMode &operator=(const FloatMode &) = delete;

 private:
  uint32_t saved_;
};

// While alive, actors Lite schedules from this thread run on it (see above). Nests; off = a no-op. ran() says
// whether an actor ran inline within this scope (not in a scope nested in it): the evidence, per Predict, that
// the graph ran on the calling thread (false where the dynamic linker kept Lite's own PushActorToQueue).
class InlineScope {
 public:
  explicit InlineScope(bool on);
  ~InlineScope();
  InlineScope(const InlineScope &) = delete;
  InlineScope &operator=(const InlineScope &) = delete;
  bool ran() const { return runs_ > 0; }
  void Count() { ++runs_; }  // called by PushActorToQueue for each actor it runs inline

 private:
  bool on_;
  InlineScope *outer_ = nullptr;
  uint64_t runs_ = 0;
};

// Whether a model runs its graph inline: MSRL_LITE_INLINE=1 yes, =0 no, unset (or anything else) this build's
// default (InlineDefault()).
bool InlineWanted();
// This build's default: on for the Lite builds the inline runs were tested on (build_lite.sh), off elsewhere.
bool InlineDefault();

}  // namespace msrl

extern "C" {
// The calling thread's float mode (FloatMode: MXCSR on x86, FPCR on aarch64), and setting it: Lite's libraries switch
// the thread that loads them to flush denormals, so lite_inprocess.py reads it before loading libmsrl-lite.so and
// puts it back.
uint32_t msrl_lite_float_mode();
void msrl_lite_set_float_mode(uint32_t mode);
}
