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
from inference.bundle.recording import Chunk, RecordingIndex, read_chunk
from inference.compare.audit.actions import Actions
from inference.compare.audit.field_checks import NonFinite, Ranges, Returns, Window, Windows, decision_errors
from inference.compare.audit.merge import ObservationMerge
from inference.compare.audit.recorded import FIELD, RecordedRuntime, chunk_feeds
from inference.compare.checks import Check, VerifyResult
from inference.compare.inputs import Inputs
from inference.compare.judge.localize import Localization, Localizer
from inference.compare.judge.stats import PRESETS, TOLERANCE_PRESETS, Tolerance, tolerance_for
from inference.compare.options import LOCALIZE_STAGES, VerifyOptions
from inference.compare.reference import REFERENCE, Reference
from inference.compare.runtime_check import RuntimeReport, check_runtime
from inference.compare.verifier import _provenance
from inference.errors import INTERRUPTS, UsageError
from inference.runtimes.base import RuntimeSource

WORST_ROWS = 8  # rows a localisation runs on, as verify's
Reference_fn = Callable[[Chunk], Mapping[str, np.ndarray]]


def only_graph(bundle: Bundle, graph: str) -> Bundle:
    """The bundle as if it held only ``graph`` (the one the device ran and recorded)."""
    manifest = dict(bundle.manifest)
    manifest["graphs"] = {graph: bundle.manifest["graphs"][graph]}
    return dataclasses.replace(bundle, manifest=manifest)


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


@dataclass(frozen=True)
class ChunkTask:
    """What comparing one chunk needs besides the chunk and the reference's outputs on it: small, so a fleet's
    engine ships it to a worker with the chunk (``judge``, the costly part of an audit, runs there)."""

    view: Bundle
    graph: str
    batched: Mapping[str, bool]
    tolerances: Mapping[str, Tolerance]
    preset: Any
    label: str
    checkpoint_matches: bool | None

    def judge(self, chunk: Chunk, want: Mapping[str, np.ndarray], cells: Any = None) -> RuntimeReport:
        """verify's own comparison (``check_runtime``) of the chunk's recorded outputs with ``want``, the training
        path's outputs on its recorded inputs."""
        feeds = chunk_feeds(self.view, self.graph, chunk)
        skipped = "an audit compares the recorded steps; the episodes are the device's"
        want = {k: np.asarray(v) for k, v in want.items()}
        ref = Reference(feeds, {self.graph: want}, {}, {}, seed=0, episodes=0, skipped_episodes=skipped)
        device = RecordedRuntime(RuntimeSource(self.view, cells), self.graph, chunk, self.batched)
        return check_runtime(self.label, {self.graph: device}, self.view, ref, Inputs(recorded=feeds.obs),
                             dict(self.tolerances), self.preset, False, self.checkpoint_matches)  # fmt: skip


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

    def fold(self, task: ChunkTask, chunk: Chunk, want: Mapping[str, np.ndarray], report: RuntimeReport, offset: int,
             chunk_label: str) -> bool:  # fmt: skip
        """One chunk's comparison (``task.judge``) folded into the audit's totals, with what the audit adds on top
        of verify (actions, non-finite steps, ranges, windows); False when its outputs could not be compared."""
        view, graph = task.view, task.graph
        contract = view.contract(graph)
        want = {k: np.asarray(v) for k, v in want.items()}
        feeds = chunk_feeds(view, graph, chunk)
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
        tolerances = task.tolerances
        decision = contract.action.distribution_output
        pooled = feeds.ordinary & finite
        abs_err, ratio = decision_errors(want[decision], chunk.outputs[decision], tolerances[decision], pooled, finite)
        graph_noise = feeds.noise.get(graph) if contract.takes_noise else None
        bad = self.actions.add(chunk, want, dict(tolerances), feeds.ordinary, graph_noise, offset)
        obs_by_name = {f.name: x for f, x in zip(contract.observations, chunk.inputs, strict=False)}
        odd = self.nonfinite.add(chunk, obs_by_name, want, dict(tolerances), bad, offset)
        ood = self.ranges.add(chunk.inputs[0]) if not contract.obs_dict else np.zeros(len(chunk), bool)
        self.timeline.add(offset, chunk.time_ns, {"abs": abs_err, "ratio": ratio, "beyond": ratio > 1, "action": bad,
                                                  "nonfinite": odd, "ood": ood})  # fmt: skip
        self.worst_rows.add(abs_err, pooled, feeds.graph_inputs(view, graph), offset)
        return True


