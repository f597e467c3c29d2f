"""NumPy-only client for ``msrl-lite-runner``, the MindSpore Lite inference server process.

Lite runs in its own process because Lite 2.0.0 and MindSpore 2.10 both ship ``libmindspore_core.so`` and
clash inside one interpreter, and because a Lite graph can hang in ``Predict``: a child process can be
timed out and killed, a hung thread cannot. This module imports only NumPy and the standard library so it
runs on a deploy box without any framework installed.

Protocol (all integers little-endian), over the runner's stdin/stdout:

* Handshake: after loading, the runner writes one JSON line, ``{"ok": true, "lite_version", "model",
  "device", "inputs": [{"name", "dtype", "shape"}], "outputs": [...]}`` or ``{"ok": false, "kind":
  "load"|"mindir_version"|"device"|"args"|"missing", "error"}`` and exits with 4/5/6/2/3 respectively.
* Request: ``u32 magic, u32 op`` (1 infer, 2 ping, 3 quit); infer adds ``u32 n_inputs`` and per input
  ``u32 dtype, u32 ndim, i64 dims[ndim], u64 nbytes, bytes``, in the model's input order.
* Response: ``u32 magic, u32 status`` (0 ok, 1 bad request, 2 inference failure); if ok ``u32 n_outputs``
  and per output ``u32 name_len, name, u32 dtype, u32 ndim, i64 dims[ndim], u64 nbytes, bytes``, else
  ``u32 msg_len, msg``. Ping answers status 0 with no outputs; quit and EOF end the process with code 0.
* Dtype codes: 0 float32, 1 float16, 2 int32, 3 int64, 4 uint8, 5 bool (one byte).
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import struct
import subprocess
import tempfile
import time
from pathlib import Path
from typing import IO, Any, NamedTuple, NoReturn

import numpy as np

MAGIC = 0x4D534C52
OP_INFER, OP_PING, OP_QUIT = 1, 2, 3
STATUS_OK, STATUS_BAD_REQUEST, STATUS_INFER_FAILED = 0, 1, 2
DTYPES: tuple[np.dtype, ...] = tuple(
    np.dtype(t) for t in (np.float32, np.float16, np.int32, np.int64, np.uint8, np.bool_)
)
_DTYPE_CODE = {dt: code for code, dt in enumerate(DTYPES)}
_DTYPE_BY_NAME = {dt.name: dt for dt in DTYPES}

_U32 = struct.Struct("<I")
_U32X2 = struct.Struct("<II")
_U32X3 = struct.Struct("<III")
_U64 = struct.Struct("<Q")
_PING = _U32X2.pack(MAGIC, OP_PING)
_QUIT = _U32X2.pack(MAGIC, OP_QUIT)
_REPO = Path(__file__).resolve().parents[1]


class LiteRunnerError(RuntimeError):
    """Base of all runner failures; ``exit_code`` lets a CLI map each failure to a distinct status."""

    exit_code = 1


class RunnerUnavailable(LiteRunnerError):
    """The runner binary is missing or not executable (not built: run ``make lite``)."""

    exit_code = 3


class ModelLoadError(LiteRunnerError):
    """Lite could not load the model (missing, corrupt, unsupported, bad arguments)."""

    exit_code = 4


class MindIRVersionError(ModelLoadError):
    """The MindIR was written by a newer MindSpore than this Lite can read; the bundle's .ms is the way out."""

    exit_code = 5


class DeviceUnavailable(LiteRunnerError):
    """The requested device (e.g. Ascend) cannot be initialised on this machine."""

    exit_code = 6


class FeedError(LiteRunnerError, ValueError):
    """Inputs do not match the model's inputs (count, dtype, rank, fixed dims)."""

    exit_code = 7


class RunnerTimeout(LiteRunnerError, TimeoutError):
    """The runner did not answer in time; it has been killed."""

    exit_code = 8


class RunnerCrashed(LiteRunnerError):
    """The runner exited unexpectedly (crash, signal, protocol breakage)."""

    exit_code = 9


class InferenceError(LiteRunnerError):
    """Lite accepted the feeds but Resize/Predict failed; the runner is still alive."""

    exit_code = 10


_KIND_ERRORS: dict[str, type[LiteRunnerError]] = {
    "load": ModelLoadError,
    "missing": ModelLoadError,
    "args": ModelLoadError,
    "mindir_version": MindIRVersionError,
    "device": DeviceUnavailable,
}


_STATUS_ERRORS: dict[int, type[LiteRunnerError]] = {
    STATUS_BAD_REQUEST: FeedError,
    STATUS_INFER_FAILED: InferenceError,
}


class TensorMeta(NamedTuple):
    """A model input or output as Lite reports it; ``-1`` marks a dynamic dimension.

    Output shapes are Lite's view before any inference and can be incomplete (a dynamic-batch ``[-1, 2]``
    output may read ``(-1,)``); only input shapes are used for validation.
    """

    name: str
    dtype: np.dtype
    shape: tuple[int, ...]


