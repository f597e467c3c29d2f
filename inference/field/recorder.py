"""Record what a deployed policy saw and did, on the device (no MindSpore), for an audit against training.

``Recorder`` keeps every act call's graph inputs (as the caller passed them), graph outputs, env action, the host
noise of a host-sampled policy, timestamps, rewards and episode boundaries, and hands each full chunk of
``chunk_steps`` steps to a writer thread: the control loop never waits on the disk. A chunk is written under a
temporary name, flushed and renamed (``inference.bundle.recording``): it is complete or absent.

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
import time
import uuid
import weakref
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from inference.bundle import Bundle, sha256_file
from inference.bundle.recording import Recording, continuation, read_recording, recording_chunks
from inference.bundle.recording.chunk import FORMAT, VERSION, write_chunk
from inference.errors import UsageError, first_line
from inference.field.sink import Sink, lock_directory, opened, unlock

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
        lock = lock_directory(self.directory)
        try:
            next_chunk, next_episode, previous = continuation(self.directory, sha, graph)
            for stale in self.directory.glob(".chunk-*.npz.tmp"):  # a killed writer's (we hold the lock)
                stale.unlink(missing_ok=True)
        except BaseException:
            unlock(lock)
            raise
        entry = bundle.graph(graph)
        self._inputs = [(np.dtype(t["dtype"]), tuple(int(d) for d in t["shape"][1:])) for t in entry["inputs"]]
        # (a dynamic dimension besides the batch, -1, never matches a shape: such calls take the slow check)
        self._batched = {t["name"]: bool(t["shape"]) and int(t["shape"][0]) == -1 for t in entry["outputs"]}
        meta = {"format": FORMAT, "version": VERSION, "manifest_sha256": sha, "env_id": bundle.env_id,
                "graph": graph, "runtime": runtime, "session": uuid.uuid4().hex}  # fmt: skip
        self._sink = Sink(self.directory, meta, next_chunk, next_episode, lock, max_pending, previous)
        self._finalizer = weakref.finalize(self, Sink.finish_at_exit, self._sink)
        self._names = tuple(self._batched)
        self._sink.names, self._sink.batched = self._names, self._batched
        self._layout: list[tuple[np.dtype, tuple[int, ...]]] = []  # the first call's outputs and action
        self._expect: list[tuple[str, tuple[np.dtype, tuple[int, ...]], bool]] = []  # the outputs' layout, per name
        self._reported = 0  # writer errors raised so far
        self.steps = 0  # recorded so far (written or pending)
        self._episode: np.ndarray | None = None  # per row of the calls: its current episode id
        self._fresh: np.ndarray | None = None  # rows whose current episode has no step yet (None: every row has)
        self._done: np.ndarray | None = None  # rows whose last observe() ended their episode
        opened(self._sink, handle_sigterm)

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
        if sink.finished or len(sink.errors) > self._reported or os.getpid() != sink.pid:
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
        cols.n.append(n)  # last: the call counts as recorded once this is appended (see Columns.arrays)
        cols.fill += n
        self.steps += n

    def observe(self, reward: np.ndarray | float, done: np.ndarray | bool | None = None) -> None:
        """The env's answer to the last recorded call: its reward and whether its episode ended, one per row (a
        scalar for a one-row call; ``done`` may be a scalar ``False`` for any call)."""
        with self._sink.mutex:
            self._observe(reward, done)

    def _observe(self, reward: np.ndarray | float, done: np.ndarray | bool | None) -> None:
        sink = self._sink
        if sink.finished or len(sink.errors) > self._reported or os.getpid() != sink.pid:
            self._check_open()
        cols = sink.cols
        if cols is None or cols.sealed or not cols.n:
            raise UsageError("observe() before any act(): there is no action to attach the reward to")
        last, n = len(cols.n) - 1, cols.n[-1]
        if cols.reward[last] is not None:  # the env answers an action once: a second answer would replace the first
            raise UsageError("observe() twice after one act(): the env's answer to that action is already recorded")
        # one row and plain Python numbers (a gymnasium env's answer): no array per call. Both checked, then both
        # kept: an answer refused in part leaves nothing behind.
        value = float(reward) if n == 1 and type(reward) in _NUMBERS else _per_row("reward", reward, n, np.float64)
        if done is None:
            cols.reward[last] = value
            return
        if type(done) in _BOOLS and (n == 1 or not done):
            cols.reward[last], cols.done[last] = value, (bool(done) if n == 1 else None)
            self._done = _ENDED if n == 1 and done else None
            return
        rows = _per_row("done", done, n, bool)
        cols.reward[last], cols.done[last] = value, rows
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
        if os.getpid() != sink.pid:
            raise UsageError(f"this recorder belongs to process {sink.pid}: a forked child cannot record through it "
                             "(its writer thread is the parent's); open a recorder in the child, into another "
                             "directory")  # fmt: skip
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
                x = outputs[name] if name else action
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
            self._expect.append(("", self._layout[-1], True))  # the action
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
