"""MindSpore Lite in the calling process: ``LiteModel``, over ``libmsrl-lite.so`` (built next to the runner by
``build_lite.sh``) through ``ctypes``.

The deploy side's default: a control loop pays Lite's own compute, not a pipe and two process wake-ups per step
(``LiteRunner``), and on the CPU of a Lite build this was tested on the graph runs on the calling thread, not on
Lite's actor thread (``libmsrl-lite-inline.so``, loaded first and RTLD_GLOBAL so that the dynamic linker binds Lite's
plugins to it; see ``inference/lite/runner/inline_run.h``; ``MSRL_LITE_INLINE=1``/``0`` or ``inline=`` choose).
``runs_inline`` says, per model, whether its calls did. The runner process stays for a process that imports
MindSpore (Lite 2.0.0 and MindSpore 2.10 ship clashing ``libmindspore_core.so``) and for untrusted models (its
watchdog kills a hung graph; in-process a hang is the caller's): ``open_lite`` chooses, ``MSRL_LITE_ISOLATE=1``
(the commands' ``--isolate``) forces the runner. The same context options, load-failure classification and feed
checks as the runner, so both give the same bits for the same graph and thread count.

Feeds are validated here before Lite sees them (count, dtype, rank, fixed dimensions, the row cap), once per input
signature (shapes and dtypes): the call's arguments are then prepared once (``_Call``, one pointer per step), small
feeds are copied into buffers of that call (cheaper than asking NumPy for an array's address, and any layout
goes), and outputs land in buffers allocated once per signature. ``infer`` returns copies, safe to keep;
``infer_into`` returns those buffers themselves (overwritten by the next call: the allocation-free path of a
control loop).
"""

from __future__ import annotations

import ctypes
import os
import sys
import threading
import weakref
from collections import OrderedDict
from pathlib import Path
from typing import Any

import numpy as np

from inference.bundle.tensors import FeedError, TensorMeta
from inference.lite.client import LiteRunner
from inference.lite.common import (
    DEFAULT_MAX_ROWS,
    DTYPES,
    InferenceError,
    LiteRunnerError,
    ModelLoadError,
    RunnerUnavailable,
    forked_child,
    lite_precision_args,
    load_refusal,
    runner_path,
)

LIBRARY_NAME = "libmsrl-lite.so"
INLINE_LIBRARY_NAME = "libmsrl-lite-inline.so"
MAX_RANK = 8
_ERR = 4096
_SHAPES_KEPT = 8  # prepared calls (and their buffers) kept for this many distinct input signatures
_STAGE_BYTES = 256 << 10  # feeds up to this size are copied into the call's own buffer; larger ones passed as is


def library_path() -> Path:
    """``$MSRL_LITE_LIBRARY`` if set, else the library built next to the runner (see ``runner_path``)."""
    env = os.environ.get("MSRL_LITE_LIBRARY")
    return Path(env) if env else runner_path().with_name(LIBRARY_NAME)


def in_process_reason() -> str | None:
    """Why Lite cannot run in this process (None: it can)."""
    if os.environ.get("MSRL_LITE_ISOLATE", "") not in ("", "0"):
        return "MSRL_LITE_ISOLATE is set (--isolate): Lite runs in the runner process"
    if "mindspore" in sys.modules and sys.modules["mindspore"] is not None:
        return "MindSpore is imported in this process (its libmindspore_core.so clashes with Lite's)"
    if not library_path().is_file():
        return f"{library_path()} not built (bash inference/lite/build_lite.sh)"
    return None


def open_lite(model_path: str | os.PathLike[str], **kwargs: Any) -> LiteModel | LiteRunner:
    """Lite on ``model_path``: in this process where it can run here, else in the runner process (which takes the
    runner's own options, ``timeout`` included)."""
    if in_process_reason() is None:
        kwargs = {
            k: v
            for k, v in kwargs.items()
            if k in ("device", "device_id", "threads", "max_rows", "inline", "precision_mode", "config")
        }
        return LiteModel(model_path, **kwargs)
    return LiteRunner(model_path, **kwargs)


