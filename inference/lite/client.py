"""NumPy-only client for ``msrl-lite-runner``, the MindSpore Lite inference server process.

Lite runs in its own process because Lite 2.0.0 and MindSpore 2.10 both ship ``libmindspore_core.so`` and
clash inside one interpreter, and because a Lite graph can hang in ``Predict``: a child process can be
timed out and killed, a hung thread cannot. This module imports only NumPy and the standard library so it
runs on a deploy box without any framework installed.

The wire format is ``protocol.py``'s; this module runs, feeds, restarts and kills the process.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import struct
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable
from functools import wraps
from pathlib import Path
from typing import IO, Any

import numpy as np

from inference.bundle.tensors import FeedError
from inference.lite import forks
from inference.lite.common import (
    DEFAULT_MAX_ROWS,
    DTYPES,
    LiteRunnerError,
    ModelLoadError,
    RunnerCrashed,
    RunnerUnavailable,
    forked_child,
    lite_precision_args,
    load_refusal,
    runner_path,
)
from inference.lite.pipes import RunnerPipes
from inference.lite.protocol import (
    MAGIC,
    OP_INFER,
    OP_STATS,
    OP_TAP,
    PING,
    QUIT,
    STATS,
    U32,
    U32X2,
    U32X3,
    U64,
    KernelOutputs,
    feed_head,
    tensor_meta,
)

log = logging.getLogger(__name__)


def _one_at_a_time(method: Callable[..., Any]) -> Callable[..., Any]:
    """A request and its answer must not interleave with another thread's on the one pipe: callers queue."""

    @wraps(method)
    def serialized(self: LiteRunner, *args: Any, **kwargs: Any) -> Any:
        with self._lock:
            return method(self, *args, **kwargs)

    return serialized


PROBE_ROWS = 64  # a first request of more rows is preceded by one row, which measures the model's cost
ROW_COST_SLACK = 20.0
MIN_START_WAIT = 5.0  # seconds a plain start still gets after a fork server used up the start-up budget (at most a
# quarter of that budget)


