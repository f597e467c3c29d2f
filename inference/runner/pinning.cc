#include "pinning.h"

#include <dirent.h>
#include <sched.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstdlib>

namespace msrl {

void ThreadFollower::Init() {
  const pid_t self = static_cast<pid_t>(syscall(SYS_gettid));
  DIR *dir = opendir("/proc/self/task");
  if (dir == nullptr) return;
  while (const dirent *e = readdir(dir)) {
    const pid_t tid = static_cast<pid_t>(std::atoi(e->d_name));
    if (tid > 0 && tid != self) tids_.push_back(tid);
  }
  closedir(dir);
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
