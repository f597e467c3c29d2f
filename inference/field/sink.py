"""The recorder's writing side: the chunk being filled, the writer thread, the directory's lock, SIGTERM.

``Sink`` holds everything that must reach the disk even if the ``Recorder`` is never closed; the recorder's finaliser
(interpreter exit, garbage collection) holds the sink, never the recorder. A chunk is handed to the writer once
(``Columns.sealed``) and written once per index, so a hand-over cut short by Ctrl-C and repeated at exit writes it
once. The writer records every failure (``errors``, raised by the recorder) and the chunks lost to it or dropped while
the disk was behind (``lost``, announced in the next chunk written).
"""

from __future__ import annotations

import contextlib
import os
import queue
import signal
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from inference.bundle import sha256_file
from inference.bundle.recording.chunk import LOCK_FILE, chunk_name, write_chunk
from inference.errors import UsageError, first_line

try:
    import fcntl
except ImportError:  # not POSIX: no lock between recorders
    fcntl = None  # type: ignore[assignment]


class Columns:
    """One chunk's calls, field by field (copies of what each call was given and answered)."""

    def __init__(self, index: int, inputs: int, outputs: int) -> None:
        self.index = index
        self.sealed = False  # handed to the writer: no call is added any more
        self.next_episode = 0
        self.fill = 0
        self.inputs: list[list[np.ndarray]] = [[] for _ in range(inputs)]
        self.outputs: list[list[np.ndarray]] = [[] for _ in range(outputs)]
        self.action: list[np.ndarray] = []
        self.host_noise: list[np.ndarray | None] = []
        self.time_ns: list[int] = []
        self.episode: list[Any] = []  # per call: its rows' episode ids (one number for a one-row call)
        self.reward: list[Any] = []  # the same, None until observed
        self.done: list[Any] = []
        self.n: list[int] = []

    @property
    def steps(self) -> int:
        return sum(self.n)

    def arrays(self, names: Sequence[str], batched: Mapping[str, bool]) -> dict[str, np.ndarray]:
        """The chunk's arrays, one row per step (in the writer thread). Only the calls whose row count was appended
        count: a call interrupted half-way through ``record`` (Ctrl-C) is left out."""
        ns = list(self.n)
        calls = len(ns)
        cols: dict[str, np.ndarray] = {}
        for k, parts in enumerate(self.inputs):
            cols[f"input/{k}"] = np.concatenate(parts[:calls])
            time.sleep(0)  # let the control loop run between columns
        for name, parts in zip(names, self.outputs, strict=True):
            cols[f"output/{name}"] = _stack(parts[:calls], ns, batched[name])
            time.sleep(0)
        cols["action"] = np.concatenate(self.action[:calls])
        noise = self.host_noise[:calls]
        if any(x is not None for x in noise):
            width = next(x for x in noise if x is not None).shape[1:]
            cols["host_noise"] = np.concatenate([np.full((n, *width), np.nan, np.float32) if x is None else x
                                                 for x, n in zip(noise, ns, strict=True)])  # fmt: skip
        cols["time_ns"] = np.repeat(np.array(self.time_ns[:calls], np.int64), ns)
        cols["episode"] = _rows(self.episode[:calls], ns, np.int64, -1)
        cols["env"] = np.concatenate([np.arange(n, dtype=np.int64) for n in ns])
        time.sleep(0)
        cols["reward"] = _rows(self.reward[:calls], ns, np.float64, np.nan)
        cols["done"] = _rows(self.done[:calls], ns, bool, False)
        return cols


def _rows(items: list[Any], ns: list[int], dtype: type, missing: Any) -> np.ndarray:
    """Per-call values (a scalar for a one-row call, an array per row, or None: ``missing``) as one row per step."""
    if all(n == 1 for n in ns):
        return np.array([missing if x is None else x for x in items], dtype).reshape(-1)
    parts = [x if type(x) is np.ndarray and x.shape == (n,) else np.full(n, missing if x is None else x, dtype)
             for x, n in zip(items, ns, strict=True)]  # fmt: skip
    return np.concatenate(parts).astype(dtype, copy=False)