class _Library:
    """The loaded library and its function signatures (one per process)."""

    _instance: _Library | None = None

    def __init__(self, path: Path) -> None:
        # Lite logs through glog to the caller's stderr; like the runner, keep its WARNING lines (a missing
        # libnuma...) out of a control loop's output unless the caller chose a level (read once, at load).
        os.environ.setdefault("GLOG_v", "3")
        # Global, and before libmsrl-lite.so pulls in Lite: its symbols must be bound before Lite's plugins load.
        inline = ctypes.CDLL(str(path.with_name(INLINE_LIBRARY_NAME)), mode=ctypes.RTLD_GLOBAL)
        inline.msrl_lite_float_mode.restype = ctypes.c_uint32
        inline.msrl_lite_set_float_mode.argtypes = [ctypes.c_uint32]
        mode = inline.msrl_lite_float_mode()
        try:
            lib = ctypes.CDLL(str(path))
        finally:  # loading Lite switches this thread to flush denormals; this process's own arithmetic keeps its mode
            inline.msrl_lite_set_float_mode(mode)
        c = ctypes
        p_i64, p_u64 = c.POINTER(c.c_int64), c.POINTER(c.c_uint64)
        lib.msrl_lite_version.restype = c.c_char_p
        lib.msrl_lite_open.restype = c.c_void_p
        lib.msrl_lite_open.argtypes = [c.c_char_p, c.c_char_p, c.c_uint32, c.c_int, c.c_int, c.c_char_p, c.c_char_p,
                                       c.c_char_p, c.c_size_t, c.c_char_p, c.c_size_t, p_i64]  # fmt: skip
        lib.msrl_lite_describe_device.argtypes = [c.c_char_p, c.c_uint32, c.c_char_p, c.c_char_p, c.c_size_t]
        lib.msrl_lite_inline_calls.argtypes = [c.c_void_p, p_u64]
        lib.msrl_lite_inline_calls.restype = None
        lib.msrl_lite_count.argtypes = [c.c_void_p, c.c_int]
        lib.msrl_lite_describe.argtypes = [c.c_void_p, c.c_int, c.c_int, c.c_char_p, c.c_size_t,
                                           c.POINTER(c.c_int), p_i64]  # fmt: skip
        lib.msrl_lite_fetch.argtypes = [c.c_void_p, c.c_int, c.POINTER(c.c_void_p), p_u64, c.c_char_p, c.c_size_t]
        lib.msrl_lite_predict.argtypes = [c.c_void_p]  # a _Call's address: no per-call argument conversion
        lib.msrl_lite_close.argtypes = [c.c_void_p]
        self.lib = lib
        self.predict = lib.msrl_lite_predict
        self.version = lib.msrl_lite_version().decode()
        self.inline_default = bool(lib.msrl_lite_inline_default())

    @classmethod
    def get(cls) -> _Library:
        if cls._instance is None:
            path = library_path()
            if not path.is_file():
                raise RunnerUnavailable(f"{path} not found (build it: bash inference/lite/build_lite.sh)")
            try:
                cls._instance = cls(path)
            except OSError as exc:
                raise RunnerUnavailable(f"{path} does not load here: {exc}") from None
        return cls._instance


def describe_device(device: str, device_id: int = 0, precision_mode: str = "") -> dict[str, Any]:
    """The device context ``LiteModel`` builds, as Lite's own objects hold it (the precision mode read back from
    ``AscendDeviceInfo``): needs no device, so the argument path is checkable anywhere. ``ModelLoadError`` with the
    refusal for an Ascend context without a mode."""
    import json

    out = ctypes.create_string_buffer(_ERR)
    lib = _Library.get().lib
    if lib.msrl_lite_describe_device(device.encode(), device_id, precision_mode.encode(), out, _ERR) != 0:
        raise ModelLoadError(out.value.decode(errors="replace"))
    return json.loads(out.value.decode())


