"""Runners forked from one that has loaded Lite (``msrl-lite-runner --fork-server``, ``runner/fork_server.h``).

Under qemu-user a runner's start is mostly qemu translating the static initialisers of Lite's libraries (4-5 s of a
5 s start on a 2-core Xeon; the runtime library pulls in Lite's converter and OpenCV), and a verify starts one runner
per graph, plus one for a localisation's tap request. A forked child keeps every translation its parent made, so
each start after the first costs only its model's load. ``LiteRunner`` starts its runners here under a launcher
(``inference.runtimes.lite_aarch64``), and where its caller starts many: verify's and the deploy check's Lite runtimes
and precision plans (natively a start takes ~0.3 s, a fork ~0.03 s). A deploy ``Policy``'s one runner is a plain
process: no second process with Lite loaded on the device.

A forked runner is the runner a plain start gives: its own session, its own stdin, stdout and stderr, the caller's
working directory, the environment it was given. What Lite reads while its libraries load (``GLOG_v`` and the like)
is the fork server's, so there is one fork server per such environment. ``ForkedRunner`` has the part of
``subprocess.Popen`` the client uses (``pid``, ``poll``, ``wait``, ``returncode``, ``stdin``, ``stdout``); its exit
status comes from the fork server, which reaps it. The server takes requests only on the socket pair its own process
holds: nothing else on the machine can ask it to start a runner.
Where a fork server cannot start or answer, the runner starts as a plain process (logged): the fork server saves
time, nothing depends on it. ``MSRL_LITE_FORK_SERVER=0`` starts every runner as a plain process.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import select
import signal
import socket
import struct
import subprocess
import tempfile
import threading
import time
from collections.abc import Sequence
from typing import IO

from inference.lite.protocol import MAGIC, one_line

OP_SPAWN = 1
READY, STARTED, EXITED = 0, 1, 2
ANSWER = struct.Struct("<IIii")  # magic, kind, a, b
SPAWN_HEAD = struct.Struct("<IIII")  # magic, op, argc, envc
MAX_PACKET = 64 * 1024  # an argv and an environment; well within a datagram socket's send buffer
# Read while Lite's libraries load (glog's flags, Lite's and MindSpore's switches, the loader's): a fork server serves
# only runners whose environment agrees with its own on these.
LOAD_TIME_PREFIXES = ("GLOG_", "MSLITE_", "MS_", "LD_", "QEMU_")


class ForkServerError(OSError):
    """The fork server did not start, died or did not answer: the runner starts as a plain process instead."""


class ForkServerRefused(ForkServerError):
    """A fork server that would not start earlier in this process (said then): the runner starts plain at once."""


def wanted(launcher: Sequence[str], asked: bool | None = None) -> bool:
    """Whether a runner starts from a fork server: as ``asked``, by default under a launcher (emulation); never with
    ``MSRL_LITE_FORK_SERVER=0``."""
    if os.environ.get("MSRL_LITE_FORK_SERVER", "1") == "0":
        return False
    return bool(launcher) if asked is None else asked


class ForkServer:
    """One ``--fork-server`` process and the exit statuses it reported; thread-safe."""

    def __init__(self, cmd: Sequence[str], env: dict[str, str], timeout: float) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self._log: IO[bytes] = tempfile.TemporaryFile(prefix="msrl-lite-fork-server-")  # noqa: SIM115 - see close
        try:
            self._proc = subprocess.Popen([*cmd, "--fork-server"], stdin=theirs, stdout=self._log, stderr=self._log,
                                          env=env, start_new_session=True)  # fmt: skip
        except OSError as exc:
            ours.close()
            self._log.close()
            raise ForkServerError(f"fork server did not start: {exc}") from None
        finally:
            theirs.close()
        self._sock = ours
        self._lock = threading.Lock()
        self._exits: dict[int, int] = {}
        self._started: list[int] = []
        self.owner = os.getpid()  # a forked Python process starts its own
        self.dead = False
        self._ready = False
        deadline = time.monotonic() + timeout
        with self._lock:
            while not self._ready and not self.dead and time.monotonic() < deadline:
                self._read(deadline - time.monotonic())
        if not self._ready:
            why = f"{'died' if self.dead else f'gave no answer within {timeout:g} s'} while starting: {self.log_tail()}"
            self.close()
            raise ForkServerError(f"fork server {why}")

    def spawn(self, argv: Sequence[str], env: dict[str, str], fds: tuple[int, int, int], timeout: float) -> int:
        """Forks a runner with ``argv`` (argv[0] the runner), ``env``, this process's working directory and ``fds`` as
        its stdin, stdout, stderr; returns its pid. ForkServerError if the server cannot."""
        strings = [os.getcwd(), *argv, *(f"{k}={v}" for k, v in env.items())]  # a relative path means the same
        packet = SPAWN_HEAD.pack(MAGIC, OP_SPAWN, len(argv), len(env)) + b"".join(
            os.fsencode(s) + b"\0" for s in strings
        )
        if len(packet) > MAX_PACKET:
            raise ForkServerError(f"argv and environment take {len(packet)} bytes, over a spawn packet's {MAX_PACKET}")
        with self._lock:
            if self.dead:
                raise ForkServerError("fork server is gone")
            try:
                socket.send_fds(self._sock, [packet], list(fds))
            except OSError as exc:
                self._died()
                raise ForkServerError(f"fork server is gone: {exc}") from None
            deadline = time.monotonic() + timeout
            while not self._started and not self.dead and time.monotonic() < deadline:
                self._read(deadline - time.monotonic())
            if not self._started:
                why = self.log_tail()
                if not self.dead:
                    self._close_locked()
                raise ForkServerError(f"fork server did not fork a runner: {why}")
            pid = self._started.pop(0)
        if pid < 0:
            raise ForkServerError(f"fork server could not fork a runner: {os.strerror(-pid)}")
        return pid

    def exit_status(self, pid: int, timeout: float = 0.0) -> int | None:
        """``pid``'s wait status once the server reported it (waiting up to ``timeout``), handed out once; None while
        it runs."""
        deadline = time.monotonic() + timeout
        while True:
            with self._lock:
                if pid not in self._exits and not self.dead:
                    self._read(min(0.05, max(0.0, deadline - time.monotonic())))
                if pid in self._exits:
                    return self._exits.pop(pid)
                if self.dead:
                    return None
            if time.monotonic() >= deadline:
                return None

    def _read(self, timeout: float) -> None:
        """Reads what the server said within ``timeout`` (the lock held)."""
        if self.dead or not select.select([self._sock], [], [], max(0.0, timeout))[0]:
            return
        while True:
            try:
                data = self._sock.recv(ANSWER.size, socket.MSG_DONTWAIT)
            except BlockingIOError:
                return
            except OSError:
                data = b""
            if len(data) != ANSWER.size:
                self._died()
                return
            magic, kind, a, b = ANSWER.unpack(data)
            if magic != MAGIC:
                self._died()
                return
            if kind == READY:
                self._ready = True
            elif kind == STARTED:
                self._started.append(a)
            elif kind == EXITED:
                self._exits[a] = b

    def _died(self) -> None:
        """The server closed its socket or broke the protocol: it ends (an EOF ends it) and is waited for."""
        self.dead = True
        with contextlib.suppress(OSError):
            self._sock.close()
        try:
            self._proc.wait(timeout=2.0)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self._proc.pid, signal.SIGKILL)
            self._proc.wait()

    def log_tail(self) -> str:
        """The last lines the server wrote (Lite's log while loading), on one line."""
        if self._log.closed:
            return ""
        self._log.seek(0, os.SEEK_END)
        self._log.seek(max(0, self._log.tell() - 2048))
        return one_line("\n".join(self._log.read().decode(errors="replace").splitlines()[-5:]))

    def close(self) -> None:
        with self._lock:
            self._close_locked()

    def _close_locked(self) -> None:
        """Ends the server (its runners die with it, PR_SET_PDEATHSIG)."""
        if not self.dead:
            self._died()
        self._log.close()


class ForkedRunner:
    """A runner a fork server started: what ``LiteRunner`` uses of ``subprocess.Popen``."""

    def __init__(self, server: ForkServer, pid: int, stdin: IO[bytes], stdout: IO[bytes]) -> None:
        self.server, self.pid, self.stdin, self.stdout = server, pid, stdin, stdout
        self.returncode: int | None = None

    def poll(self) -> int | None:
        return self.returncode if self.returncode is not None else self._collect(0.0)

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.returncode is None:
            left = 0.5 if deadline is None else deadline - time.monotonic()
            if self._collect(max(0.0, min(left, 0.5))) is None and deadline is not None and left <= 0:
                raise subprocess.TimeoutExpired([str(self.pid)], timeout or 0.0)
        return self.returncode

    def _collect(self, timeout: float) -> int | None:
        status = self.server.exit_status(self.pid, timeout)
        if status is not None:
            self.returncode = os.waitstatus_to_exitcode(status)
        elif self.server.dead and not _exists(self.pid):
            # Its fork server is gone, and it with it (PR_SET_PDEATHSIG): its status went to whoever reaped it.
            self.returncode = -signal.SIGKILL
        return self.returncode


def _exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # there, another user's
        pass
    return True


_servers: dict[tuple[object, ...], ForkServer] = {}
_refused: dict[tuple[object, ...], str] = {}  # a server that would not start is not asked again (a runner build
_servers_lock = threading.Lock()  # without --fork-server would pay a failed start before every plain one)


def spawn(launcher: Sequence[str], argv: Sequence[str], env: dict[str, str], stderr: IO[bytes],
          timeout: float) -> ForkedRunner:  # fmt: skip
    """Forks the runner ``argv`` (argv[0] the runner) from the fork server for ``launcher``, that runner and ``env``'s
    load-time variables, starting that server if needed; ``stderr`` is the runner's stderr. ForkServerError if the
    server cannot: the caller starts the runner as a plain process."""
    exe = argv[0]
    st = os.stat(exe)
    load_env = tuple(sorted((k, v) for k, v in env.items() if k.startswith(LOAD_TIME_PREFIXES)))
    key = (tuple(launcher), exe, st.st_size, st.st_mtime_ns, load_env)
    deadline = time.monotonic() + timeout
    with _servers_lock:
        if key in _refused:
            raise ForkServerRefused(_refused[key])
        server = _servers.get(key)
        if server is None or server.dead or server.owner != os.getpid():
            if server is not None and server.dead:
                server.close()  # its log file; the process was waited for when it died
            try:
                server = _servers[key] = ForkServer([*launcher, exe], env, timeout)
            except ForkServerError as exc:
                _refused[key] = str(exc)
                raise
    stdin_r, stdin_w = os.pipe()
    stdout_r, stdout_w = os.pipe()
    try:
        pid = server.spawn(argv, env, (stdin_r, stdout_w, stderr.fileno()), max(1.0, deadline - time.monotonic()))
    except BaseException:
        for fd in (stdin_w, stdout_r):
            os.close(fd)
        raise
    finally:
        os.close(stdin_r)
        os.close(stdout_w)
    return ForkedRunner(server, pid, os.fdopen(stdin_w, "wb", buffering=0), os.fdopen(stdout_r, "rb", buffering=0))


@atexit.register
def close_all() -> None:
    """Ends every fork server this process started (each also ends when this process does)."""
    with _servers_lock:
        servers = [s for s in _servers.values() if s.owner == os.getpid()]
        _servers.clear()
        _refused.clear()
    for server in servers:
        with contextlib.suppress(Exception):
            server.close()