def _stack(parts: list[np.ndarray], ns: list[int], batched: bool) -> np.ndarray:
    """Per-call outputs as one row per step: batched outputs are joined, a batch-free one repeated per row."""
    if batched:
        return np.concatenate(parts)
    return np.concatenate([np.broadcast_to(p, (n, *p.shape)) for p, n in zip(parts, ns, strict=True)])


class Sink:
    """What must reach the disk even if the ``Recorder`` is never closed: the chunk being filled, the writer thread
    and its queue, the directory's lock. The recorder's finaliser holds this, never the recorder itself."""

    def __init__(
        self, directory: Path, meta: dict[str, Any], next_chunk: int, next_episode: int, lock: int | None,
        max_pending: int, previous: dict[str, Any] | None = None,
    ) -> None:  # fmt: skip
        """``previous``: ``{chunk, sha256}`` of the last chunk already in ``directory`` (a continued recording)."""
        self.directory, self.meta, self.lock = directory, meta, lock
        self.previous = previous  # the chunk written last: the next one names it (the audit checks the chain)
        self.next_chunk, self.next_episode = next_chunk, next_episode
        self.cols: Columns | None = None
        self.names: tuple[str, ...] = ()
        self.batched: dict[str, bool] = {}
        self.errors: list[str] = []  # one line per chunk that could not be written
        self.lost: list[dict[str, Any]] = []  # lost chunks not yet announced in a written chunk's meta
        self.lost_steps = 0
        self.written: set[int] = set()
        self.finished = self.stopping = False
        self.guard = threading.Lock()  # the writer's error and loss lists
        self.mutex = threading.RLock()  # the recorder's calls, and the final hand-over
        self.queue: queue.Queue[Columns | None] = queue.Queue(max_pending)
        self.thread = threading.Thread(target=self._write_loop, name="msrl-field-recorder", daemon=True)
        self.pid = os.getpid()  # a forked child inherits the sink: it never writes or unlocks the parent's recording
        self.thread.start()

    def new_columns(self, inputs: int, outputs: int) -> Columns:
        cols = Columns(self.next_chunk, inputs, outputs)
        self.next_chunk = cols.index + 1
        self.cols = cols
        return cols

    def episode_ids(self, k: int) -> np.ndarray:
        ids = np.arange(self.next_episode, self.next_episode + k, dtype=np.int64)
        self.next_episode += k
        return ids

    def hand_over(self, block: bool = False) -> None:
        """The chunk being filled goes to the writer (or, with the writer ``max_pending`` chunks behind and
        ``block`` false, is dropped and announced in the next chunk). Safe to repeat after an interruption: the
        writer writes an index once."""
        cols = self.cols
        if cols is None:
            return
        cols.sealed = True
        cols.next_episode = self.next_episode
        if cols.n:
            try:
                self.queue.put(cols, block=block)
            except queue.Full:
                self._lose(cols.index, cols.steps, "dropped: the disk fell behind")
        self.cols = None

    def finish(self) -> None:
        """Hand over what is left, stop and join the writer, release the directory (idempotent; nothing in a forked
        child, whose copy has no writer and shares the parent's lock)."""
        if self.finished:
            return
        if os.getpid() != self.pid:
            self.finished = True
            return
        held = self.mutex.acquire(timeout=10)  # a thread stuck in record() must not keep the process from ending
        try:
            if self.cols is not None:
                self.hand_over(block=True)
        finally:
            if held:
                self.mutex.release()
        if not self.stopping:
            self.queue.put(None)
            self.stopping = True
        self.thread.join()
        unlock(self.lock, self.directory)
        self.lock = None
        self.finished = True
        closed(self)

    def summary(self) -> str:
        return (f"recording to {self.directory}: {len(self.errors)} chunk(s) could not be written, {self.lost_steps} "
                f"step(s) lost; first: {self.errors[0]}")  # fmt: skip

    @staticmethod
    def finish_at_exit(sink: Sink) -> None:
        """The finaliser: the process ends (or the recorder is collected) without ``close()``."""
        sink.finish()
        if sink.errors:
            print(f"error: {sink.summary()}", file=sys.stderr, flush=True)

    def _lose(self, index: int, steps: int, why: str) -> None:
        with self.guard:
            self.lost.append({"chunk": index, "steps": steps, "why": why})
            self.lost_steps += steps

    def _write_loop(self) -> None:
        while (cols := self.queue.get()) is not None:
            if cols.index in self.written:
                continue
            steps = cols.steps
            try:
                arrays = cols.arrays(self.names, self.batched)
                with self.guard:
                    lost = list(self.lost)
                meta = {**self.meta, "chunk": cols.index, "steps": len(arrays["time_ns"]),
                        "next_episode": cols.next_episode, "lost": lost, "previous": self.previous,
                        "dropped_steps": sum(e["steps"] for e in lost),
                        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}  # fmt: skip
                path = self.directory / chunk_name(cols.index)
                write_chunk(path, arrays, meta)
                self.previous = {"chunk": cols.index, "sha256": sha256_file(path)}
            except Exception as exc:  # noqa: BLE001 - any failure is the caller's to hear about, never swallowed
                self._lose(cols.index, steps, f"write failed: {first_line(exc)}")
                with self.guard:
                    self.errors.append(f"{chunk_name(cols.index)} ({steps} steps) could not be written: "
                                       f"{type(exc).__name__}: {first_line(exc)}")  # fmt: skip
                continue
            self.written.add(cols.index)
            with self.guard:
                self.lost = [e for e in self.lost if e not in lost]


