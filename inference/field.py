"""Record what a deployed policy saw and did, on the device (no MindSpore), for an audit against training.

``Recorder`` keeps every act call's graph inputs (observations, noise, carried state), graph outputs, env actions,
timestamps, rewards and episode boundaries in preallocated arrays, and hands each full chunk to a writer thread:
the control loop never waits on the disk. A chunk is one ``chunk-NNNNNN.npz`` (plain arrays, no pickles) written
to a temporary name, flushed to disk and renamed: it is complete or absent, so a process killed mid-write loses at
most that chunk. If the disk falls behind by more than ``max_pending`` chunks, the newest is dropped rather than
blocking, and the next chunk records how many steps were lost (``dropped_steps``).

Chunk layout: ``meta`` (JSON: format, version, manifest_sha256, env_id, graph, runtime, chunk, steps,
dropped_steps, created), ``input/<k>`` (the graph's k-th input, one row per step), ``output/<name>``, ``action``,
``time_ns``, ``episode``, ``env`` (the row of the call: env index in a batched loop), ``reward`` (NaN when not
given), ``done``. ``read_recording`` loads and checks them (``python -m msrl_consistency.verify --audit``).
"""

from __future__ import annotations

import json
import os
import queue
import re
import threading
import time
import zipfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from inference.bundle import Bundle, sha256_file
from inference.errors import UsageError

FORMAT = "msrl-consistency/field-recording"
VERSION = 1
CHUNK = re.compile(r"^chunk-(\d{6})\.npz$")
DEFAULT_CHUNK_STEPS = 16384  # ~1.6 MB of CartPole steps; a killed process loses at most one chunk


