// --fork-server: a runner that has loaded Lite's libraries and forks a serving runner per request, so a runner's
// start skips loading them again. Under qemu-user most of a start (4-5 s on a 2-core Xeon) is qemu translating the
// libraries' static initialisers; a forked child keeps every translation its parent made. The client is
// inference/lite/forks.py.
//
// Protocol, one packet per message on a SOCK_SEQPACKET socket (the fork server's stdin), integers little-endian:
// * client -> server, spawn: u32 magic, u32 op (1), u32 argc, u32 envc, then 1 + argc + envc NUL-terminated strings
//   (the runner's working directory, its argv, argv[0] included, and its whole environment as KEY=VALUE), with three
//   file descriptors attached (SCM_RIGHTS): the runner's stdin, stdout and stderr.
// * server -> client: u32 magic, u32 kind, i32 a, i32 b. kind 0 ready (a: the server's pid) once, when it starts;
//   kind 1 started (a: the runner's pid, or -errno if it could not fork), one per spawn, in order; kind 2 exited
//   (a: pid, b: the wait status as waitpid gives it), when a runner ends.
//
// A forked runner is the runner a plain start gives, in its own session, with the working directory and environment
// it was sent (what Lite reads while its libraries load, e.g. GLOG_v, is the server's: the client starts one server
// per such environment), and dies with the server (PR_SET_PDEATHSIG). The server ends when its socket closes.
#pragma once

namespace msrl {

using ServeFn = int (*)(int argc, char **argv);

// Serves spawn requests on `sock` until it closes; each child runs serve(argc, argv) and exits with its result.
int RunForkServer(int sock, ServeFn serve);

}  // namespace msrl
