#include "fork_server.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "protocol.h"

namespace msrl {

namespace {

constexpr uint32_t kOpSpawn = 1;
constexpr uint32_t kReady = 0, kStarted = 1, kExited = 2;
constexpr size_t kMaxPacket = 1 << 20;  // an argv and a whole environment
constexpr int kFds = 3;                 // stdin, stdout, stderr

int g_child_pipe[2] = {-1, -1};  // SIGCHLD -> poll(): the handler writes a byte, the loop reaps

void OnChild(int) {
  const int saved = errno;
  const char byte = 0;
  if (write(g_child_pipe[1], &byte, 1) < 0) {
    // full: a wake-up is pending anyway
  }
  errno = saved;
}

bool Say(int sock, uint32_t kind, int32_t a, int32_t b) {
  const uint32_t packet[4] = {kMagic, kind, static_cast<uint32_t>(a), static_cast<uint32_t>(b)};
  return send(sock, packet, sizeof packet, 0) == static_cast<ssize_t>(sizeof packet);
}

bool ReportExits(int sock) {
  char drain[64];
  while (read(g_child_pipe[0], drain, sizeof drain) > 0) {
  }
  int status = 0;
  pid_t pid;
  while ((pid = waitpid(-1, &status, WNOHANG)) > 0) {
    if (!Say(sock, kExited, pid, status)) return false;
  }
  return true;
}

struct Spawn {
  std::string cwd;
  std::vector<std::string> argv, env;
};

// Parses a spawn packet; false if it is not one.
bool Parse(const char *data, size_t n, Spawn *out) {
  uint32_t head[4];
  if (n < sizeof head) return false;
  std::memcpy(head, data, sizeof head);
  if (head[0] != kMagic || head[1] != kOpSpawn || head[2] == 0) return false;
  size_t pos = sizeof head;
  for (uint64_t i = 0; i <= static_cast<uint64_t>(head[2]) + head[3]; ++i) {  // the cwd, argv, env
    if (pos >= n) return false;
    const void *end = std::memchr(data + pos, '\0', n - pos);
    if (end == nullptr) return false;
    const size_t len = static_cast<const char *>(end) - (data + pos);
    if (i == 0) {
      out->cwd.assign(data + pos, len);
    } else {
      (i <= head[2] ? out->argv : out->env).emplace_back(data + pos, len);
    }
    pos += len + 1;
  }
  return pos == n;
}

[[noreturn]] void BecomeRunner(const pid_t server, int sock, const int fds[kFds], Spawn *spawn, ServeFn serve) {
  signal(SIGCHLD, SIG_DFL);
  close(sock);
  close(g_child_pipe[0]);
  close(g_child_pipe[1]);
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (getppid() != server) _exit(127);  // the server died before the line above: nobody would reap or report us
  for (int i = 0; i < kFds; ++i) dup2(fds[i], i);
  for (int i = 0; i < kFds; ++i) {
    if (fds[i] >= kFds) close(fds[i]);
  }
  setsid();  // its own process group, as a plain start's (the client kills the group)
  if (chdir(spawn->cwd.c_str()) != 0) _exit(126);  // the caller's working directory: relative paths mean the same
  clearenv();
  for (std::string &kv : spawn->env) putenv(kv.data());  // the strings live until _exit
  std::vector<char *> argv;
  for (std::string &arg : spawn->argv) argv.push_back(arg.data());
  argv.push_back(nullptr);
  _exit(serve(static_cast<int>(spawn->argv.size()), argv.data()));
}

}  // namespace

int RunForkServer(int sock, ServeFn serve) {
  signal(SIGPIPE, SIG_IGN);
  if (pipe(g_child_pipe) != 0) return 1;
  for (int fd : g_child_pipe) fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
  struct sigaction sa {};
  sa.sa_handler = OnChild;
  sa.sa_flags = SA_RESTART | SA_NOCLDSTOP;
  sigaction(SIGCHLD, &sa, nullptr);
  const pid_t self = getpid();
  if (!Say(sock, kReady, self, 0)) return 0;

  std::vector<char> buf(kMaxPacket);
  for (;;) {
    pollfd ready[2] = {{sock, POLLIN, 0}, {g_child_pipe[0], POLLIN, 0}};
    if (poll(ready, 2, -1) < 0) {
      if (errno == EINTR) continue;
      return 1;
    }
    if (ready[1].revents != 0 && !ReportExits(sock)) return 0;
    if (ready[0].revents == 0) continue;

    iovec iov{buf.data(), buf.size()};
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * kFds)];
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control;
    msg.msg_controllen = sizeof control;
    const ssize_t n = recvmsg(sock, &msg, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return 0;  // the client closed the socket (or died): the runners it started die with us

    int fds[kFds];
    int nfds = 0;
    for (cmsghdr *c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
      if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
      const int count = static_cast<int>((c->cmsg_len - CMSG_LEN(0)) / sizeof(int));
      const int *got = reinterpret_cast<const int *>(CMSG_DATA(c));
      for (int i = 0; i < count; ++i) {
        if (nfds < kFds) {
          fds[nfds++] = got[i];
        } else {
          close(got[i]);
        }
      }
    }
    Spawn spawn;
    pid_t pid = -EINVAL;
    if (nfds == kFds && (msg.msg_flags & (MSG_TRUNC | MSG_CTRUNC)) == 0 && Parse(buf.data(), n, &spawn)) {
      pid = fork();
      if (pid == 0) BecomeRunner(self, sock, fds, &spawn, serve);
      if (pid < 0) pid = -errno;
    }
    for (int i = 0; i < nfds; ++i) close(fds[i]);
    if (!Say(sock, kStarted, pid, 0)) return 0;
  }
}

}  // namespace msrl
