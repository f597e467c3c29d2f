// Lite's graph runs on the thread that calls Predict.
//
// Lite 2.0's MindrtExecutor hands every Predict to its actor thread pool and waits for the result: a wake-up of
// the actor thread and one of the caller per step, which on a small policy cost more than the graph itself
// (a 64x64 MLP, one observation, from Python: p50 43 us with the hand-off, 24 us without, ONNX Runtime 17 us;
// bench/results/inference_latency.md). Lite has no option to run inline, so this file defines
// mindspore::ActorThreadPool::PushActorToQueue, which the dynamic linker then binds in place of Lite's own
// (the executable's symbols, and those of a library loaded RTLD_GLOBAL before Lite's plugins, come first).
// Inside an InlineScope the pushed actor runs at once on the pushing thread, exactly as Lite's worker would
// run it: same kernels, same order, and the same flush-to-zero/denormals-are-zero mode Lite's workers set on
// x86, so outputs are bitwise those of the worker. Outside a scope (Lite's own threads, other pools) and past
// kMaxDepth nested actors, the call goes to Lite's own definition: the queue, as before.
#pragma once

#include <cstdint>
#if defined(__x86_64__) || defined(__i386__)
#include <xmmintrin.h>
#endif

namespace msrl {

// The calling thread's SSE float mode (MXCSR), restored when this goes out of scope; `set` bits are switched on
// meanwhile. Lite's libraries switch the thread that loads them to flush-to-zero/denormals-are-zero, and Lite's
// x86 workers compute in that mode: kFlushDenormals. Elsewhere (e.g. aarch64) a no-op, as Lite sets nothing there.
class FloatMode {
 public:
  static constexpr unsigned kFlushDenormals = 0x8040u;  // FTZ (bit 15) | DAZ (bit 6)
#if defined(__x86_64__) || defined(__i386__)
  explicit FloatMode(unsigned set = 0) : saved_(_mm_getcsr()) { _mm_setcsr(saved_ | set); }
  ~FloatMode() { _mm_setcsr(saved_); }

 private:
  unsigned saved_;
#else
  explicit FloatMode(unsigned = 0) {}
#endif
};

// While alive, actors Lite schedules from this thread run on it (see above). Nests; off = a no-op.
class InlineScope {
 public:
  explicit InlineScope(bool on);
  ~InlineScope();
  InlineScope(const InlineScope &) = delete;
  InlineScope &operator=(const InlineScope &) = delete;

 private:
  bool on_;
};

// MSRL_LITE_INLINE=0 turns inline runs off (Lite's own hand-off to its actor thread); default on.
bool InlineWanted();

}  // namespace msrl

extern "C" {
// The calling thread's SSE float mode (MXCSR; 0 off x86), and setting it: Lite's libraries switch the thread that
// loads them to flush denormals, so lite_inprocess.py reads it before loading libmsrl-lite.so and puts it back.
uint32_t msrl_lite_float_mode();
void msrl_lite_set_float_mode(uint32_t mode);

// How many actors ran inline in this process so far: > 0 once a Predict ran on its caller's thread, 0 where the
// dynamic linker kept Lite's own PushActorToQueue (e.g. the library was not loaded before Lite's plugins).
uint64_t msrl_lite_inline_runs();
}