class Recorder:
    """Bounded-size rotating chunks of a deployed policy's steps (see the module docstring)."""

    def __init__(
        self, directory: str | os.PathLike[str], bundle: Bundle, graph: str, runtime: str = "lite",
        chunk_steps: int = DEFAULT_CHUNK_STEPS, max_pending: int = 8,
    ) -> None:  # fmt: skip
        if chunk_steps < 1:
            raise UsageError(f"chunk_steps must be >= 1, got {chunk_steps}")
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        existing = [int(m.group(1)) for p in self.directory.iterdir() if (m := CHUNK.match(p.name))]
        self._next_chunk = max(existing, default=-1) + 1  # a recording continues after what is already there
        manifest = bundle.root / "manifest.json"
        self._meta = {"format": FORMAT, "version": VERSION, "manifest_sha256": sha256_file(manifest),
                      "env_id": bundle.env_id, "graph": graph, "runtime": runtime}  # fmt: skip
        self.chunk_steps = chunk_steps
        self.steps = 0  # recorded so far (written or pending)
        self.dropped_steps = 0
        self._dropped_unreported = 0
        self._cols: _Columns | None = None  # the current chunk's calls, column by column
        self._fill = 0
        self._episode = 0
        self._names: tuple[str, ...] | None = None
        self._queue: queue.Queue[tuple[int, _Columns, tuple[str, ...], dict[str, Any]] | None] = queue.Queue(
            max_pending)  # fmt: skip
        self._error: BaseException | None = None
        self._writer = threading.Thread(target=self._write_loop, name="msrl-field-recorder", daemon=True)
        self._writer.start()

    # -- the control loop's side: a few copies and a list append per call, never the disk -----------------
    def record(
        self, inputs: Sequence[np.ndarray], outputs: Mapping[str, np.ndarray], action: np.ndarray,
        reward: np.ndarray | float | None = None, done: np.ndarray | bool | None = None,
    ) -> None:  # fmt: skip
        """One act call: its graph inputs (batch rows), outputs and env actions (rewards and episode ends may
        come later with ``observe``, for the same rows). A call's rows never straddle two chunks."""
        if self._error is not None:
            raise UsageError(f"recording to {self.directory} failed: {self._error}")
        n = len(inputs[0])
        if self._names is None:
            self._names = tuple(outputs)
        elif self._fill + n > self.chunk_steps and self._fill:
            self._hand_over()
        if self._cols is None:
            self._cols = _Columns(len(inputs), len(self._names))
        c = self._cols  # per-field lists of copies: no per-call container for the garbage collector to scan
        for k, x in enumerate(inputs):
            c.inputs[k].append(np.array(x))
        for k, name in enumerate(self._names):
            c.outputs[k].append(np.array(outputs[name]))
        c.action.append(np.array(action))
        c.time_ns.append(time.time_ns())
        c.episode.append(self._episode)
        c.n.append(n)
        c.reward.append(reward)
        c.done.append(done)
        self._fill += n
        self.steps += n

    def observe(self, reward: np.ndarray | float, done: np.ndarray | bool = False) -> None:
        """The env's answer to the last recorded call's actions: its rewards and which episodes ended."""
        if self._cols is not None and self._cols.n:
            self._cols.reward[-1], self._cols.done[-1] = reward, done

    def new_episode(self) -> None:
        """The next calls belong to new episodes (``Policy.reset``)."""
        self._episode += 1

    def close(self) -> None:
        """Write what is left and wait for the writer (idempotent)."""
        if self._writer.is_alive():
            if self._fill:
                self._hand_over(block=True)
            self._queue.put(None)
            self._writer.join()
        if self._error is not None:
            raise UsageError(f"recording to {self.directory} failed: {self._error}")

    def __enter__(self) -> Recorder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- internals ---------------------------------------------------------------------------------------
    def _hand_over(self, block: bool = False) -> None:
        cols, steps = self._cols, self._fill
        meta = {**self._meta, "chunk": self._next_chunk, "steps": steps, "dropped_steps": self._dropped_unreported,
                "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}  # fmt: skip
        try:
            self._queue.put((self._next_chunk, cols, self._names or (), meta), block=block)
            self._next_chunk += 1
            self._dropped_unreported = 0
        except queue.Full:  # the disk is behind: drop this chunk rather than block the control loop
            self.dropped_steps += steps
            self._dropped_unreported += steps
        self._cols, self._fill = None, 0

    def _write_loop(self) -> None:
        while (item := self._queue.get()) is not None:
            index, cols, names, meta = item
            try:
                write_chunk(self.directory / f"chunk-{index:06d}.npz", cols.arrays(names), meta)
            except OSError as exc:  # the loop raises it at its next call
                self._error = exc


class _Columns:
    """One chunk's calls, field by field (copies of what each call was given and what it answered)."""

    def __init__(self, inputs: int, outputs: int) -> None:
        self.inputs: list[list[np.ndarray]] = [[] for _ in range(inputs)]
        self.outputs: list[list[np.ndarray]] = [[] for _ in range(outputs)]
        self.action: list[np.ndarray] = []
        self.time_ns: list[int] = []
        self.episode: list[int] = []
        self.n: list[int] = []
        self.reward: list[Any] = []
        self.done: list[Any] = []

    def arrays(self, names: Sequence[str]) -> dict[str, np.ndarray]:
        """The chunk's arrays, one row per step (in the writer thread, which lets the control loop run between
        columns: each is one C-level join)."""
        ns = self.n
        cols: dict[str, np.ndarray] = {}
        for k, parts in enumerate(self.inputs):
            cols[f"input/{k}"] = _stack(parts, ns)
            time.sleep(0)
        for name, parts in zip(names, self.outputs, strict=True):
            cols[f"output/{name}"] = _stack(parts, ns)
            time.sleep(0)
        cols["action"] = _stack(self.action, ns)
        cols["time_ns"] = np.repeat(np.array(self.time_ns, np.int64), ns)
        cols["episode"] = np.repeat(np.array(self.episode, np.int64), ns)
        cols["env"] = np.concatenate([np.arange(n) for n in ns]) if max(ns) > 1 else np.zeros(len(ns), np.int64)
        time.sleep(0)
        rewards = [np.nan if r is None else r for r in self.reward]
        dones = [False if d is None else d for d in self.done]
        if max(ns) == 1:
            cols["reward"] = np.array(rewards, np.float64).reshape(-1)
            cols["done"] = np.array(dones, bool).reshape(-1)
        else:
            cols["reward"] = _stack([np.asarray(r, np.float64) for r in rewards], ns)
            cols["done"] = _stack([np.asarray(d, bool) for d in dones], ns)
        return cols


def _stack(parts: list[np.ndarray], ns: list[int]) -> np.ndarray:
    """Per-call arrays as one row per step: batched arrays are joined as they are; anything else (a per-call
    scalar, a batch-free output) is repeated for each row of its call."""
    if all(p.ndim and p.shape[0] == n for p, n in zip(parts, ns, strict=True)):
        return np.concatenate(parts)
    return np.concatenate([p if p.ndim and p.shape[0] == n else np.broadcast_to(p, (n, *p.shape))
                           for p, n in zip(parts, ns, strict=True)])  # fmt: skip


def write_chunk(path: Path, arrays: Mapping[str, np.ndarray], meta: Mapping[str, Any]) -> None:
    """One chunk, complete or absent: written under a temporary name, flushed to disk, then renamed."""
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "wb") as fh:
        np.savez(fh, meta=np.array(json.dumps(meta)), **arrays)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