class _CallArgs(ctypes.Structure):
    """``struct msrl_lite_call`` (inference/lite/runner/inprocess.cc)."""

    _fields_ = [
        ("handle", ctypes.c_void_p),
        ("n", ctypes.c_int32),
        ("n_out", ctypes.c_int32),
        ("data", ctypes.POINTER(ctypes.c_void_p)),
        ("nbytes", ctypes.POINTER(ctypes.c_uint64)),
        ("dims", ctypes.POINTER(ctypes.c_int64)),
        ("ranks", ctypes.POINTER(ctypes.c_int32)),
        ("out", ctypes.POINTER(ctypes.c_void_p)),
        ("out_bytes", ctypes.POINTER(ctypes.c_uint64)),
        ("error", ctypes.POINTER(ctypes.c_char)),
        ("error_len", ctypes.c_uint64),
    ]


class _Call:
    """A call at one input signature (shapes, dtypes), prepared once: the feeds validated, the C arguments built,
    a buffer for each small feed, and (after the first call, when Lite knows them) the output buffers."""

    def __init__(self, model: LiteModel, feeds: tuple[np.ndarray, ...]) -> None:
        c = ctypes
        n = len(feeds)
        flat = [d for a in feeds for d in a.shape]
        # small feeds are copied into these C-ordered buffers (fixed addresses); None: the feed's own memory
        self.staged = [np.empty(a.shape, a.dtype) if a.nbytes <= _STAGE_BYTES else None for a in feeds]
        self.all_staged = all(b is not None for b in self.staged)
        self.outputs: dict[str, np.ndarray] = {}
        self.data = (c.c_void_p * n)(*[b.ctypes.data if b is not None else None for b in self.staged])
        self._keep = [self.data, (c.c_uint64 * n)(*[a.nbytes for a in feeds]),
                      (c.c_int64 * max(len(flat), 1))(*flat), (c.c_int32 * n)(*[a.ndim for a in feeds])]  # fmt: skip
        self.args = _CallArgs(model._handle, n, 0, self.data, *self._keep[1:], None, None,
                              ctypes.cast(model._error, ctypes.POINTER(ctypes.c_char)), _ERR)  # fmt: skip
        self.pointer = c.c_void_p(c.addressof(self.args))

    def feed(self, arrays: tuple[np.ndarray, ...]) -> list[np.ndarray]:
        """Put this step's feeds where the call reads them; returns the arrays Lite reads in place, which the caller
        keeps referenced until the call returns."""
        if self.all_staged:  # the common case, kept short: it runs once per control step
            for buf, a in zip(self.staged, arrays):  # noqa: B905 - the count was checked with the signature
                buf[...] = a  # type: ignore[index]
            return []
        passed = []
        for k, (buf, a) in enumerate(zip(self.staged, arrays, strict=True)):
            if buf is not None:
                buf[...] = a
            else:
                passed.append(a if a.flags.c_contiguous else np.ascontiguousarray(a))
                self.data[k] = passed[-1].ctypes.data
        return passed

    def allocate(self, metas: list[TensorMeta]) -> None:
        self.outputs = {meta.name: np.empty(meta.shape, meta.dtype) for meta in metas}
        arrays = list(self.outputs.values())
        out = (ctypes.c_void_p * len(arrays))(*[a.ctypes.data for a in arrays])
        out_bytes = (ctypes.c_uint64 * len(arrays))(*[a.nbytes for a in arrays])
        self._keep += [out, out_bytes]
        self.args.out, self.args.out_bytes, self.args.n_out = out, out_bytes, len(arrays)


