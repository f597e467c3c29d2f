"""Audit a field recording against the training path: verify's own comparison, with the device as the runtime.

The audit streams the recording one chunk at a time, so its memory is bounded by a chunk whatever the recording's
length: each chunk's recorded inputs (observations, the noise the device fed, carried states) become the feeds, the
caller's ``reference`` gives the training path's outputs on them, and the device is a runtime answering with what
it recorded (``RecordedRuntime``). verify's comparison (``runtime_check.check_runtime``: statistics, flips,
policy-level metrics, NaN propagation, the stage diagnosis) runs on each chunk and its checks are merged into the
recording's (``audit_merge``: counts summed, extremes kept, rate verdicts taken again on the merged counts, the worst
chunk's diagnosis). Comparing per chunk with verify's own code, rather than keeping per-step summaries for one
comparison at the end, keeps the report verify's without a second implementation of it; the price is that a
tolerance growing with magnitude pools the ordinary rows of each chunk (16,384 steps by default), not of the whole
recording, and two statistics are the worst chunk's (``audit_merge``). Only small facts outlive a chunk: the steps
where the decision output differs most (8 rows, for the layer localisation at the end), per-window and
per-dimension counters, the returns of ended episodes.

On top of verify: the recorded env actions against the training path's (``field.actions``), the steps with NaN or
inf observations and what the device did there (``field.nonfinite_observations``), the error per time window
(``field.drift``), the observations against training's statistics (``field.out_of_distribution``), the episodes'
returns (``field.returns``) and the recording itself: chunks complete, sessions, what the recorder lost
(``field.recording``). Nothing here imports MindSpore: the caller brings the reference.
"""

from __future__ import annotations

import dataclasses
import heapq
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from inference.bundle import Bundle
from inference.bundle.contract import state_dtype
from inference.bundle.recording import Chunk, RecordingIndex, read_chunk
from inference.compare.audit.actions import Actions
from inference.compare.audit.field_checks import NonFinite, Ranges, Returns, Window, Windows, decision_errors
from inference.compare.audit.merge import ObservationMerge
from inference.compare.checks import Check, VerifyResult
from inference.compare.feeds import Feeds, finite_rows
from inference.compare.inputs import Inputs
from inference.compare.judge.localize import Localization, Localizer
from inference.compare.judge.stats import PRESETS, TOLERANCE_PRESETS, Tolerance, tolerance_for
from inference.compare.options import LOCALIZE_STAGES, VerifyOptions
from inference.compare.reference import REFERENCE, Reference
from inference.compare.runtime_check import check_runtime
from inference.compare.verifier import _provenance
from inference.errors import INTERRUPTS, UsageError
from inference.runtimes.base import InferenceFailed, Runtime, RuntimeSource

FIELD = "field"
WORST_ROWS = 8  # rows a localisation runs on, as verify's
Reference_fn = Callable[[Chunk], Mapping[str, np.ndarray]]


def only_graph(bundle: Bundle, graph: str) -> Bundle:
    """The bundle as if it held only ``graph`` (the one the device ran and recorded)."""
    manifest = dict(bundle.manifest)
    manifest["graphs"] = {graph: bundle.manifest["graphs"][graph]}
    return dataclasses.replace(bundle, manifest=manifest)


def chunk_feeds(bundle: Bundle, graph: str, chunk: Chunk) -> Feeds:
    """A chunk's graph inputs as verify's feeds: observation rows (labelled ``recorded``; a row with NaN ``nan``, with
    ±inf ``edge``: judged on its own magnitude), the noise fed or drawn on the host, the carried states."""
    contract = bundle.contract(graph)
    n, k = len(chunk), len(contract.observations)
    if contract.obs_dict:
        obs = contract.empty_observations(n)
        for f, x in zip(contract.observations, chunk.inputs[:k], strict=True):
            obs[f.name] = x
    else:
        obs = chunk.inputs[0]
    noise = {}
    if contract.takes_noise:
        noise[graph] = chunk.inputs[k]
    elif chunk.host_noise is not None and np.isfinite(chunk.host_noise).all():
        noise[graph] = chunk.host_noise
    k += int(contract.takes_noise)
    state = None
    if contract.states:
        state = np.zeros(n, state_dtype(contract.states))
        for s, x in zip(contract.states, chunk.inputs[k:], strict=True):
            state[s.name] = x
    source = np.full(n, "recorded", dtype=object)
    inf = np.zeros(n, bool)
    for x in chunk.inputs[: len(contract.observations)]:
        if x.dtype.kind == "f":
            inf |= np.isinf(x.reshape(n, -1)).any(1)
    source[inf] = "edge"
    source[~finite_rows(obs)] = "nan"
    return Feeds(obs, source.astype(str), noise, state)


