"""The field recording on disk: chunks written by ``inference.field.Recorder``, indexed and checked here.

A recording is a directory of ``chunk-NNNNNN.npz`` files (plain arrays, never pickles), numbered from 0 without a
gap; a continued recording (another process recording into the same directory) numbers its chunks and episodes
after what is there, so it is one sequence. Each chunk holds:

* ``meta``: a JSON object: ``format``, ``version``, ``manifest_sha256`` (the bundle the device ran), ``env_id``,
  ``graph``, ``runtime``, ``session`` (one id per recorder), ``chunk`` (its index), ``steps``, ``next_episode``
  (the episode counter after its steps), ``lost`` (chunks of this directory the recorder could not write since its
  previous chunk: ``{chunk, steps, why}``), ``dropped_steps`` (their steps), ``created`` and, from version 3,
  ``previous`` (``{chunk, sha256}`` of the chunk file written before it in the directory, by this recorder or the one
  it continued; null for the first): the chain that tells a chunk spliced in from another recording of the same
  bundle;
* one row per step: ``input/<k>`` (the graph's k-th input), ``output/<name>``, ``action`` (the env action taken),
  ``host_noise`` (the noise a host-sampled policy drew; NaN rows: no noise), ``time_ns``, ``episode`` (unique per
  episode across the rows of a vector env), ``env`` (the row of the call), ``reward`` (NaN when not given), ``done``.

``index_recording`` reads only the metas and the arrays' headers (``recording_chunk``, the chunk's file format), so
every chunk of a recording is checked (fields, dtypes, shapes, indices complete and unique) before any work;
``read_chunk`` then loads one chunk at a time. Any fault is a ``UsageError`` of one line naming the chunk and the
field.
"""

from __future__ import annotations

import os
import zipfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from inference.bundle import Bundle, sha256_file
from inference.bundle.recording.chunk import CHUNK, STEP_FIELDS, chunk_headers, chunk_name
from inference.errors import UsageError, first_line


# -- what a chunk must hold for one graph of a bundle ------------------------------------------------------------
@dataclass(frozen=True)
class Layout:
    """The arrays a chunk of ``graph`` holds: per field its dtype and its shape after the step dimension (None: any
    size), and which fields may be absent."""

    graph: str
    fields: dict[str, tuple[np.dtype, tuple[int | None, ...]]]
    optional: frozenset[str]
    discrete: bool
    batched: dict[str, bool]  # output -> one row per step (False: the graph's output ignores the batch)

    @classmethod
    def of(cls, bundle: Bundle, graph: str) -> Layout:
        entry, contract = bundle.graph(graph), bundle.contract(graph)
        fields: dict[str, tuple[np.dtype, tuple[int | None, ...]]] = dict(STEP_FIELDS)
        for k, meta in enumerate(entry["inputs"]):
            fields[f"input/{k}"] = (np.dtype(meta["dtype"]), _trailing(meta["shape"]))
        batched, dummy = {}, {}
        for meta in entry["outputs"]:
            shape = [int(d) for d in meta["shape"]]
            batched[meta["name"]] = bool(shape) and shape[0] == -1
            trailing = _trailing(shape) if batched[meta["name"]] else tuple(shape)
            fields[f"output/{meta['name']}"] = (np.dtype(meta["dtype"]), trailing)
            dummy[meta["name"]] = np.zeros((1, *[d or 1 for d in trailing]) if batched[meta["name"]] else
                                           [d if d > 0 else 1 for d in shape], meta["dtype"])  # fmt: skip
        action = np.asarray(contract.env_action(dummy))
        discrete = contract.action.is_discrete
        fields["action"] = (action.dtype, action.shape[1:])
        optional = set()
        if contract.samples_on_host:
            fields["host_noise"] = (np.dtype(np.float32), (bundle.noise_dim(graph),))
            optional.add("host_noise")
        return cls(graph, fields, frozenset(optional), discrete, batched)

    def check(self, path: Path, headers: Mapping[str, tuple[tuple[int, ...], np.dtype]], steps: int) -> None:
        """Every field present with its dtype and ``[steps, *shape]``; nothing else (UsageError naming the field)."""
        for name, (dtype, shape) in self.fields.items():
            if name not in headers:
                if name in self.optional:
                    continue
                raise UsageError(f"{path}: no field {name!r} (a chunk of graph {self.graph!r} holds "
                                 f"{', '.join(self.fields)})")  # fmt: skip
            got_shape, got_dtype = headers[name]
            if not self._dtype_ok(name, dtype, got_dtype):
                raise UsageError(f"{path}: field {name!r} is {got_dtype}, expected {dtype}")
            if len(got_shape) != 1 + len(shape) or got_shape[0] != steps or any(
                    w is not None and w != g for w, g in zip(shape, got_shape[1:], strict=True)):  # fmt: skip
                want = ", ".join(["steps", *("*" if d is None else str(d) for d in shape)])
                raise UsageError(f"{path}: field {name!r} has shape {list(got_shape)}, expected [{want}] with "
                                 f"{steps} steps (meta 'steps')")  # fmt: skip
        extra = sorted(set(headers) - set(self.fields))
        if extra:
            raise UsageError(f"{path}: field {extra[0]!r} is not part of a recording of graph {self.graph!r}")

    def _dtype_ok(self, name: str, want: np.dtype, got: np.dtype) -> bool:
        if name == "action" and self.discrete:  # the env action's integer type is the caller's
            return got.kind in "iu"
        return got == want


