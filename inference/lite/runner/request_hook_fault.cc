// Test binary only: MSRL_LITE_RUNNER_FAULT = hang | crash | kill, or KIND:ROWS (fires only on requests of exactly
// ROWS rows, so a test can send one bad request among good ones). crash aborts (SIGABRT: a defect of the runtime);
// kill sends the runner SIGKILL (what another process or the OOM killer does: not the graph's doing).
// MSRL_LITE_RUNNER_FAULT_ONCE=FILE: the fault fires once across the runner's restarts (the first runner to fire it
// creates FILE; none fires while FILE exists), as a single kill from outside would.
#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <string>

#include "request_hook.h"

namespace msrl {

namespace {

enum class Fault { kNone, kHang, kCrash, kKill };
Fault g_fault = Fault::kNone;
int64_t g_rows = -1;  // -1: every request
const char *g_once = nullptr;  // a marker file: fire only if this runner creates it

void Inject(uint64_t rows) {
  if (g_fault == Fault::kNone || (g_rows >= 0 && rows != static_cast<uint64_t>(g_rows))) return;
  if (g_once != nullptr) {
    const int fd = open(g_once, O_CREAT | O_EXCL | O_WRONLY, 0600);
    if (fd < 0) return;  // fired before
    close(fd);
  }
  if (g_fault == Fault::kHang) {
    for (;;) pause();
  }
  if (g_fault == Fault::kKill) raise(SIGKILL);
  std::abort();
}

}  // namespace

RequestHook MakeRequestHook() {
  const char *spec = std::getenv("MSRL_LITE_RUNNER_FAULT");
  if (spec == nullptr || *spec == '\0') return Inject;
  const std::string s = spec;
  const std::string kind = s.substr(0, s.find(':'));
  if (kind == "hang") g_fault = Fault::kHang;
  if (kind == "crash") g_fault = Fault::kCrash;
  if (kind == "kill") g_fault = Fault::kKill;
  if (s.find(':') != std::string::npos) g_rows = std::atoll(s.c_str() + s.find(':') + 1);
  const char *once = std::getenv("MSRL_LITE_RUNNER_FAULT_ONCE");
  if (once != nullptr && *once != '\0') g_once = once;
  return Inject;
}

}  // namespace msrl