class LiteModel:
    """One model in MindSpore Lite, in this process. ``infer(*arrays)`` / ``infer_into(*arrays)`` run it on one
    feed per input (model input order) and return the outputs by name; the interface ``LiteRunner`` offers."""

    restarts = 0  # never: there is no process to restart

    def __init__(
        self,
        model_path: str | os.PathLike[str],
        *,
        device: str = "cpu",
        device_id: int = 0,
        threads: int = 1,
        max_rows: int = DEFAULT_MAX_ROWS,
        inline: bool | None = None,
        precision_mode: str | None = None,
        config: str | None = None,
    ) -> None:
        """``inline``: run the graph on the calling thread (True) or on Lite's actor thread (False); None as
        ``MSRL_LITE_INLINE`` says, else this build's default (on for the Lite builds it was tested on).
        ``precision_mode``, ``config``: Lite's precision mode and runtime configuration; None: those of the model's
        bundle (``common.lite_precision_args``; an Ascend run without a mode is refused)."""
        if max_rows < 1:
            raise ValueError(f"max_rows must be >= 1, got {max_rows}")
        self._lib = _Library.get()
        self._handle: int | None = None
        self._final_stats: dict[str, int | bool] = {"calls": 0, "inline_calls": 0, "requested": False}
        # One call at a time: Lite's model, the calls' feed buffers and infer_into's outputs are shared state.
        self._lock = threading.Lock()
        self.model_path = str(model_path)
        self.max_rows = max_rows
        self.lite_version = self._lib.version
        self.device = device
        self.runner = library_path()
        kind, error = ctypes.create_string_buffer(32), ctypes.create_string_buffer(_ERR)
        versions = (ctypes.c_int64 * 2)(-1, -1)
        mode = -1 if inline is None else int(bool(inline))
        self.precision_mode, self.config = lite_precision_args(model_path, device, precision_mode, config)
        handle = self._lib.lib.msrl_lite_open(self.model_path.encode(), device.encode(), device_id, threads, mode,
                                              self.precision_mode.encode(), self.config.encode(), kind, 32, error,
                                              _ERR, versions)  # fmt: skip
        if not handle:
            known = [v if v >= 0 else None for v in versions]
            raise load_refusal(kind.value.decode(), error.value.decode(errors="replace"), self.model_path, *known)
        self._handle = handle
        self._owner = os.getpid()
        _LIVE.add(self)  # forgotten in a forked child (_after_fork): the child never touches the parent's Lite
        self.inputs = self._describe(0)
        self.outputs = self._describe(1)
        self._calls: OrderedDict[tuple, _Call] = OrderedDict()
        self._error = ctypes.create_string_buffer(_ERR)
        self._predict = self._lib.predict

    @property
    def pid(self) -> int:
        """The process Lite runs in: this one."""
        return os.getpid()

    def inline_stats(self) -> dict[str, int | bool]:
        """This model's calls so far, how many ran the graph on the calling thread, and whether it was opened to
        run inline (``requested``)."""
        with self._lock:
            return self._inline_stats()

    def _inline_stats(self) -> dict[str, int | bool]:
        if self._handle is None:  # closed: as it was then
            return self._final_stats
        counts = (ctypes.c_uint64 * 3)()
        self._lib.lib.msrl_lite_inline_calls(self._handle, counts)
        return {"calls": counts[0], "inline_calls": counts[1], "requested": bool(counts[2])}

    @property
    def runs_inline(self) -> bool:
        """Whether this model's graph runs on the calling thread: every call so far did (False before the first
        call, with inline runs off, off the CPU, or where the dynamic linker kept Lite's actor hand-off). Other models
        of the process do not count."""
        stats = self.inline_stats()
        return 0 < stats["calls"] == stats["inline_calls"]

    def _describe(self, output: int) -> list[TensorMeta]:
        metas = []
        name, dtype, dims = ctypes.create_string_buffer(1024), ctypes.c_int(), (ctypes.c_int64 * MAX_RANK)()
        for k in range(self._lib.lib.msrl_lite_count(self._handle, output)):
            rank = self._lib.lib.msrl_lite_describe(self._handle, output, k, name, 1024, ctypes.byref(dtype), dims)
            shape = tuple(int(d) for d in dims[:rank])
            metas.append(TensorMeta(name.value.decode(), DTYPES[dtype.value], shape))
        return metas

    def _check(self, arrays: tuple[np.ndarray, ...]) -> None:
        """Each feed against the model's declared input (before Lite sees it)."""
        if self._handle is None and self._owner != os.getpid():
            raise forked_child(self._owner, f"the Lite model {self.model_path}")
        if self._handle is None:
            raise LiteRunnerError(f"{self.model_path}: the model is closed")
        if len(arrays) != len(self.inputs):
            raise FeedError(f"expected {len(self.inputs)} inputs, got {len(arrays)}")
        for meta, arr in zip(self.inputs, arrays, strict=True):
            if not isinstance(arr, np.ndarray):
                raise FeedError(f"input '{meta.name}': expected a NumPy array, got {type(arr).__name__}")
            if arr.dtype != meta.dtype:
                raise FeedError(f"input '{meta.name}': dtype {arr.dtype} != expected {meta.dtype}")
            if meta.shape and arr.ndim != len(meta.shape):
                raise FeedError(f"input '{meta.name}': rank {arr.ndim} != expected {len(meta.shape)}")
            for d, (want, got) in enumerate(zip(meta.shape, arr.shape, strict=False)):
                if want >= 0 and d > 0 and want != got:
                    raise FeedError(f"input '{meta.name}': dim {d} is {got}, the model needs {want}")
            if arr.ndim and arr.shape[0] > self.max_rows:
                raise FeedError(f"input '{meta.name}': {arr.shape[0]} rows exceed the cap of {self.max_rows} rows "
                                "per request (max_rows=...); split the batch")  # fmt: skip

    def infer_into(self, *arrays: np.ndarray) -> dict[str, np.ndarray]:
        """Run the model; the outputs are buffers owned by this model, overwritten by its next call at the same
        input shapes (no allocation per call)."""
        with self._lock:
            return self._run(arrays)

    def infer(self, *arrays: np.ndarray) -> dict[str, np.ndarray]:
        """Run the model; the outputs are the caller's to keep."""
        with self._lock:  # copied before another thread's call can overwrite the buffers
            return {name: value.copy() for name, value in self._run(arrays).items()}

    def _run(self, arrays: tuple[np.ndarray, ...]) -> dict[str, np.ndarray]:
        try:  # a signature seen before was validated then: shapes and dtypes decide everything checked
            key = tuple([(a.shape, a.dtype) for a in arrays])
            call = self._calls.get(key)
        except AttributeError:  # not an array: _check says which input
            call = key = None
        if call is None:
            self._check(arrays)
            call = _Call(self, arrays)
            if key is not None:
                self._calls[key] = call
                if len(self._calls) > _SHAPES_KEPT:
                    self._calls.popitem(last=False)
        elif self._handle is None:
            self._check(arrays)  # closed, or the parent's in a forked child: says which
        _in_place = call.feed(arrays)  # Lite reads these during the call: referenced until it returns
        status = self._predict(call.pointer)
        if not status and not call.args.n_out:  # the first call at these shapes: Lite now knows the output shapes
            call.allocate(self._describe(1))
            status = self._lib.lib.msrl_lite_fetch(self._handle, call.args.n_out, call.args.out,
                                                   call.args.out_bytes, self._error, _ERR)  # fmt: skip
        if status:
            message = self._error.value.decode(errors="replace")
            raise (FeedError if status == 1 else InferenceError)(f"{Path(self.model_path).name}: {message}")
        return call.outputs

    def close(self) -> None:
        """Free the model (idempotent; waits for a call under way in another thread)."""
        with self._lock:
            if self._handle:
                self._final_stats = self._inline_stats()
            handle, self._handle = self._handle, None
            if handle:
                self._calls.clear()
                self._lib.lib.msrl_lite_close(handle)

    def __enter__(self) -> LiteModel:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        try:  # noqa: SIM105 - at interpreter shutdown even contextlib may be gone
            self.close()
        except Exception:  # noqa: BLE001
            pass

    def _forget(self) -> None:
        """In a forked child: drop the parent's Lite state without touching it (Lite's threads are not in the
        child: closing it there hangs for good); the model then refuses calls, naming the process it belongs to."""
        self._handle = None
        self._calls = OrderedDict()
        self._lock = threading.Lock()  # the parent's may have been held by another thread at the fork


_LIVE: weakref.WeakSet[LiteModel] = weakref.WeakSet()


def _after_fork() -> None:
    for model in list(_LIVE):
        model._forget()
    _LIVE.clear()


os.register_at_fork(after_in_child=_after_fork)
