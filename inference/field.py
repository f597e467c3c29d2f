"""Record what a deployed policy saw and did, on the device (no MindSpore), for an audit against training.

``Recorder`` keeps every act call's graph inputs (as the caller passed them), graph outputs, env action, the host
noise of a host-sampled policy, timestamps, rewards and episode boundaries, and hands each full chunk of
``chunk_steps`` steps to a writer thread: the control loop never waits on the disk. A chunk is written under a
temporary name, flushed and renamed (``inference.recording``): it is complete or absent.

Nothing is lost without a word:

* What is recorded reaches the disk on ``close()`` (or the end of a ``with`` block), and also when the process ends
  without it: at interpreter exit (a normal end, an exception, Ctrl-C) and when the recorder is garbage collected.
  A process killed with SIGKILL loses at most the chunk in progress. SIGTERM ends Python without any of this, so
  while a recorder is open and SIGTERM has its default action, the recorder makes SIGTERM end the process as
  ``sys.exit(143)`` does: ``finally`` blocks run and the recording is written (the exit status is 143, as a shell
  reports a SIGTERM). A process with its own SIGTERM handler keeps it and calls ``close()`` from it; a recorder
  opened outside the main thread cannot install a handler (``handle_sigterm=False`` turns it off).
* Any failure of the writer (a full disk, anything else) is raised at the next ``record()``/``observe()`` call and
  again, as one line, by ``close()``, after everything that could be written was written; ``write_errors`` and
  ``dropped_steps`` count them, and the next chunk written names the chunks lost (``meta["lost"]``), so an audit
  tells a lost chunk from a deleted one. If the disk falls more than ``max_pending`` chunks behind, the newest is
  dropped rather than blocking the loop, and counted the same way.
* One recorder per directory: a second one (another process or this one) is refused, naming the other's pid (a
  lock file, released on close and by the system when the process ends). A recorder on a directory that holds a
  recording continues it: chunk indices and episode ids follow the last chunk's, so two runs never merge.

Episodes: every row of a call (the env of a vector env) has its own episode id, unique across rows and runs. A row
whose ``observe(done=...)`` was true starts a new episode at its next step, with or without ``new_episode()``;
``new_episode()`` (``Policy.reset``) starts new episodes for the rows that have steps in their current one.
"""

from __future__ import annotations

import os
import queue
import signal
import sys
import threading
import time
import uuid
import weakref
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from inference.bundle import Bundle, sha256_file
from inference.errors import UsageError, first_line
from inference.recording import (
    FORMAT,
    LOCK_FILE,
    VERSION,
    Recording,
    chunk_name,
    continuation,
    read_recording,
    recording_chunks,
    write_chunk,
)

try:
    import fcntl
except ImportError:  # not POSIX: no lock between recorders
    fcntl = None  # type: ignore[assignment]

__all__ = ["DEFAULT_CHUNK_STEPS", "Recorder", "Recording", "read_recording", "recording_chunks", "write_chunk"]

DEFAULT_CHUNK_STEPS = 16384  # ~1.6 MB of CartPole steps; a killed process loses at most one chunk