class RecordingAudit:
    """One recording's audit as three steps, so the chunks can be judged elsewhere (a fleet's workers) and folded
    here in order: ``task`` (what judging a chunk needs), ``fold`` (a judged chunk into the totals), ``finish`` (the
    merged checks, the localisation, the result). ``audit`` runs them in one process."""

    def __init__(
        self, bundle: Bundle, index: RecordingIndex, *, cells: Any = None, checkpoint: Path | None = None,
        windows: int = 10, training_returns: tuple[Sequence[float], str] = ((), ""), tolerance: str | None = None,
        overrides: Mapping[str, Tolerance] | None = None,
    ) -> None:  # fmt: skip
        self.bundle, self.index, self.cells, self.tolerance = bundle, index, cells, tolerance
        self.overrides, self.training_returns = dict(overrides or {}), training_returns
        graph = index.graph
        self.view = view = only_graph(bundle, graph)
        contract = view.contract(graph)
        self.preset_name = tolerance or bundle.precision
        if self.preset_name not in TOLERANCE_PRESETS:
            raise UsageError(f"unknown tolerance preset {self.preset_name!r}; choose {', '.join(TOLERANCE_PRESETS)}")
        preset = PRESETS[self.preset_name]
        self.label = f"{FIELD}:{'+'.join(index.runtimes)}"
        self.outputs = [o["name"] for o in view.graph(graph)["outputs"]]
        self.checks: list[Check] = []
        self.checkpoint_matches = _provenance(view, checkpoint, self.checks)
        self.acc = _Accumulated(
            ObservationMerge(graph, contract, preset), Actions(contract, preset), NonFinite(contract, self.outputs),
            Ranges(view, graph), Returns(), Windows(index.steps, windows),
        )  # fmt: skip
        self.recordings = {str(r["path"]): k for k, r in enumerate(index.recordings)}
        self.offset = 0

    def task(self, info: Any) -> ChunkTask:
        """What judging the chunk ``info`` (one of ``index.chunks``) needs: its tolerances follow the runtime that
        recorded it."""
        runtime = info.meta["runtime"]
        tol = tolerance_for(self.preset_name, {"lite-isolated": "lite"}.get(runtime, runtime))
        tolerances = {o: self.overrides.get(o, tol) for o in self.outputs}
        return ChunkTask(self.view, self.index.graph, self.index.layout.batched, tolerances, PRESETS[self.preset_name],
                         self.label, self.checkpoint_matches)  # fmt: skip

    def fold(self, info: Any, chunk: Chunk, want: Mapping[str, np.ndarray], report: RuntimeReport) -> None:
        """The chunk ``info`` (the next in ``index.chunks``), judged (``report``), into the totals."""
        label = f"{info.path.parent.name}/{info.path.name}"
        if self.acc.fold(self.task(info), chunk, want, report, self.offset, label):
            rec_dir = str(info.recording) if info.recording else None
            self.acc.returns.add(self.recordings.get(rec_dir, -1) if rec_dir else -1, chunk)
        self.offset += len(chunk)

    def finish(self, localizer: Localizer | None = None, localize: str = "auto") -> tuple[VerifyResult, AuditFacts]:
        index, acc, label, graph = self.index, self.acc, self.label, self.index.graph
        observations = acc.merged.check(label)
        info = acc.info
        info["nan_propagation"] = acc.merged.nan_facts()
        info["versions"] = {"recorded_by": "+".join(index.runtimes), "chunks": len(index.chunks)}
        facts = AuditFacts(index.steps, len(index.chunks), "+".join(index.runtimes), index.dropped_steps,
                           index.sessions, index.recordings, index.lost, [w for w in acc.timeline.windows if w.steps],
                           acc.actions.facts(), acc.nonfinite.facts(index.steps), acc.ranges.facts(),
                           acc.returns.facts(*self.training_returns))  # fmt: skip
        checks = [*self.checks, observations, *acc.others.values(), recording_check(label, index),
                  acc.actions.check(label, observations), acc.nonfinite.check(label, index.steps),
                  acc.timeline.check(label), acc.ranges.check(label)]  # fmt: skip
        returned = acc.returns.check(label, facts.returns)
        checks += [returned] if returned else []
        localizations = {}
        stages = {c.diagnosis["stage"] for c in checks if c.status == "fail" and c.diagnosis and c.runtime == label}
        wanted = localize == "always" or (localize == "auto" and (stages & LOCALIZE_STAGES or (
            self.bundle.precision == "fp16" and "lite" in label)))  # fmt: skip
        if localizer is not None and wanted:
            tol = tolerance_for(self.preset_name, index.runtimes[0])
            localizations[label] = _localize(localizer, index, graph, acc.worst_rows, tol)
        options = VerifyOptions(observations=max(16, index.steps), runtimes=(REFERENCE,), tolerance=self.tolerance,
                                overrides=self.overrides)  # fmt: skip
        reference_facts = Reference(StepCount(index.steps), {}, {}, {}, seed=0, episodes=0,  # type: ignore[arg-type]
                                    skipped_episodes="an audit compares the recorded steps")  # fmt: skip
        inputs = {"env": None, "recorded_observations": f"field recording: {index.steps} steps in "
                  f"{len(index.chunks)} chunks"}  # fmt: skip
        result = VerifyResult(self.view, options, checks, {label: info}, reference_facts, {}, inputs, localizations)
        return result, facts


def audit(
    bundle: Bundle, index: RecordingIndex, reference: Reference_fn, *, cells: Any = None,
    checkpoint: Path | None = None, windows: int = 10, training_returns: tuple[Sequence[float], str] = ((), ""),
    localizer: Localizer | None = None, tolerance: str | None = None,
    overrides: Mapping[str, Tolerance] | None = None, localize: str = "auto",
    progress: Callable[[str], None] = lambda _m: None,
) -> tuple[VerifyResult, AuditFacts]:  # fmt: skip
    """Verify the indexed recording against ``reference`` (the training path's outputs on a chunk's recorded
    inputs), one chunk at a time (see the module docstring)."""
    run = RecordingAudit(bundle, index, cells=cells, checkpoint=checkpoint, windows=windows,
                         training_returns=training_returns, tolerance=tolerance, overrides=overrides)  # fmt: skip
    for info in index.chunks:
        INTERRUPTS.check()
        chunk = read_chunk(info, index.layout)
        want = reference(chunk)
        run.fold(info, chunk, want, run.task(info).judge(chunk, want, cells))
        progress(f"audit: {run.offset}/{index.steps} steps compared ({info.path.name})")
    return run.finish(localizer, localize)


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