class RecordedRuntime(Runtime):
    """The device, as recorded: asked for a chunk's inputs (or their first rows), it answers what it answered."""

    name = FIELD
    description = "the outputs a deployed runtime recorded (inference.field)"

    def __init__(self, source: RuntimeSource, graph: str, chunk: Chunk, batched: Mapping[str, bool]) -> None:
        super().__init__(source, graph)
        self.chunk, self.batched = chunk, batched
        self._index: dict[bytes, list[int]] | None = None  # a row's input bytes -> the recorded rows that have them

    def _load(self) -> None:
        return None

    def _run(self, arrays: list[np.ndarray]) -> list[np.ndarray]:
        rows = self._recorded_rows(arrays)
        out = self.chunk.outputs
        return [out[o.name][rows] if self.batched.get(o.name, True) else out[o.name][0] for o in self.outputs]

    def _recorded_rows(self, arrays: list[np.ndarray]) -> np.ndarray:
        """The recorded row of every requested row: verify asks in chunks of any size (its last one filled up with
        copies of its own rows), always with rows the device saw; equal rows are taken in recorded order."""
        if len(arrays) != len(self.chunk.inputs):
            raise InferenceFailed(f"{FIELD}: {len(arrays)} inputs asked, {len(self.chunk.inputs)} recorded")
        if self._index is None:
            self._index = {}
            for i, key in enumerate(_row_keys(self.chunk.inputs)):
                self._index.setdefault(key, []).append(i)
        rows, last = [], -1
        for j, key in enumerate(_row_keys(arrays)):
            seen = self._index.get(key)
            if seen is None:
                raise InferenceFailed(f"{FIELD}: row {j} of the request is not one the device recorded (only those "
                                      "rows answer)")  # fmt: skip
            last = next((i for i in seen if i > last), seen[0])
            rows.append(last)
        return np.asarray(rows, dtype=np.int64)

    def versions(self) -> dict[str, Any]:
        return {"recorded_by": self.chunk.info.meta["runtime"], "chunk": self.chunk.info.path.name}


def _row_keys(arrays: Sequence[np.ndarray]) -> list[bytes]:
    """Each row's bytes over every input (NaN rows match by their bits)."""
    n = len(arrays[0])
    if n == 0:
        return []
    flat = [np.ascontiguousarray(x).reshape(n, -1).view(np.uint8).reshape(n, -1) for x in arrays]
    return [b"".join(x[i].tobytes() for x in flat) for i in range(n)]


@dataclass
class StepCount:
    """What a streamed audit's report says of its feeds: how many steps were compared."""

    steps: int

    def __len__(self) -> int:
        return self.steps


@dataclass
class AuditFacts:
    """What an audit adds to verify's result (``audit.json`` and the timeline plot)."""

    steps: int
    chunks: int
    recorded_by: str
    dropped_steps: int
    sessions: int = 1
    recordings: list[dict[str, Any]] = field(default_factory=list)
    lost: list[dict[str, Any]] = field(default_factory=list)
    windows: list[Window] = field(default_factory=list)
    actions: dict[str, Any] = field(default_factory=dict)
    nonfinite: dict[str, Any] = field(default_factory=dict)
    ood: dict[str, Any] = field(default_factory=dict)
    returns: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["windows"] = [w.to_dict() for w in self.windows]
        return out