@dataclass
class Recording:
    """Every step of one or more recordings of one graph, in time order."""

    graph: str
    runtime: str
    inputs: list[np.ndarray]
    outputs: dict[str, np.ndarray]
    action: np.ndarray
    time_ns: np.ndarray
    episode: np.ndarray
    env: np.ndarray
    reward: np.ndarray
    done: np.ndarray
    chunks: list[str] = field(default_factory=list)
    dropped_steps: int = 0

    def __len__(self) -> int:
        return len(self.time_ns)

    def episode_returns(self) -> list[tuple[int, int, float]]:
        """(episode, env row, return) of every episode that ended inside the recording with its rewards known."""
        found = []
        keys = np.stack([self.episode, self.env], 1)
        for key in np.unique(keys[self.done], axis=0):
            rows = np.flatnonzero((keys == key).all(1))
            rewards = self.reward[rows]
            if len(rows) and np.isfinite(rewards).all():
                found.append((int(key[0]), int(key[1]), float(rewards.sum())))
        return found


def recording_chunks(paths: Sequence[str | os.PathLike[str]]) -> list[Path]:
    """The chunk files of ``paths`` (recording directories or chunk files), in order."""
    files: list[Path] = []
    for p in map(Path, paths):
        if p.is_dir():
            files += sorted(f for f in p.iterdir() if CHUNK.match(f.name))
        elif p.is_file():
            files.append(p)
        else:
            raise UsageError(f"recording not found: {p}")
    if not files:
        raise UsageError(f"no recorded chunk in {', '.join(map(str, paths))}")
    return files


def read_recording(paths: Sequence[str | os.PathLike[str]], bundle: Bundle) -> Recording:
    """The steps of ``paths`` checked against ``bundle`` (its manifest's sha256); UsageError (exit 2, one line) for
    a file that is not a recording chunk, a truncated one, or one recorded with another bundle or graph."""
    want = sha256_file(bundle.root / "manifest.json")
    parts: list[dict[str, np.ndarray]] = []
    graph = runtime = None
    dropped = 0
    for path in recording_chunks(paths):
        meta, arrays = _read_chunk(path)
        if meta.get("manifest_sha256") != want:
            theirs = str(meta.get("manifest_sha256"))[:12]
            raise UsageError(f"{path} was recorded with another bundle (manifest sha256 {theirs}…), not "
                             f"{bundle.root} ({want[:12]}…)")  # fmt: skip
        if graph is not None and meta["graph"] != graph:
            raise UsageError(f"{path} records graph {meta['graph']!r}, the chunks before it {graph!r}")
        graph, runtime = meta["graph"], meta.get("runtime", "unknown")
        dropped += int(meta.get("dropped_steps", 0))
        parts.append(arrays)
    assert graph is not None and runtime is not None
    if graph not in bundle.graphs:
        raise UsageError(f"the recording's graph {graph!r} is not in {bundle.root}")
    joined = {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}
    order = np.argsort(joined["time_ns"], kind="stable")
    joined = {k: v[order] for k, v in joined.items()}
    n_inputs = sum(k.startswith("input/") for k in joined)
    return Recording(
        graph, runtime, [joined[f"input/{k}"] for k in range(n_inputs)],
        {k.split("/", 1)[1]: v for k, v in joined.items() if k.startswith("output/")}, joined["action"],
        joined["time_ns"], joined["episode"], joined["env"], joined["reward"], joined["done"],
        [str(p) for p in recording_chunks(paths)], dropped,
    )  # fmt: skip


REQUIRED = ("meta", "action", "time_ns", "episode", "env", "reward", "done")


def _read_chunk(path: Path) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    try:
        with np.load(path, allow_pickle=False) as data:
            arrays = {k: data[k] for k in data.files}
    except (zipfile.BadZipFile, EOFError, OSError, ValueError) as exc:
        raise UsageError(f"{path} is not a complete recording chunk ({type(exc).__name__}: {exc})") from None
    missing = [k for k in REQUIRED if k not in arrays] or ([] if any(k.startswith("input/") for k in arrays) else
                                                           ["input/0"])  # fmt: skip
    if missing:
        raise UsageError(f"{path} is not a recording chunk (no {', '.join(missing)})")
    try:
        meta = json.loads(str(arrays.pop("meta")))
    except json.JSONDecodeError:
        raise UsageError(f"{path} is not a recording chunk (unreadable meta)") from None
    if meta.get("format") != FORMAT or meta.get("version") != VERSION:
        raise UsageError(f"{path} is not a {FORMAT} v{VERSION} chunk (format {meta.get('format')!r})")
    steps = len(arrays["time_ns"])
    if any(len(v) != steps for v in arrays.values()):
        raise UsageError(f"{path} is inconsistent: its arrays have different numbers of steps")
    return meta, arrays