def runner_path() -> Path:
    """Runner binary: ``$MSRL_LITE_RUNNER`` if set, else the one ``make lite`` builds in this checkout."""
    env = os.environ.get("MSRL_LITE_RUNNER")
    return Path(env) if env else _REPO / ".lite" / "bin" / "msrl-lite-runner"


def runner_available() -> tuple[bool, str]:
    """Whether the runner binary can be started, with the path or the reason it cannot."""
    path = runner_path()
    if not path.is_file():
        return False, f"Lite runner not found at {path} (build it with `make lite`)"
    if not os.access(path, os.X_OK):
        return False, f"Lite runner at {path} is not executable"
    return True, str(path)


def _one_line(text: str) -> str:
    return " | ".join(part.strip() for part in text.splitlines() if part.strip())


class LiteRunner:
    """One model served by a ``msrl-lite-runner`` child process; call ``infer`` once per step or batch.

    Every request is bounded by ``timeout`` seconds (``load_timeout`` for loading); on expiry the whole
    process group is killed, so no stray runner survives a hung Lite graph.
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
    ) -> None:
        self.model_path = str(model_path)
        self.timeout = timeout
        self._proc: subprocess.Popen[bytes] | None = None
        self._buf = bytearray()  # bytes received from the runner; self._pos is the parse position
        self._pos = 0
        # A file, not a pipe: the runner can never block on a full stderr pipe nobody drains. Closed in close().
        self._stderr: IO[bytes] = tempfile.TemporaryFile(prefix="msrl-lite-runner-")  # noqa: SIM115
        exe = Path(runner) if runner is not None else runner_path()
        if not (exe.is_file() and os.access(exe, os.X_OK)):
            self._stderr.close()
            raise RunnerUnavailable(f"Lite runner not found or not executable: {exe} (build it with `make lite`)")
        cmd = [
            str(exe),
            "--model",
            self.model_path,
            "--device",
            device,
            "--device-id",
            str(device_id),
            "--threads",
            str(threads),
        ]
        env = dict(os.environ)
        env.setdefault("GLOG_v", "3")  # Lite logs warnings by default; keep the stderr log small
        self._proc = subprocess.Popen(
            cmd,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            env=env,
            start_new_session=True,
            bufsize=0,
        )
        self._in = self._proc.stdin.fileno()  # type: ignore[union-attr]
        self._out = self._proc.stdout.fileno()  # type: ignore[union-attr]
        hello = self._handshake(load_timeout)
        self.lite_version: str = hello["lite_version"]
        self.device: str = hello["device"]
        self.inputs = [self._meta(t) for t in hello["inputs"]]
        self.outputs = [self._meta(t) for t in hello["outputs"]]
        self._infer_head = _U32X3.pack(MAGIC, OP_INFER, len(self.inputs))
        self._feed_heads: list[dict[tuple[np.dtype, tuple[int, ...]], bytes]] = [{} for _ in self.inputs]

    # ---- public API ---------------------------------------------------------------------------------

    def infer(self, *arrays: np.ndarray) -> dict[str, np.ndarray]:
        """Run the model on one feed per input (model input order); returns outputs by name.

        Feeds are checked here first (count, dtype, rank, fixed dims), so mistakes surface as ``FeedError``
        without a round trip; the packed per-input header is cached per (dtype, shape) to keep a single
        environment step cheap.
        """
        self._alive()
        if len(arrays) != len(self.inputs):
            raise FeedError(f"expected {len(self.inputs)} inputs, got {len(arrays)}")
        parts = [self._infer_head]
        for meta, heads, arr in zip(self.inputs, self._feed_heads, arrays, strict=True):
            arr = np.ascontiguousarray(arr)
            head = heads.get((arr.dtype, arr.shape))
            if head is None:
                head = self._feed_head(meta, arr)
                if len(heads) >= 64:
                    heads.clear()
                heads[(arr.dtype, arr.shape)] = head
            parts.append(head)
            parts.append(arr.data)
        self._send(b"".join(parts))
        deadline = time.monotonic() + self.timeout
        self._status(deadline)
        buf = self._buf
        (count,) = _U32.unpack_from(buf, self._need(4, deadline))
        out: dict[str, np.ndarray] = {}
        for _ in range(count):
            (name_len,) = _U32.unpack_from(buf, self._need(4, deadline))
            off = self._need(name_len + 8, deadline)
            name = buf[off : off + name_len].decode()
            code, ndim = _U32X2.unpack_from(buf, off + name_len)
            dims = struct.unpack_from(f"<{ndim}q", buf, self._need(8 * ndim, deadline))
            (nbytes,) = _U64.unpack_from(buf, self._need(8, deadline))
            if code >= len(DTYPES):
                self._crashed(f"runner sent unknown dtype code {code}")
            off = self._need(nbytes, deadline)
            out[name] = np.frombuffer(buf[off : off + nbytes], dtype=DTYPES[code]).reshape(dims)
        return out

    def ping(self) -> float:
        """Round-trip an empty request; returns the elapsed seconds (a liveness and latency probe)."""
        self._alive()
        start = time.perf_counter()
        self._send(_PING)
        deadline = time.monotonic() + self.timeout
        self._status(deadline)
        self._need(4, deadline)
        return time.perf_counter() - start

    def close(self) -> None:
        """Ask the runner to quit, then wait briefly and kill its process group if needed. Idempotent."""
        proc, self._proc = self._proc, None
        if proc is not None:
            if proc.poll() is None:
                with contextlib.suppress(OSError):
                    os.write(self._in, _QUIT)
                try:
                    proc.wait(timeout=2.0)
                except subprocess.TimeoutExpired:
                    self._kill(proc)
            for stream in (proc.stdin, proc.stdout):
                if stream is not None:
                    stream.close()
        if not self._stderr.closed:
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

    @staticmethod
    def _meta(t: dict[str, Any]) -> TensorMeta:
        return TensorMeta(t["name"], _DTYPE_BY_NAME[t["dtype"]], tuple(int(d) for d in t["shape"]))

    @staticmethod
    def _feed_head(meta: TensorMeta, arr: np.ndarray) -> bytes:
        """Validates one feed against the model input and packs its frame header (dtype, dims, nbytes)."""
        if arr.dtype != meta.dtype:
            raise FeedError(f"input '{meta.name}': dtype {arr.dtype} != expected {meta.dtype}")
        if arr.ndim != len(meta.shape):
            raise FeedError(
                f"input '{meta.name}': shape {arr.shape} has rank {arr.ndim}, "
                f"expected rank {len(meta.shape)} {meta.shape}"
            )
        if any(want >= 0 and got != want for got, want in zip(arr.shape, meta.shape, strict=True)):
            raise FeedError(f"input '{meta.name}': shape {arr.shape} does not match {meta.shape}")
        return (
            _U32X2.pack(_DTYPE_CODE[meta.dtype], arr.ndim)
            + struct.pack(f"<{arr.ndim}q", *arr.shape)
            + _U64.pack(arr.nbytes)
        )

    def _alive(self) -> subprocess.Popen[bytes]:
        if self._proc is None:
            raise LiteRunnerError("runner is closed")
        return self._proc

    def _handshake(self, load_timeout: float) -> dict[str, Any]:
        """Reads the runner's one-line JSON greeting; a refusal becomes the matching exception."""
        deadline = time.monotonic() + load_timeout
        try:
            while b"\n" not in self._buf:
                self._fill(deadline, what=f"loading {self.model_path}")
        except RunnerCrashed as exc:
            self.close()
            raise ModelLoadError(f"runner died while loading {self.model_path}: {exc}") from None
        except LiteRunnerError:
            self.close()
            raise
        line, _, rest = bytes(self._buf).partition(b"\n")
        self._buf[:] = rest
        try:
            hello = json.loads(line)
        except ValueError:
            self.close()
            raise RunnerCrashed(f"runner sent an invalid handshake: {line[:200]!r}") from None
        if not hello.get("ok"):
            proc = self._proc
            if proc is not None:
                try:
                    proc.wait(timeout=5.0)
                except subprocess.TimeoutExpired:
                    self._kill(proc)
            self.close()
            raise _KIND_ERRORS.get(hello.get("kind", ""), ModelLoadError)(hello.get("error", "unknown error"))
        return hello

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
        magic, status = _U32X2.unpack_from(self._buf, self._need(8, deadline))
        if magic != MAGIC:
            self._crashed(f"bad response magic {magic:#x}")
        if status == STATUS_OK:
            return
        (msg_len,) = _U32.unpack_from(self._buf, self._need(4, deadline))
        off = self._need(msg_len, deadline)
        msg = self._buf[off : off + msg_len].decode(errors="replace")
        error = _STATUS_ERRORS.get(status)
        if error is None:
            self._crashed(f"unknown response status {status}: {msg}")
        raise error(f"runner: {msg}")

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
            proc = self._alive()
            self._kill(proc)
            self.close()
            raise RunnerTimeout(
                f"runner (pid {proc.pid}) gave no answer within the timeout while waiting for {what}; killed it"
            )
        data = os.read(self._out, 1 << 16)
        if not data:
            self._crashed()
        self._buf += data

    def _crashed(self, why: str = "") -> NoReturn:
        proc = self._alive()
        try:
            code = proc.wait(timeout=2.0)
        except subprocess.TimeoutExpired:
            self._kill(proc)
            code = proc.returncode
        how = f"killed by {signal.Signals(-code).name}" if code is not None and code < 0 else f"exited with code {code}"
        tail = self._stderr_tail()
        self.close()
        raise RunnerCrashed(
            f"runner (pid {proc.pid}) {how}{': ' + why if why else ''}{'; stderr: ' + tail if tail else ''}"
        )

    def _stderr_tail(self, lines: int = 5) -> str:
        if self._stderr.closed:
            return ""
        self._stderr.seek(0, os.SEEK_END)
        size = self._stderr.tell()
        self._stderr.seek(max(0, size - 8192))
        text = self._stderr.read().decode(errors="replace")
        return _one_line("\n".join(text.splitlines()[-lines:]))

    @staticmethod
    def _kill(proc: subprocess.Popen[bytes]) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