class Recorder:
    """Rotating chunks of a deployed policy's steps, written by a thread (see the module docstring)."""

    def __init__(
        self, directory: str | os.PathLike[str], bundle: Bundle, graph: str, runtime: str = "lite",
        chunk_steps: int = DEFAULT_CHUNK_STEPS, max_pending: int = 8, *, handle_sigterm: bool = True,
    ) -> None:  # fmt: skip
        if isinstance(chunk_steps, bool) or not isinstance(chunk_steps, int) or chunk_steps < 1:
            raise UsageError(f"chunk_steps must be an integer >= 1, got {chunk_steps!r}")
        self.directory = Path(directory)
        self.chunk_steps = chunk_steps
        sha = sha256_file(bundle.root / "manifest.json")
        lock = _lock(self.directory)
        try:
            next_chunk, next_episode = continuation(self.directory, sha, graph)
            for stale in self.directory.glob(".chunk-*.npz.tmp"):  # a killed writer's (we hold the lock)
                stale.unlink(missing_ok=True)
        except BaseException:
            _unlock(lock)
            raise
        entry = bundle.graph(graph)
        self._inputs = [(np.dtype(t["dtype"]), tuple(int(d) for d in t["shape"][1:])) for t in entry["inputs"]]
        # (a dynamic dimension besides the batch, -1, never matches a shape: such calls take the slow check)
        self._batched = {t["name"]: bool(t["shape"]) and int(t["shape"][0]) == -1 for t in entry["outputs"]}
        meta = {"format": FORMAT, "version": VERSION, "manifest_sha256": sha, "env_id": bundle.env_id,
                "graph": graph, "runtime": runtime, "session": uuid.uuid4().hex}  # fmt: skip
        self._sink = _Sink(self.directory, meta, next_chunk, next_episode, lock, max_pending)
        self._finalizer = weakref.finalize(self, _Sink.finish_at_exit, self._sink)
        self._names = tuple(self._batched)
        self._sink.names, self._sink.batched = self._names, self._batched
        self._layout: list[tuple[np.dtype, tuple[int, ...]]] = []  # the first call's outputs and action
        self._expect: list[tuple[str, tuple[np.dtype, tuple[int, ...]], bool]] = []  # the outputs' layout, per name
        self._reported = 0  # writer errors raised so far
        self.steps = 0  # recorded so far (written or pending)
        self._episode: np.ndarray | None = None  # per row of the calls: its current episode id
        self._fresh: np.ndarray | None = None  # rows whose current episode has no step yet (None: every row has)
        self._done: np.ndarray | None = None  # rows whose last observe() ended their episode
        _opened(self._sink, handle_sigterm)

    # -- the control loop's side: a few copies and list appends per call, never the disk ----------------------------
    def record(
        self, inputs: Sequence[np.ndarray], outputs: Mapping[str, np.ndarray], action: np.ndarray,
        reward: np.ndarray | float | None = None, done: np.ndarray | bool | None = None,
        host_noise: np.ndarray | None = None,
    ) -> None:  # fmt: skip
        """One act call: its graph inputs (one row per env), outputs and env actions, and ``host_noise`` when a
        host-sampled policy drew its action from noise. Rewards and episode ends come with ``observe`` (or here).
        A call's rows never straddle two chunks."""
        with self._sink.mutex:  # threads sharing a policy record whole calls, one at a time
            self._record(inputs, outputs, action, host_noise)
            if reward is not None or done is not None:
                self._observe(np.nan if reward is None else reward, done)

    def _record(
        self, inputs: Sequence[np.ndarray], outputs: Mapping[str, np.ndarray], action: np.ndarray,
        host_noise: np.ndarray | None,
    ) -> None:  # fmt: skip
        sink = self._sink
        if sink.finished or len(sink.errors) > self._reported:
            self._check_open()
        n = self._check_call(inputs, outputs, action, host_noise)
        cols = sink.cols
        if cols is not None and not cols.sealed and cols.fill and cols.fill + n > self.chunk_steps:
            sink.hand_over()
            cols = None
        if cols is None or cols.sealed:
            cols = sink.new_columns(len(inputs), len(self._names))
        episodes = self._episodes(n)
        for k, x in enumerate(inputs):
            cols.inputs[k].append(np.array(x))
        for k, name in enumerate(self._names):
            cols.outputs[k].append(np.array(outputs[name]))
        cols.action.append(np.array(action))
        cols.host_noise.append(None if host_noise is None else np.array(host_noise, np.float32))
        cols.time_ns.append(time.time_ns())
        cols.episode.append(episodes)
        cols.reward.append(None)
        cols.done.append(None)
        cols.n.append(n)  # last: the call counts as recorded once this is appended (see _Columns.arrays)
        cols.fill += n
        self.steps += n

    def observe(self, reward: np.ndarray | float, done: np.ndarray | bool | None = None) -> None:
        """The env's answer to the last recorded call: its reward and whether its episode ended, one per row (a
        scalar for a one-row call; ``done`` may be a scalar ``False`` for any call)."""
        with self._sink.mutex:
            self._observe(reward, done)

    def _observe(self, reward: np.ndarray | float, done: np.ndarray | bool | None) -> None:
        sink = self._sink
        if sink.finished or len(sink.errors) > self._reported:
            self._check_open()
        cols = sink.cols
        if cols is None or cols.sealed or not cols.n:
            raise UsageError("observe() before any act(): there is no action to attach the reward to")
        last, n = len(cols.n) - 1, cols.n[-1]
        # one row and plain Python numbers (a gymnasium env's answer): no array per call
        cols.reward[last] = float(reward) if n == 1 and type(reward) in _NUMBERS else _per_row("reward", reward, n,
                                                                                               np.float64)  # fmt: skip
        if done is None:
            return
        if type(done) in _BOOLS and (n == 1 or not done):
            cols.done[last] = bool(done) if n == 1 else None
            self._done = _ENDED if n == 1 and done else None
            return
        rows = _per_row("done", done, n, bool)
        cols.done[last] = rows
        self._done = rows if rows.any() else None

    def new_episode(self) -> None:
        """New episodes for every row that has steps in its current one (``Policy.reset``)."""
        with self._sink.mutex:
            self._check_open()
            if self._episode is not None:
                self._advance(self._done)
                self._advance(np.ones(len(self._episode), bool) if self._fresh is None else ~self._fresh)

    def close(self) -> None:
        """Write everything recorded, wait for the writer, release the directory; raise ``UsageError`` (one line) if
        any chunk could not be written."""
        self._sink.finish()
        self._finalizer.detach()
        if self._sink.errors:
            raise UsageError(self._sink.summary())

    @property
    def dropped_steps(self) -> int:
        """Steps that were not written: dropped while the disk was behind, or in a chunk whose write failed."""
        return self._sink.lost_steps

    @property
    def write_errors(self) -> int:
        """Chunks whose write failed."""
        return len(self._sink.errors)

    def __enter__(self) -> Recorder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- internals -----------------------------------------------------------------------------------------------
    def _check_open(self) -> None:
        sink = self._sink
        if sink.finished:
            raise UsageError(f"the recording to {self.directory} is closed")
        if len(sink.errors) > self._reported:
            self._reported = len(sink.errors)
            raise UsageError(f"recording to {self.directory}: {sink.errors[-1]}")

    def _check_call(
        self, inputs: Sequence[np.ndarray], outputs: Mapping[str, np.ndarray], action: np.ndarray,
        host_noise: np.ndarray | None,
    ) -> int:  # fmt: skip
        """The call's rows, when every array has the layout of the graph and of the calls before (a recording keeps
        one): a few attribute compares per array; anything else goes to ``_explain`` for its one-line error."""
        try:
            n = inputs[0].shape[0]
            ok = len(inputs) == len(self._inputs) and n > 0 and (host_noise is None or host_noise.shape[0] == n)
            for x, (dtype, shape) in zip(inputs, self._inputs):  # noqa: B905 - the count was just compared
                ok = ok and x.dtype == dtype and x.shape[0] == n and x.shape[1:] == shape
            for name, (dtype, shape), batched in self._expect:
                x = outputs[name]
                ok = ok and x.dtype == dtype and (x.shape[1:] == shape and x.shape[0] == n if batched else
                                                  x.shape == shape)  # fmt: skip
        except (AttributeError, IndexError, KeyError, TypeError):
            ok = False
        return n if ok and self._expect else self._explain(inputs, outputs, action, host_noise)

    def _explain(
        self, inputs: Sequence[np.ndarray], outputs: Mapping[str, np.ndarray], action: np.ndarray,
        host_noise: np.ndarray | None,
    ) -> int:  # fmt: skip
        """``_check_call``'s slow path: the first call (which sets the layout), dynamic dimensions, or an error."""
        if len(inputs) != len(self._inputs) or not len(inputs):
            raise UsageError(f"record(): the graph takes {len(self._inputs)} input(s), got {len(inputs)}")
        n = np.shape(inputs[0])[0] if np.ndim(inputs[0]) else 0
        for k, (x, (dtype, shape)) in enumerate(zip(inputs, self._inputs, strict=True)):
            got = np.shape(x)
            if getattr(x, "dtype", None) != dtype or len(got) != len(shape) + 1 or got[0] != n or any(
                    w >= 0 and w != g for w, g in zip(shape, got[1:], strict=True)):  # fmt: skip
                raise UsageError(f"record(): input {k} is {getattr(x, 'dtype', type(x).__name__)}{list(got)}, the "
                                 f"graph takes {dtype}[{n}, {', '.join(map(str, shape))}]")  # fmt: skip
        if n < 1:
            raise UsageError("record(): a call without rows")
        missing = [k for k in self._names if k not in outputs]
        if missing:
            raise UsageError(f"record(): the outputs lack {', '.join(map(repr, missing))}")
        if not self._layout:
            self._layout = [_signature(np.asarray(outputs[k]), n, self._batched[k]) for k in self._names]
            self._layout.append(_signature(np.asarray(action), n, True))
            self._expect = [(k, want, self._batched[k]) for k, want in zip(self._names, self._layout, strict=False)]
        arrays = [*(outputs[k] for k in self._names), action]
        labels = [*(f"output {k!r}" for k in self._names), "action"]
        for x, label, want, batched in zip(arrays, labels, self._layout, [*self._batched.values(), True], strict=True):
            x = np.asarray(x)
            if _signature(x, n, batched) != want or (batched and (not x.ndim or x.shape[0] != n)):
                raise UsageError(f"record(): {label} is {x.dtype}{list(x.shape)} for {n} row(s); the calls before "
                                 f"gave {want[0]}[rows, {', '.join(map(str, want[1]))}]")  # fmt: skip
        if host_noise is not None and np.shape(host_noise)[:1] != (n,):
            raise UsageError(f"record(): host_noise has shape {list(np.shape(host_noise))} for {n} row(s)")
        return n

    def _episodes(self, n: int) -> np.ndarray | np.int64:
        """The episode id of each row of this call (a row whose episode ended starts a new one here)."""
        if self._episode is None or len(self._episode) != n:  # another batch: every row starts an episode
            self._episode = self._sink.episode_ids(n)
        elif self._done is not None:
            self._advance(self._done)
        self._done = self._fresh = None
        return self._episode[0] if n == 1 else self._episode.copy()

    def _advance(self, rows: np.ndarray | None) -> None:
        """New episodes for ``rows`` (a mask over the rows of the calls)."""
        if rows is None or self._episode is None or len(rows) != len(self._episode) or not rows.any():
            return
        at = np.flatnonzero(rows)
        self._episode[at] = self._sink.episode_ids(len(at))
        if self._fresh is None:
            self._fresh = np.zeros(len(self._episode), bool)
        self._fresh[at] = True
        if rows is self._done:
            self._done = None