class _WorstRows:
    """The ordinary steps where the decision output differs most, with their graph inputs (a localisation's rows)."""

    def __init__(self) -> None:
        self.heap: list[tuple[float, int, list[np.ndarray]]] = []

    def add(self, errors: np.ndarray, ordinary: np.ndarray, inputs: Sequence[np.ndarray], offset: int) -> None:
        rows = np.flatnonzero(ordinary)
        for r in rows[np.argsort(-errors[rows], kind="stable")[:WORST_ROWS]]:
            item = (float(errors[r]), -(offset + int(r)), [np.array(x[r : r + 1]) for x in inputs])
            if len(self.heap) < WORST_ROWS:
                heapq.heappush(self.heap, item)
            elif item[:2] > self.heap[0][:2]:
                heapq.heapreplace(self.heap, item)

    def rows(self) -> tuple[np.ndarray, list[np.ndarray]]:
        picked = sorted(self.heap, key=lambda e: -e[1])
        if not picked:
            return np.zeros(0, int), []
        inputs = [np.concatenate([p[2][k] for p in picked]) for k in range(len(picked[0][2]))]
        return np.array([-p[1] for p in picked]), inputs


@dataclass
class _Accumulated:
    """What an audit gathers chunk by chunk, one chunk in memory at a time."""

    merged: ObservationMerge
    actions: Actions
    nonfinite: NonFinite
    ranges: Ranges
    returns: Returns
    timeline: Windows
    worst_rows: _WorstRows = field(default_factory=lambda: _WorstRows())
    others: dict[str, Check] = field(default_factory=dict)
    info: dict[str, Any] = field(default_factory=dict)

    def compare_chunk(
        self, view: Bundle, graph: str, chunk: Any, reference: Reference_fn, source: RuntimeSource, batched: bool,
        tolerances: dict[str, Tolerance], preset: Any, label: str, checkpoint_matches: bool | None, offset: int,
        chunk_label: str,
    ) -> bool:  # fmt: skip
        """One chunk's recorded outputs against the reference's on its recorded inputs, through verify's own
        comparison, folded into the audit's totals; False when its outputs could not be compared."""
        contract = view.contract(graph)
        want = {k: np.asarray(v) for k, v in reference(chunk).items()}
        feeds = chunk_feeds(view, graph, chunk)
        skipped = "an audit compares the recorded steps; the episodes are the device's"
        ref = Reference(feeds, {graph: dict(want)}, {}, {}, seed=0, episodes=0, skipped_episodes=skipped)
        device = RecordedRuntime(source, graph, chunk, batched)
        report = check_runtime(label, {graph: device}, view, ref, Inputs(recorded=feeds.obs), tolerances, preset,
                               False, checkpoint_matches)  # fmt: skip
        self.info = self.info or dict(report.info)
        finite = feeds.finite
        steps = offset + np.arange(len(chunk))
        observation = None
        for c in report.checks:
            if c.name == f"observations.{graph}":
                observation = c
                self.merged.add(c, steps[finite], chunk_label, report.info.get("nan_propagation") or {})
            elif c.name != "repeatability":  # a recording answers each step once: "the same input twice" is moot
                self.others.setdefault(c.name, dataclasses.replace(c, summary=f"{c.summary} ({chunk_label})"))
        if observation is None:
            return False
        decision = contract.action.distribution_output
        pooled = feeds.ordinary & finite
        abs_err, ratio = decision_errors(want[decision], chunk.outputs[decision], tolerances[decision], pooled, finite)
        graph_noise = feeds.noise.get(graph) if contract.takes_noise else None
        bad = self.actions.add(chunk, want, tolerances, feeds.ordinary, graph_noise, offset)
        obs_by_name = {f.name: x for f, x in zip(contract.observations, chunk.inputs, strict=False)}
        odd = self.nonfinite.add(chunk, obs_by_name, want, tolerances, bad, offset)
        ood = self.ranges.add(chunk.inputs[0]) if not contract.obs_dict else np.zeros(len(chunk), bool)
        self.timeline.add(offset, chunk.time_ns, {"abs": abs_err, "ratio": ratio, "beyond": ratio > 1, "action": bad,
                                                  "nonfinite": odd, "ood": ood})  # fmt: skip
        self.worst_rows.add(abs_err, pooled, feeds.graph_inputs(view, graph), offset)
        return True


