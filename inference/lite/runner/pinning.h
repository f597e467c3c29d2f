// CPU pinning of Lite's worker thread to the serving thread's CPU.
//
// Lite 2.0 hands every Predict to its actor thread ("ActorThread_0"), which sleeps again right after the run,
// so one step costs two cross-thread wake-ups (caller -> actor -> caller). Left to the scheduler, the actor
// thread is sometimes woken on the other CPU while a busy process holds it, and the step then waits for that
// CPU, which shows in the tail latency (bench/results/inference_latency.md). Pinning Lite's thread to the CPU the
// serving thread is running on keeps the hand-offs on one CPU (the serving thread is blocked in Predict meanwhile);
// the pin follows the serving thread when the scheduler moves it. Affinity only changes where threads run, never
// what they compute. Used with one Lite thread only: more threads are meant to run in parallel. Once a model's
// graph runs on the serving thread itself (inline_run.h), Lite's thread stays idle and the model's caller stops
// calling Follow: pinning is the path of MSRL_LITE_INLINE=0 and of a Lite where inline runs are off or do not take.
#pragma once

#include <sys/types.h>

#include <vector>

namespace msrl {

// The ids of this process's threads now.
std::vector<pid_t> ThreadIds();

class ThreadFollower {
 public:
  // Call after Model::Build, from the serving thread: every other thread of the process then belongs to Lite.
  void Init();
  // In a process with threads of its own (the in-process library): follow only the threads started since
  // ``before`` was taken (just before Model::Build), i.e. Lite's; called again after another Build, it adds that
  // build's threads.
  void InitSince(const std::vector<pid_t> &before);
  // Before each Predict: one sched_getcpu() (vDSO, no syscall); re-pins only when the serving thread moved.
  void Follow();

 private:
  std::vector<pid_t> tids_;
  int cpu_ = -1;
};

}  // namespace msrl
