"""The runner process's pipes, as ``LiteRunner`` uses them: send a request frame, read a response within a
deadline, and when the process dies or hangs, kill it and say how it ended (its signal, its stderr's last lines).
The frames themselves are ``protocol.py``'s."""

from __future__ import annotations

import contextlib
import os
import select
import signal
import struct
import subprocess
import time
from typing import IO, NoReturn

import numpy as np

from inference.lite import forks
from inference.lite.common import DTYPES, InferenceError, RunnerCrashed, RunnerTimeout
from inference.lite.protocol import MAGIC, STATUS_ERRORS, STATUS_OK, U32, U32X2, U64, kernel_failure, one_line


class RunnerPipes:
    """The byte-level half of ``LiteRunner``: its child process, pipes and response buffer."""

    timeout: float
    _proc: subprocess.Popen[bytes] | forks.ForkedRunner | None
    _in: int
    _out: int
    _stderr: IO[bytes] | None
    _buf: bytearray
    _pos: int
    _last_failure: str
    _restarts_in_a_row: int

    def _discard(self) -> None:
        raise NotImplementedError

    def _string(self, deadline: float) -> str:
        (n,) = U32.unpack_from(self._buf, self._need(4, deadline))
        off = self._need(n, deadline)
        return self._buf[off : off + n].decode(errors="replace")

    def _tensor(self, deadline: float) -> tuple[str, np.ndarray]:
        name = self._string(deadline)
        code, ndim = U32X2.unpack_from(self._buf, self._need(8, deadline))
        dims = struct.unpack_from(f"<{ndim}q", self._buf, self._need(8 * ndim, deadline))
        (nbytes,) = U64.unpack_from(self._buf, self._need(8, deadline))
        if code >= len(DTYPES):
            self._crashed(f"runner sent unknown dtype code {code}")
        off = self._need(nbytes, deadline)
        return name, np.frombuffer(bytes(self._buf[off : off + nbytes]), dtype=DTYPES[code]).reshape(dims)

    def _send(self, frame: bytes) -> None:
        view = memoryview(frame)
        try:
            while view:
                view = view[os.write(self._in, view) :]
        except BrokenPipeError:
            self._crashed()

    def _status(self, deadline: float) -> None:
        """Starts reading a response: drops the previous one, checks magic, raises on a non-ok status."""
        del self._buf[: self._pos]
        self._pos = 0
        magic, status = U32X2.unpack_from(self._buf, self._need(8, deadline))
        if magic != MAGIC:
            self._crashed(f"bad response magic {magic:#x}")
        self._restarts_in_a_row = 0  # this runner serves requests
        if status == STATUS_OK:
            return
        (msg_len,) = U32.unpack_from(self._buf, self._need(4, deadline))
        off = self._need(msg_len, deadline)
        msg = self._buf[off : off + msg_len].decode(errors="replace")
        error = STATUS_ERRORS.get(status)
        if error is None:
            self._crashed(f"unknown response status {status}: {msg}")
        if error is InferenceError:
            msg += self._kernel_failure()
        raise error(f"runner: {msg}")

    def _kernel_failure(self) -> str:
        """The Lite kernel that failed, from Lite's own error log (the runner's stderr)."""
        return kernel_failure(self._stderr_text(16384))

    def _need(self, n: int, deadline: float) -> int:
        """Makes n unread bytes available in the buffer; returns their offset and consumes them."""
        while len(self._buf) - self._pos < n:
            self._fill(deadline, what="a response")
        off = self._pos
        self._pos += n
        return off

    def _fill(self, deadline: float, what: str) -> None:
        remaining = deadline - time.monotonic()
        ready = remaining > 0 and select.select([self._out], [], [], remaining)[0]
        if not ready:
            proc = self._proc
            assert proc is not None
            self._kill(proc)
            self._discard()
            self._last_failure = f"timeout ({self.timeout:g} s) waiting for {what}"
            raise RunnerTimeout(
                f"runner (pid {proc.pid}) gave no answer within the timeout while waiting for {what}; killed it "
                "(the next request starts a new runner)"
            )
        data = os.read(self._out, 1 << 16)
        if not data:
            self._crashed()
        self._buf += data

    def _crashed(self, why: str = "") -> NoReturn:
        proc = self._proc
        assert proc is not None
        ours = False  # this client killed it (it hung after breaking the protocol): not a kill from outside
        try:
            code = proc.wait(timeout=2.0)
        except subprocess.TimeoutExpired:
            self._kill(proc)
            code, ours = proc.returncode, True
        how = f"killed by {signal.Signals(-code).name}" if code is not None and code < 0 else f"exited with code {code}"
        how += " (by this client, after it stopped answering)" if ours else ""
        tail = self._stderr_tail()
        self._discard()
        self._last_failure = f"runner {how}{': ' + why if why else ''}"
        error = RunnerCrashed(
            f"runner (pid {proc.pid}) {how}{': ' + why if why else ''}{'; stderr: ' + tail if tail else ''}"
        )
        error.signal = -code if code is not None and code < 0 and not ours else None
        raise error

    def _stderr_tail(self, lines: int = 5) -> str:
        return one_line("\n".join(self._stderr_text(8192).splitlines()[-lines:]))

    def _stderr_text(self, last: int) -> str:
        """The runner's last ``last`` bytes of stderr (Lite's log)."""
        if self._stderr is None or self._stderr.closed:
            return ""
        self._stderr.seek(0, os.SEEK_END)
        size = self._stderr.tell()
        self._stderr.seek(max(0, size - last))
        return self._stderr.read().decode(errors="replace")

    @staticmethod
    def _kill(proc: subprocess.Popen[bytes] | forks.ForkedRunner) -> None:
        if proc.poll() is None:  # a forked runner is reaped by its fork server: never signal a pid it let go
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:  # a forked runner not yet in its own session
                with contextlib.suppress(ProcessLookupError):
                    os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