def _trailing(shape: Sequence[int]) -> tuple[int | None, ...]:
    return tuple(None if int(d) < 0 else int(d) for d in list(shape)[1:])


# -- the index of a recording: every chunk checked, in order -----------------------------------------------------
@dataclass
class ChunkInfo:
    path: Path
    recording: Path | None  # the recording directory, None for a chunk named on its own
    index: int
    steps: int
    meta: dict[str, Any]

    @property
    def session(self) -> str:
        return str(self.meta.get("session") or f"v1:{self.recording or self.path}")


@dataclass
class RecordingIndex:
    """The chunks of one or more recordings of one graph, checked and in order (recording by recording, each by
    index), with what the recorders said they lost."""

    graph: str
    layout: Layout
    chunks: list[ChunkInfo]
    recordings: list[dict[str, Any]] = field(default_factory=list)  # per path: chunks, sessions, lost

    @property
    def steps(self) -> int:
        return sum(c.steps for c in self.chunks)

    @property
    def runtimes(self) -> list[str]:
        return sorted({str(c.meta["runtime"]) for c in self.chunks})

    @property
    def dropped_steps(self) -> int:
        return sum(int(c.meta.get("dropped_steps", 0)) for c in self.chunks)

    @property
    def lost(self) -> list[dict[str, Any]]:
        return [{"recording": str(c.recording or c.path.parent), **entry} for c in self.chunks
                for entry in c.meta.get("lost", [])]  # fmt: skip

    @property
    def sessions(self) -> int:
        return len({c.session for c in self.chunks})


def index_recording(paths: Sequence[str | os.PathLike[str]], bundle: Bundle) -> RecordingIndex:
    """Every chunk of ``paths`` (recording directories, or chunk files named on their own) checked against
    ``bundle`` before any work: the manifest it was recorded with, one graph, each chunk's meta and fields, and per
    directory indices from 0 without a gap (except chunks the recorder said it lost) and no chunk twice."""
    want = sha256_file(bundle.root / "manifest.json")
    chunks: list[ChunkInfo] = []
    recordings = []
    graph = layout = None
    seen: dict[tuple[str, int], Path] = {}
    for given in map(Path, paths):
        if given.is_dir():
            files = sorted((int(m.group(1)), given / m.group(0)) for p in given.iterdir() if (m := CHUNK.match(p.name)))
            if not files:
                raise UsageError(f"no recorded chunk in {given} (chunk-NNNNNN.npz files)")
        elif given.is_file():
            m = CHUNK.match(given.name)
            files = [(int(m.group(1)) if m else -1, given)]
        else:
            raise UsageError(f"recording not found: {given}")
        mine = []
        for number, path in files:
            meta, headers = chunk_headers(path)
            if meta["manifest_sha256"] != want:
                raise UsageError(f"{path} was recorded with another bundle (manifest sha256 "
                                 f"{meta['manifest_sha256'][:12]}…), not {bundle.root} ({want[:12]}…)")  # fmt: skip
            if graph is None:
                if meta["graph"] not in bundle.graphs:
                    raise UsageError(f"{path} records graph {meta['graph']!r}, which is not in {bundle.root}")
                graph, layout = meta["graph"], Layout.of(bundle, meta["graph"])
            elif meta["graph"] != graph:
                raise UsageError(f"{path} records graph {meta['graph']!r}, the chunks before it {graph!r}")
            assert layout is not None
            layout.check(path, headers, meta["steps"])
            if number >= 0 and meta["chunk"] != number:
                raise UsageError(f"{path} holds chunk {meta['chunk']} of its recording, not {number}: a copied or "
                                 "renamed chunk")  # fmt: skip
            info = ChunkInfo(path, given if given.is_dir() else None, meta["chunk"], meta["steps"], meta)
            key = (info.session, info.index)
            if key in seen:
                raise UsageError(f"{path} and {seen[key]} are the same chunk ({info.index} of one recording "
                                 "session): a chunk is audited once")  # fmt: skip
            seen[key] = path
            mine.append(info)
        if given.is_dir():
            _check_complete(given, mine)
        _check_chain(mine)
        chunks += mine
        recordings.append({"path": str(given), "chunks": len(mine), "steps": sum(c.steps for c in mine),
                           "sessions": len({c.session for c in mine}),
                           "lost": [e for c in mine for e in c.meta.get("lost", [])]})  # fmt: skip
    assert graph is not None and layout is not None
    return RecordingIndex(graph, layout, chunks, recordings)