_NUMBERS = (float, int, np.float64, np.float32, np.int64, np.int32)
_BOOLS = (bool, np.bool_)
_ENDED = np.ones(1, bool)  # the one row of a one-row call ended its episode


def _signature(x: np.ndarray, n: int, batched: bool) -> tuple[np.dtype, tuple[int, ...]]:
    return x.dtype, (x.shape[1:] if batched and x.ndim and x.shape[0] == n else x.shape)


def _per_row(what: str, value: Any, n: int, dtype: type) -> np.ndarray:
    """``value`` as one entry per row of an ``n``-row call; a scalar only for one row (or a ``False`` done)."""
    if type(value) is np.ndarray and value.dtype == dtype and value.shape == (n,):  # a vector env's answer
        return value.copy()
    try:
        x = np.asarray(value)
    except (TypeError, ValueError) as exc:
        raise UsageError(f"observe(): {what} is not an array ({first_line(exc)})") from None
    kinds = "biuf" if dtype is np.float64 else "biu"
    if x.dtype.kind not in kinds:
        raise UsageError(f"observe(): {what} is {x.dtype}, expected numbers")
    if dtype is bool and x.dtype.kind != "b" and not np.isin(x, (0, 1)).all():
        raise UsageError(f"observe(): {what} holds values other than 0 and 1")
    if x.shape == (n,):
        return np.array(x, dtype)
    if x.shape == () and (n == 1 or (dtype is bool and not x)):
        return np.full(n, x, dtype)
    raise UsageError(f"observe(): {what} has shape {list(x.shape)}, the last act() had {n} row(s): give one "
                     f"{what} per row")  # fmt: skip