# -- one recorder per directory ---------------------------------------------------------------------------------
def lock_directory(directory: Path) -> int | None:
    """An exclusive lock on the directory's lock file (which holds the writer's pid), or a one-line UsageError: the
    directory cannot be written, or another recorder holds it."""
    try:
        directory.mkdir(parents=True, exist_ok=True)
        fd = os.open(directory / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as exc:
        raise UsageError(f"cannot record into {directory}: {exc.strerror or first_line(exc)}") from None
    if fcntl is None:
        return fd
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        if os.fstat(fd).st_ino != os.stat(directory / LOCK_FILE).st_ino:  # unlinked by the recorder that just closed
            os.close(fd)
            return lock_directory(directory)
    except FileNotFoundError:  # the same, between our open and our stat
        os.close(fd)
        return lock_directory(directory)
    except BlockingIOError:
        holder = (os.pread(fd, 32, 0).decode(errors="replace").split() or ["unknown"])[0]
        os.close(fd)
        raise UsageError(f"{directory} is being recorded by another recorder (pid {holder}): one recorder per "
                         "directory; close it or record into another directory") from None  # fmt: skip
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    except OSError as exc:
        unlock(fd)
        raise UsageError(f"cannot record into {directory}: {exc.strerror or first_line(exc)}") from None
    return fd


def unlock(fd: int | None, directory: Path | None = None) -> None:
    """Release the lock; with ``directory``, remove its lock file first (while still holding it: a recorder that
    opened the old file meanwhile sees it unlinked and takes a new one, ``lock_directory``)."""
    if fd is None:
        return
    try:
        if directory is not None:
            with contextlib.suppress(OSError):
                os.unlink(directory / LOCK_FILE)
        if fcntl is not None:
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


# -- SIGTERM while recording: end as sys.exit(143) does, so the recording is written --------------------------
_OPEN: dict[int, int] = {}  # open sinks: id -> the pid that owns them


def opened(sink: Sink, handle_sigterm: bool) -> None:
    _OPEN[id(sink)] = sink.pid
    if not handle_sigterm or threading.current_thread() is not threading.main_thread():
        return
    if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        signal.signal(signal.SIGTERM, _on_sigterm)


def closed(sink: Sink) -> None:
    _OPEN.pop(id(sink), None)
    if not _recording() and threading.current_thread() is threading.main_thread() and (
            signal.getsignal(signal.SIGTERM) is _on_sigterm):  # fmt: skip
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


def _recording() -> bool:
    return os.getpid() in _OPEN.values()


def _on_sigterm(signum: int, _frame: object) -> None:
    if not _recording():  # nothing is being recorded (here) any more: SIGTERM's own default action
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)
        return
    raise SystemExit(128 + signum)