def _check_chain(chunks: list[ChunkInfo]) -> None:
    """Each chunk that names the chunk written before it (``previous``) follows that very file, where it is among
    ``chunks``: a chunk of another recording of the same bundle, copied in under the right name, breaks the chain."""
    files = {c.index: c.path for c in chunks}
    hashes: dict[int, str] = {}
    for c in chunks:
        previous = c.meta.get("previous")
        if previous is None or previous["chunk"] not in files:
            continue
        index = previous["chunk"]
        hashes[index] = hashes.get(index) or sha256_file(files[index])
        if hashes[index] != previous["sha256"]:
            raise UsageError(f"{c.path} does not follow {files[index].name} here: it was written after a chunk with "
                             f"sha256 {previous['sha256'][:12]}…, this one's is {hashes[index][:12]}… (a chunk of "
                             "another recording, copied in under its name)")  # fmt: skip


def _check_complete(directory: Path, chunks: list[ChunkInfo]) -> None:
    """Indices 0..last, each once; a chunk the recorder announced as lost may be absent."""
    present = {c.index for c in chunks}
    lost = {e["chunk"] for c in chunks for e in c.meta.get("lost", [])}
    missing = sorted(set(range(max(present) + 1)) - present - lost)
    if missing:
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        raise UsageError(f"{directory}: {chunk_name(missing[0])} is missing{more}: the recording holds chunks "
                         f"0-{max(present)} with a gap (a deleted or uncopied chunk); name the chunk files themselves "
                         "to audit only those")  # fmt: skip


# -- one chunk's data ---------------------------------------------------------------------------------------------
@dataclass
class Chunk:
    """One chunk's steps (``read_chunk``)."""

    info: ChunkInfo
    inputs: list[np.ndarray]
    outputs: dict[str, np.ndarray]
    action: np.ndarray
    host_noise: np.ndarray | None
    time_ns: np.ndarray
    episode: np.ndarray
    env: np.ndarray
    reward: np.ndarray
    done: np.ndarray

    def __len__(self) -> int:
        return len(self.time_ns)


def read_chunk(info: ChunkInfo, layout: Layout) -> Chunk:
    """The arrays of an indexed chunk (its headers were checked by ``index_recording``; a file changed since is
    checked again)."""
    try:
        with np.load(info.path, allow_pickle=False) as data:
            arrays = {k: data[k] for k in data.files if k != "meta"}
    except (zipfile.BadZipFile, EOFError, OSError, ValueError, KeyError) as exc:
        raise UsageError(f"{info.path} is not a complete recording chunk ({type(exc).__name__}: "
                         f"{first_line(exc)})") from None  # fmt: skip
    layout.check(info.path, {k: (v.shape, v.dtype) for k, v in arrays.items()}, info.steps)
    _check_steps(info.path, arrays)
    inputs = [arrays[f"input/{k}"] for k in range(sum(k.startswith("input/") for k in arrays))]
    outputs = {k.split("/", 1)[1]: v for k, v in arrays.items() if k.startswith("output/")}
    return Chunk(info, inputs, outputs, arrays["action"], arrays.get("host_noise"), arrays["time_ns"],
                 arrays["episode"], arrays["env"], arrays["reward"], arrays["done"])  # fmt: skip


MAX_TIME_NS = 1 << 62  # the year 2116: a recorder's clock never reads this, nor 0 or less


