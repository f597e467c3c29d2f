#include "pinning.h"

#include <dirent.h>
#include <sched.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>

namespace msrl {

std::vector<pid_t> ThreadIds() {
  std::vector<pid_t> ids;
  DIR *dir = opendir("/proc/self/task");
  if (dir == nullptr) return ids;
  while (const dirent *e = readdir(dir)) {
    const pid_t tid = static_cast<pid_t>(std::atoi(e->d_name));
    if (tid > 0) ids.push_back(tid);
  }
  closedir(dir);
  return ids;
}

void ThreadFollower::Init() { InitSince({static_cast<pid_t>(syscall(SYS_gettid))}); }

void ThreadFollower::InitSince(const std::vector<pid_t> &before) {
  for (pid_t tid : ThreadIds()) {
    const bool known = std::find(tids_.begin(), tids_.end(), tid) != tids_.end();
    if (!known && std::find(before.begin(), before.end(), tid) == before.end()) tids_.push_back(tid);
  }
  cpu_ = -1;  // the next Follow pins them all, the threads just added too
}

void ThreadFollower::Follow() {
  if (tids_.empty()) return;
  const int cpu = sched_getcpu();
  if (cpu < 0 || cpu == cpu_) return;
  cpu_set_t mask;
  CPU_ZERO(&mask);
  CPU_SET(cpu, &mask);
  const pid_t pid = getpid();
  for (pid_t tid : tids_) {
    // tgkill with signal 0 only checks that tid is still a thread of this process (never another's thread).
    if (syscall(SYS_tgkill, pid, tid, 0) != 0 || sched_setaffinity(tid, sizeof mask, &mask) != 0) {
      tids_.clear();  // e.g. a cpuset forbids it: stop trying
      return;
    }
  }
  cpu_ = cpu;
}

}  // namespace msrl