class _Columns:
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


class _Sink:
    """What must reach the disk even if the ``Recorder`` is never closed: the chunk being filled, the writer thread
    and its queue, the directory's lock. The recorder's finaliser holds this, never the recorder itself."""

    def __init__(
        self, directory: Path, meta: dict[str, Any], next_chunk: int, next_episode: int, lock: int | None,
        max_pending: int,
    ) -> None:  # fmt: skip
        self.directory, self.meta, self.lock = directory, meta, lock
        self.next_chunk, self.next_episode = next_chunk, next_episode
        self.cols: _Columns | None = None
        self.names: tuple[str, ...] = ()
        self.batched: dict[str, bool] = {}
        self.errors: list[str] = []  # one line per chunk that could not be written
        self.lost: list[dict[str, Any]] = []  # lost chunks not yet announced in a written chunk's meta
        self.lost_steps = 0
        self.written: set[int] = set()
        self.finished = self.stopping = False
        self.guard = threading.Lock()  # the writer's error and loss lists
        self.mutex = threading.RLock()  # the recorder's calls, and the final hand-over
        self.queue: queue.Queue[_Columns | None] = queue.Queue(max_pending)
        self.thread = threading.Thread(target=self._write_loop, name="msrl-field-recorder", daemon=True)
        self.thread.start()

    def new_columns(self, inputs: int, outputs: int) -> _Columns:
        cols = _Columns(self.next_chunk, inputs, outputs)
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
        """Hand over what is left, stop and join the writer, release the directory (idempotent)."""
        if self.finished:
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
        _unlock(self.lock)
        self.lock = None
        self.finished = True
        _closed(self)

    def summary(self) -> str:
        return (f"recording to {self.directory}: {len(self.errors)} chunk(s) could not be written, {self.lost_steps} "
                f"step(s) lost; first: {self.errors[0]}")  # fmt: skip

    @staticmethod
    def finish_at_exit(sink: _Sink) -> None:
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
                        "next_episode": cols.next_episode, "lost": lost,
                        "dropped_steps": sum(e["steps"] for e in lost),
                        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}  # fmt: skip
                write_chunk(self.directory / chunk_name(cols.index), arrays, meta)
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
def _lock(directory: Path) -> int | None:
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
    except BlockingIOError:
        holder = (os.pread(fd, 32, 0).decode(errors="replace").split() or ["unknown"])[0]
        os.close(fd)
        raise UsageError(f"{directory} is being recorded by another recorder (pid {holder}): one recorder per "
                         "directory; close it or record into another directory") from None  # fmt: skip
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    except OSError as exc:
        _unlock(fd)
        raise UsageError(f"cannot record into {directory}: {exc.strerror or first_line(exc)}") from None
    return fd


def _unlock(fd: int | None) -> None:
    if fd is None:
        return
    try:
        if fcntl is not None:
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


# -- SIGTERM while recording: end as sys.exit(143) does, so the recording is written --------------------------
_OPEN: set[int] = set()


def _opened(sink: _Sink, handle_sigterm: bool) -> None:
    _OPEN.add(id(sink))
    if not handle_sigterm or threading.current_thread() is not threading.main_thread():
        return
    if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        signal.signal(signal.SIGTERM, _on_sigterm)


def _closed(sink: _Sink) -> None:
    _OPEN.discard(id(sink))
    if not _OPEN and threading.current_thread() is threading.main_thread() and (
            signal.getsignal(signal.SIGTERM) is _on_sigterm):  # fmt: skip
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


def _on_sigterm(signum: int, _frame: object) -> None:
    if not _OPEN:  # nothing is being recorded any more: SIGTERM's own default action
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)
        return
    raise SystemExit(128 + signum)