class LiteRunner(RunnerPipes):
    """One model served by a ``msrl-lite-runner`` child process; call ``infer`` once per step or batch.

    Every request is bounded by ``timeout`` seconds (``load_timeout`` for loading); on expiry the whole
    process group is killed, so no stray runner survives a hung Lite graph. The request that timed out or
    crashed the runner raises; the next request starts a fresh runner (logged as a warning), so a long-lived
    deploy loop survives one bad request. ``max_restarts`` bounds restarts in a row without a served request.
    ``max_rows`` caps the batch a request may carry (the runner refuses more, see the module docstring).
    ``inline`` runs the graph on the runner's serving thread (True) or Lite's actor thread (False); None: as
    ``MSRL_LITE_INLINE`` and the build's default say (``runner/inline_run.h``). ``launcher`` is the command the runner
    runs under, e.g. ``qemu-aarch64 -L /usr/aarch64-linux-gnu -cpu neoverse-n1`` for a runner built for
    another architecture (``inference.runtimes.lite_aarch64``). ``fork_server``: fork the runner from one that has
    loaded Lite (``forks.py``); None: under a launcher; never with ``MSRL_LITE_FORK_SERVER=0``. ``cpu_fp16`` lets Lite
    compute in float16 on a CPU with float16 arithmetic (``CPUDeviceInfo::SetEnableFP16``; other CPUs ignore it).
    ``precision_mode`` and ``config``: Lite's precision mode and runtime configuration; None: those of the model's
    bundle (``common.lite_precision_args``; an Ascend run without a mode is refused).
    """

    def __init__(
        self,
        model_path: str | os.PathLike[str],
        *,
        runner: str | os.PathLike[str] | None = None,
        device: str = "cpu",
        device_id: int = 0,
        threads: int = 1,
        timeout: float = 10.0,
        load_timeout: float = 60.0,
        max_rows: int = DEFAULT_MAX_ROWS,
        max_restarts: int = 3,
        inline: bool | None = None,
        launcher: tuple[str, ...] | list[str] = (),
        fork_server: bool | None = None,
        cpu_fp16: bool = False,
        precision_mode: str | None = None,
        config: str | None = None,
    ) -> None:
        if max_rows < 1:
            raise ValueError(f"max_rows must be >= 1, got {max_rows}")
        self.model_path = str(model_path)
        self.timeout = timeout
        self.load_timeout = load_timeout
        self.max_rows = max_rows
        self.max_restarts = max_restarts
        self.inline = inline
        self.cpu_fp16 = cpu_fp16
        self._lock = threading.RLock()  # see _one_at_a_time
        self._row_cost: float | None = None  # seconds per row of the costliest request so far (see _timeout_for)
        self._owner = os.getpid()  # a forked child never writes to, waits on or kills the parent's runner
        self.restarts = 0  # runners started after the first, over this client's life
        self._restarts_in_a_row = 0
        self._closed = False
        self._last_failure = ""
        self._proc: subprocess.Popen[bytes] | forks.ForkedRunner | None = None
        self.forked = False  # the current runner was forked from a fork server
        self._stderr: IO[bytes] | None = None
        self._buf = bytearray()  # bytes received from the runner; self._pos is the parse position
        self._pos = 0
        exe = Path(runner) if runner is not None else runner_path()
        if not (exe.is_file() and os.access(exe, os.X_OK)):
            self._closed = True
            raise RunnerUnavailable(
                f"Lite runner not found or not executable: {exe} (build it: bash inference/lite/build_lite.sh)"
            )
        self.runner = exe
        self.precision_mode, self.config = lite_precision_args(model_path, device, precision_mode, config)
        self._launcher = tuple(launcher)
        self.fork_server = forks.wanted(self._launcher, fork_server)
        self._argv = [
            str(exe),
            "--model",
            self.model_path,
            "--device",
            device,
            "--device-id",
            str(device_id),
            "--threads",
            str(threads),
            "--max-rows",
            str(max_rows),
            *(["--cpu-fp16"] if cpu_fp16 else []),
            *(["--precision-mode", self.precision_mode] if self.precision_mode else []),
            *(["--config", self.config] if self.config else []),
        ]
        self._cmd = [*self._launcher, *self._argv]
        self._start()
        self.lite_version: str = self._hello["lite_version"]
        self.device: str = self._hello["device"]
        self.inline_requested: bool = bool(self._hello.get("inline"))
        # "off", "on", or "ignored: <Lite's warning>" (a Lite built without float16 kernels, a CPU without them)
        self.cpu_fp16_outcome: str = str(self._hello.get("cpu_fp16", "off"))
        self.inputs = [tensor_meta(t) for t in self._hello["inputs"]]
        self.outputs = [tensor_meta(t) for t in self._hello["outputs"]]
        self._infer_head = U32X3.pack(MAGIC, OP_INFER, len(self.inputs))
        self._feed_heads: list[dict[tuple[np.dtype, tuple[int, ...]], bytes]] = [{} for _ in self.inputs]

    def _start(self) -> None:
        """Spawns the runner and reads its handshake; on failure nothing is left running."""
        env = dict(os.environ)
        # Lite logs warnings by default: keep the stderr log small, but never hide the errors the runner classifies
        # load failures by (above 3; the runner's own re-exec to fix that cannot run under qemu-user). Lite says it
        # ignores the float16 switch as a warning, which the runner reports: logged when asked for.
        level = env.get("GLOG_v", "3")
        ceiling = 2 if self.cpu_fp16 else 3
        env["GLOG_v"] = level if level.isdigit() and int(level) <= ceiling else str(ceiling)
        if self.inline is not None:
            env["MSRL_LITE_INLINE"] = "1" if self.inline else "0"
        # A file, not a pipe: the runner can never block on a full stderr pipe nobody drains.
        self._stderr = tempfile.TemporaryFile(prefix="msrl-lite-runner-")  # noqa: SIM115 - closed in _discard
        self._buf = bytearray()
        self._pos = 0
        self._proc, self.forked = None, False
        started = time.monotonic()  # one start-up budget, whichever way the runner starts
        if self.fork_server:
            try:
                self._proc = forks.spawn(self._launcher, self._argv, env, self._stderr, self.load_timeout)
                self.forked = True
            except OSError as exc:  # forks.ForkServerError, or the pipes or the runner's file
                said = isinstance(exc, forks.ForkServerRefused)  # warned at the first refusal: once per process
                log.log(logging.DEBUG if said else logging.WARNING,
                        "starting the Lite runner for %s as a plain process: %s", self.model_path, exc)  # fmt: skip
        if self._proc is None:
            self._proc = subprocess.Popen(
                self._cmd,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=self._stderr,
                env=env,
                start_new_session=True,
                bufsize=0,
            )
        self._in = self._proc.stdin.fileno()  # type: ignore[union-attr]
        self._out = self._proc.stdout.fileno()  # type: ignore[union-attr]
        # A fork server that could not fork in time leaves the plain start what is left of the budget (at least
        # MIN_START_WAIT, or a quarter of it): a runner that never answers is not waited for twice.
        least = min(MIN_START_WAIT, self.load_timeout / 4)
        self._hello = self._handshake(max(least, self.load_timeout - (time.monotonic() - started)))

    def _restart(self) -> None:
        """Starts a fresh runner after the previous one was killed or died; bounded by ``max_restarts``."""
        if self._restarts_in_a_row >= self.max_restarts:
            raise RunnerCrashed(
                f"runner for {self.model_path} is down after: {self._last_failure}; not restarting it "
                f"({self._restarts_in_a_row} restart(s) in a row served no request, max_restarts={self.max_restarts})"
            )
        self._restarts_in_a_row += 1
        self.restarts += 1
        log.warning(
            "restarting the Lite runner for %s (restart %d in a row, at most %d) after: %s",
            self.model_path,
            self._restarts_in_a_row,
            self.max_restarts,
            self._last_failure,
        )
        self._start()

    # ---- public API ---------------------------------------------------------------------------------

    @_one_at_a_time
    def infer(self, *arrays: np.ndarray) -> dict[str, np.ndarray]:
        """Run the model on one feed per input (model input order); returns outputs by name.

        Feeds are checked here first (count, dtype, rank, fixed dims), so mistakes surface as ``FeedError``
        without a round trip; the packed per-input header is cached per (dtype, shape) to keep a single
        environment step cheap.
        """
        self._alive()
        if len(arrays) != len(self.inputs):
            raise FeedError(f"expected {len(self.inputs)} inputs, got {len(arrays)}")
        rows = max((int(np.shape(a)[0]) if np.ndim(a) else 1 for a in arrays), default=1)
        if self._row_cost is None and rows > PROBE_ROWS:  # a large first request: its first row measures the cost
            self.infer(*(np.asarray(a)[:1] if np.ndim(a) else a for a in arrays))
        parts = [self._infer_head]
        for meta, heads, arr in zip(self.inputs, self._feed_heads, arrays, strict=True):
            arr = np.ascontiguousarray(arr)
            if arr.ndim and arr.shape[0] > self.max_rows:
                raise FeedError(
                    f"input '{meta.name}': {arr.shape[0]} rows exceed the cap of {self.max_rows} rows per request "
                    "(LiteRunner(max_rows=...)); split the batch"
                )
            head = heads.get((arr.dtype, arr.shape))
            if head is None:
                head = feed_head(meta, arr)
                if len(heads) >= 64:
                    heads.clear()
                heads[(arr.dtype, arr.shape)] = head
            parts.append(head)
            parts.append(arr.data)
        self._send(b"".join(parts))
        started = time.monotonic()
        deadline = started + self._timeout_for(rows)
        self._status(deadline)
        buf = self._buf
        (count,) = U32.unpack_from(buf, self._need(4, deadline))
        out: dict[str, np.ndarray] = {}
        for _ in range(count):
            (name_len,) = U32.unpack_from(buf, self._need(4, deadline))
            off = self._need(name_len + 8, deadline)
            name = buf[off : off + name_len].decode()
            code, ndim = U32X2.unpack_from(buf, off + name_len)
            dims = struct.unpack_from(f"<{ndim}q", buf, self._need(8 * ndim, deadline))
            (nbytes,) = U64.unpack_from(buf, self._need(8, deadline))
            if code >= len(DTYPES):
                self._crashed(f"runner sent unknown dtype code {code}")
            off = self._need(nbytes, deadline)
            out[name] = np.frombuffer(buf[off : off + nbytes], dtype=DTYPES[code]).reshape(dims)
        self._row_cost = max(self._row_cost or 0.0, (time.monotonic() - started) / rows)
        return out

    def _timeout_for(self, rows: int) -> float:
        """How long a request of ``rows`` rows may take: ``timeout``, plus ``ROW_COST_SLACK`` times what that many rows
        cost at the costliest rate measured on this model (a slow kernel, an int8 CNN on this CPU, a loaded host: the
        wait follows the work; a runner that never answers is still killed)."""
        return self.timeout + ROW_COST_SLACK * rows * (self._row_cost or 0.0)

    @_one_at_a_time
    def infer_taps(self, *arrays: np.ndarray) -> list[KernelOutputs]:
        """Run the model once and return every kernel's outputs, in execution order (Lite's names and types: a
        kernel the converter fused carries the fused ops' last output)."""
        self._alive()
        if len(arrays) != len(self.inputs):
            raise FeedError(f"expected {len(self.inputs)} inputs, got {len(arrays)}")
        parts = [U32X3.pack(MAGIC, OP_TAP, len(self.inputs))]
        for meta, arr in zip(self.inputs, arrays, strict=True):
            arr = np.ascontiguousarray(arr)
            parts += [feed_head(meta, arr), arr.data]
        self._send(b"".join(parts))
        deadline = time.monotonic() + self.timeout
        self._status(deadline)
        (count,) = U32.unpack_from(self._buf, self._need(4, deadline))
        kernels = []
        for _ in range(count):
            name, kind = self._string(deadline), self._string(deadline)
            (n_out,) = U32.unpack_from(self._buf, self._need(4, deadline))
            kernels.append(KernelOutputs(name, kind, dict(self._tensor(deadline) for _ in range(n_out))))
        return kernels

    @_one_at_a_time
    def ping(self) -> float:
        """Round-trip an empty request; returns the elapsed seconds (a liveness and latency probe)."""
        self._alive()
        start = time.perf_counter()
        self._send(PING)
        deadline = time.monotonic() + self.timeout
        self._status(deadline)
        self._need(4, deadline)
        return time.perf_counter() - start

    @_one_at_a_time
    def inline_stats(self) -> dict[str, int | bool]:
        """The runner's Predicts of this model so far, how many ran the graph on its serving thread, and whether it
        was started to run inline (``requested``). A restarted runner counts from zero."""
        self._alive()
        self._send(U32X2.pack(MAGIC, OP_STATS))
        deadline = time.monotonic() + self.timeout
        self._status(deadline)
        calls, inline_calls, requested = STATS.unpack_from(self._buf, self._need(STATS.size, deadline))
        return {"calls": calls, "inline_calls": inline_calls, "requested": bool(requested)}

    @property
    def runs_inline(self) -> bool:
        """Whether this runner's graph runs on its serving thread: every call so far did (as ``LiteModel``'s)."""
        stats = self.inline_stats()
        return 0 < stats["calls"] == stats["inline_calls"]

    @_one_at_a_time
    def close(self) -> None:
        """Ask the runner to quit, then wait briefly and kill its process group if needed. Idempotent; a closed
        client is never restarted. In a forked child only the child's copies of the pipes are dropped: the runner is
        the parent's."""
        self._closed = True
        if os.getpid() != self._owner:
            self._proc = None
            return
        self._discard()

    def _discard(self) -> None:
        """Ends the current runner process (quit, then kill) and drops its pipes and log; a later request of an
        open client starts a new one."""
        proc, self._proc = self._proc, None
        if proc is not None:
            if proc.poll() is None:
                with contextlib.suppress(OSError):
                    os.write(self._in, QUIT)
                try:
                    proc.wait(timeout=2.0)
                except subprocess.TimeoutExpired:
                    self._kill(proc)
            for stream in (proc.stdin, proc.stdout):
                if stream is not None:
                    stream.close()
        if self._stderr is not None and not self._stderr.closed:
            self._stderr.close()

    def __enter__(self) -> LiteRunner:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        try:  # noqa: SIM105 - plain try: at interpreter shutdown even contextlib may be gone
            self.close()
        except Exception:
            pass

    @property
    def pid(self) -> int | None:
        """Process id of the runner while it is alive (for diagnostics and tests)."""
        return self._proc.pid if self._proc is not None else None

    # ---- internals ----------------------------------------------------------------------------------

    def _alive(self) -> subprocess.Popen[bytes] | forks.ForkedRunner:
        """The running runner; restarts one that was killed or died, unless the client was closed."""
        if os.getpid() != self._owner:
            raise forked_child(self._owner, f"the Lite runner of {self.model_path}")
        if self._closed:
            raise LiteRunnerError("runner is closed")
        if self._proc is None:
            self._restart()
        assert self._proc is not None
        return self._proc

    def _handshake(self, load_timeout: float) -> dict[str, Any]:
        """Reads the runner's one-line JSON greeting; a refusal becomes the matching exception."""
        deadline = time.monotonic() + load_timeout
        try:
            while b"\n" not in self._buf:
                self._fill(deadline, what=f"loading {self.model_path}")
        except RunnerCrashed as exc:
            self._discard()
            if exc.killed_from_outside:
                raise
            raise ModelLoadError(f"runner died while loading {self.model_path}: {exc}") from None
        except LiteRunnerError:
            self._discard()
            raise
        line, _, rest = bytes(self._buf).partition(b"\n")
        self._buf[:] = rest
        try:
            hello = json.loads(line)
        except ValueError:
            self._discard()
            raise RunnerCrashed(f"runner sent an invalid handshake: {line[:200]!r}") from None
        if not hello.get("ok"):
            proc = self._proc
            if proc is not None:
                try:
                    proc.wait(timeout=5.0)
                except subprocess.TimeoutExpired:
                    self._kill(proc)
            self._discard()
            raise self._refusal(hello)
        return hello

    def _refusal(self, hello: dict[str, Any]) -> LiteRunnerError:
        return load_refusal(str(hello.get("kind", "")), str(hello.get("error", "unknown error")), self.model_path,
                            hello.get("mind_ir_version"), hello.get("max_mind_ir_version"))  # fmt: skip