def audit(
    bundle: Bundle, index: RecordingIndex, reference: Reference_fn, *, cells: Any = None,
    checkpoint: Path | None = None, windows: int = 10, training_returns: tuple[Sequence[float], str] = ((), ""),
    localizer: Localizer | None = None, tolerance: str | None = None,
    overrides: Mapping[str, Tolerance] | None = None, localize: str = "auto",
    progress: Callable[[str], None] = lambda _m: None,
) -> tuple[VerifyResult, AuditFacts]:  # fmt: skip
    """Verify the indexed recording against ``reference`` (the training path's outputs on a chunk's recorded
    inputs), one chunk at a time (see the module docstring)."""
    graph = index.graph
    view = only_graph(bundle, graph)
    contract = view.contract(graph)
    preset_name = tolerance or bundle.precision
    if preset_name not in TOLERANCE_PRESETS:
        raise UsageError(f"unknown tolerance preset {preset_name!r}; choose {', '.join(TOLERANCE_PRESETS)}")
    preset = PRESETS[preset_name]
    label = f"{FIELD}:{'+'.join(index.runtimes)}"
    outputs = [o["name"] for o in view.graph(graph)["outputs"]]
    checks: list[Check] = []
    checkpoint_matches = _provenance(view, checkpoint, checks)
    acc = _Accumulated(
        ObservationMerge(graph, contract, preset), Actions(contract, preset), NonFinite(contract, outputs),
        Ranges(view, graph), Returns(), Windows(index.steps, windows),
    )  # fmt: skip
    recordings = {str(r["path"]): k for k, r in enumerate(index.recordings)}
    offset = 0
    for info_chunk in index.chunks:
        INTERRUPTS.check()
        chunk = read_chunk(info_chunk, index.layout)
        tol = tolerance_for(preset_name, {"lite-isolated": "lite"}.get(info_chunk.meta["runtime"],
                                                                        info_chunk.meta["runtime"]))  # fmt: skip
        tolerances = {o: (overrides or {}).get(o, tol) for o in outputs}
        compared = acc.compare_chunk(view, graph, chunk, reference, RuntimeSource(view, cells), index.layout.batched,
                                     tolerances, preset, label, checkpoint_matches, offset,
                                     f"{info_chunk.path.parent.name}/{info_chunk.path.name}")  # fmt: skip
        if not compared:
            offset += len(chunk)
            continue
        rec_dir = str(info_chunk.recording) if info_chunk.recording else None
        acc.returns.add(recordings.get(rec_dir, -1) if rec_dir else -1, chunk)
        offset += len(chunk)
        progress(f"audit: {offset}/{index.steps} steps compared ({info_chunk.path.name})")
    merged, actions, nonfinite, ranges, returns, timeline = (acc.merged, acc.actions, acc.nonfinite, acc.ranges,
                                                             acc.returns, acc.timeline)  # fmt: skip
    others, info, worst_rows = acc.others, acc.info, acc.worst_rows
    observations = merged.check(label)
    info["nan_propagation"] = merged.nan_facts()
    info["versions"] = {"recorded_by": "+".join(index.runtimes), "chunks": len(index.chunks)}
    facts = AuditFacts(index.steps, len(index.chunks), "+".join(index.runtimes), index.dropped_steps, index.sessions,
                       index.recordings, index.lost, [w for w in timeline.windows if w.steps], actions.facts(),
                       nonfinite.facts(index.steps), ranges.facts(),
                       returns.facts(*training_returns))  # fmt: skip
    checks += [
        observations,
        *others.values(),
        recording_check(label, index),
        actions.check(label, observations),
        nonfinite.check(label, index.steps),
        timeline.check(label),
        ranges.check(label),
    ]
    returned = returns.check(label, facts.returns)
    checks += [returned] if returned else []
    localizations = {}
    stages = {c.diagnosis["stage"] for c in checks if c.status == "fail" and c.diagnosis and c.runtime == label}
    wanted = localize == "always" or (localize == "auto" and (stages & LOCALIZE_STAGES or (
        bundle.precision == "fp16" and "lite" in label)))  # fmt: skip
    if localizer is not None and wanted:
        localizations[label] = _localize(
            localizer, index, graph, worst_rows, tolerance_for(preset_name, index.runtimes[0])
        )
    options = VerifyOptions(observations=max(16, index.steps), runtimes=(REFERENCE,), tolerance=tolerance,
                            overrides=dict(overrides or {}))  # fmt: skip
    reference_facts = Reference(StepCount(index.steps), {}, {}, {}, seed=0, episodes=0,  # type: ignore[arg-type]
                                skipped_episodes="an audit compares the recorded steps")  # fmt: skip
    inputs = {"env": None, "recorded_observations": f"field recording: {index.steps} steps in {len(index.chunks)} "
              "chunks"}  # fmt: skip
    result = VerifyResult(view, options, checks, {label: info}, reference_facts, {}, inputs, localizations)
    return result, facts