def _check_steps(path: Path, arrays: Mapping[str, np.ndarray]) -> None:
    """Values no recorder writes: a negative episode id or env row, a timestamp at or before 1970 or past 2116."""
    for name in ("episode", "env"):
        if len(arrays[name]) and int(arrays[name].min()) < 0:
            step = int(np.argmax(arrays[name] < 0))
            raise UsageError(f"{path}: field {name!r} is {int(arrays[name][step])} at step {step}: a recorder numbers "
                             f"them from 0")  # fmt: skip
    time_ns = arrays["time_ns"]
    bad = (time_ns <= 0) | (time_ns >= MAX_TIME_NS)
    if bad.any():
        step = int(np.argmax(bad))
        raise UsageError(f"{path}: field 'time_ns' is {int(time_ns[step])} at step {step}, not a time a recorder's "
                         "clock gives (after 1970, before 2116)")  # fmt: skip


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


# -- a whole recording in memory (small recordings, tests; the audit streams chunk by chunk) ---------------------
@dataclass
class Recording:
    """Every step of one or more recordings of one graph, in order."""

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
    host_noise: np.ndarray | None = None
    chunks: list[str] = field(default_factory=list)
    dropped_steps: int = 0

    def __len__(self) -> int:
        return len(self.time_ns)

    def episode_returns(self) -> list[tuple[int, int, float]]:
        """(episode, env row, return) of every episode that ended inside the recording with its rewards known."""
        found = []
        keys = np.stack([self.episode, self.env], 1)  # (an episode id is per row since version 2; not in version 1)
        for key in np.unique(keys[self.done], axis=0):
            rows = np.flatnonzero((keys == key).all(1))
            rewards = self.reward[rows]
            if np.isfinite(rewards).all():
                found.append((int(key[0]), int(key[1]), float(rewards.sum())))
        return found


def read_recording(paths: Sequence[str | os.PathLike[str]], bundle: Bundle) -> Recording:
    """The steps of ``paths`` checked against ``bundle`` (``index_recording``), joined in memory."""
    index = index_recording(paths, bundle)
    parts = [read_chunk(info, index.layout) for info in index.chunks]
    join = lambda get: np.concatenate([get(p) for p in parts])  # noqa: E731
    noise = None
    if any(p.host_noise is not None for p in parts):
        width = next(p.host_noise for p in parts if p.host_noise is not None).shape[1]
        noise = join(lambda p: p.host_noise if p.host_noise is not None else np.full((len(p), width), np.nan,
                                                                                      np.float32))  # fmt: skip
    return Recording(
        index.graph, "+".join(index.runtimes), [join(lambda p, k=k: p.inputs[k]) for k in range(len(parts[0].inputs))],
        {name: join(lambda p, n=name: p.outputs[n]) for name in parts[0].outputs}, join(lambda p: p.action),
        join(lambda p: p.time_ns), join(lambda p: p.episode), join(lambda p: p.env), join(lambda p: p.reward),
        join(lambda p: p.done), noise, [str(c.path) for c in index.chunks], index.dropped_steps,
    )  # fmt: skip


def continuation(directory: Path, manifest_sha256: str, graph: str) -> tuple[int, int, dict[str, Any] | None]:
    """Where a recorder continues a recording in ``directory``: the next chunk index, the next episode id (after
    the last chunk's) and the last chunk's ``{chunk, sha256}`` (what the next chunk's ``previous`` names). A
    directory holding another bundle's or graph's recording is refused."""
    numbers = [int(m.group(1)) for p in directory.iterdir() if (m := CHUNK.match(p.name))]
    if not numbers:
        return 0, 0, None
    last = directory / chunk_name(max(numbers))
    meta, _ = chunk_headers(last)
    if meta["manifest_sha256"] != manifest_sha256:
        raise UsageError(f"{directory} holds a recording of another bundle (manifest sha256 "
                         f"{meta['manifest_sha256'][:12]}…): record into another directory")  # fmt: skip
    if meta["graph"] != graph:
        raise UsageError(f"{directory} holds a recording of graph {meta['graph']!r}, this policy acts with {graph!r}: "
                         "record into another directory")  # fmt: skip
    previous = {"chunk": max(numbers), "sha256": sha256_file(last)}
    if "next_episode" in meta:
        return max(numbers) + 1, int(meta["next_episode"]), previous
    try:
        with np.load(last, allow_pickle=False) as data:
            episodes = data["episode"]
    except (zipfile.BadZipFile, EOFError, OSError, ValueError, KeyError) as exc:
        raise UsageError(f"{last}: cannot read its episodes to continue the recording ({first_line(exc)})") from None
    return max(numbers) + 1, int(episodes.max(initial=-1)) + 1, previous