def recording_check(runtime: str, index: RecordingIndex) -> Check:
    """The recording itself: chunks complete and unique (checked by ``index_recording``), sessions, what was lost."""
    lost = index.lost
    where = ", ".join(str(r["path"]) for r in index.recordings)
    text = (
        f"{len(index.chunks)} chunks, {index.steps} steps of {where}: indices complete, each chunk once"
        f"{f' ({index.sessions} recording sessions, continued in one sequence)' if index.sessions > 1 else ''}"
    )
    metrics = {"recordings": index.recordings, "lost": lost, "dropped_steps": index.dropped_steps}
    if not lost and not index.dropped_steps:
        return Check(runtime, "field.recording", "pass", text, metrics=metrics)
    named = "; ".join(f"chunk {e['chunk']} ({e['steps']} steps, {e['why']})" for e in lost[:3])
    text += (f"; the recorder lost {len(lost) or 'some'} chunk(s), {index.dropped_steps} steps, which are not audited"
             f"{': ' + named if named else ''}")  # fmt: skip
    return Check(runtime, "field.recording", "warn", text, metrics=metrics)


def _localize(
    localizer: Localizer, index: RecordingIndex, graph: str, worst: _WorstRows, tol: Tolerance
) -> Localization:
    """Localise with the runtime the device ran, on this bundle's file, on the steps that differ most: the recording's
    manifest hash says it is the very bundle the device ran (a recording keeps no intermediate tensors)."""
    rows, inputs = worst.rows()
    own = {"lite-isolated": "lite"}.get(index.runtimes[0], index.runtimes[0])
    if not len(rows):
        return Localization(own, None, None, [], "not localized: no ordinary recorded step to run on")
    try:
        loc = localizer(own, graph, rows, inputs, tol)
    except Exception as exc:  # noqa: BLE001 - a layer search that fails is reported, the verdict stands
        return Localization(own, None, None, [], f"not localized: {exc}", method="none")
    loc.message = f"{loc.message}{'; ' if loc.message else ''}the device's {own} rerun here on the recorded steps"
    return loc


def plot_timeline(facts: AuditFacts, path: Any) -> bool:
    """The decision output's largest error (against the tolerance) and the out-of-range share per window."""
    if not facts.windows:
        return False
    try:
        import matplotlib
    except ImportError:
        return False
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t0 = facts.windows[0].start_ns
    x = [(w.end_ns - t0) / 1e9 for w in facts.windows]
    fig, ax = plt.subplots(figsize=(9, 3.8))
    ratios = [min(max(w.worst_ratio, 1e-6), 1e6) for w in facts.windows]
    ax.plot(x, ratios, marker="o", label="largest error / tolerance")
    ax.axhline(1.0, color="tab:gray", linestyle="--", linewidth=1)
    ax.set(yscale="log", xlabel="seconds since the first recorded step", ylabel="error / tolerance",
           title="field audit over time")  # fmt: skip
    ax2 = ax.twinx()
    ax2.plot(x, [w.ood_share for w in facts.windows], color="tab:red", marker=".", label="share out of range")
    ax2.set(ylabel="share of steps out of training's range", ylim=(0, 1))
    ax.grid(alpha=0.3)
    fig.legend(loc="upper left", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, format="png", dpi=100)
    plt.close(fig)
    return True
