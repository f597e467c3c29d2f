"""Audit a field recording against the training path: verify's own comparison, with the device as the runtime.

The recorded steps become the feeds (observations, the noise the device fed, carried states), the reference is the
training path's outputs on them, and the device is a runtime that answers with what it recorded
(``RecordedRuntime``): so the statistics, policy-level metrics, stage diagnosis, tolerances and layer localisation
are verify's. On top, per time window (drift: does the error grow with uptime, after an update of the device's
Lite?), how far the field's observations lie from what training saw (the normaliser's statistics), and the
episodes whose returns differ most from training's evaluations. Nothing here imports MindSpore: the caller brings
the reference outputs.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from inference.bundle import Bundle
from inference.compare.checks import Check, VerifyResult
from inference.compare.feeds import Feeds
from inference.compare.inputs import Inputs
from inference.compare.localize import Localizer
from inference.compare.reference import REFERENCE, Reference
from inference.compare.stats import Tolerance, compare_arrays, tolerance_for
from inference.contract import state_dtype
from inference.field import Recording
from inference.runtimes.base import InferenceFailed, Runtime, RuntimeSource

FIELD = "field"
OOD_SIGMA = 4.0  # an observation dimension this many training standard deviations from the mean is out of range
OOD_WARN_SHARE = 0.01  # more steps than this out of range (or any clipped by the normaliser) is reported


def only_graph(bundle: Bundle, graph: str) -> Bundle:
    """The bundle as if it held only ``graph`` (the one the device ran and recorded)."""
    manifest = dict(bundle.manifest)
    manifest["graphs"] = {graph: bundle.manifest["graphs"][graph]}
    return dataclasses.replace(bundle, manifest=manifest)


def recorded_feeds(bundle: Bundle, graph: str, rec: Recording) -> Feeds:
    """The recording's graph inputs as verify's feeds: observation rows, the noise fed, the carried states."""
    contract = bundle.contract(graph)
    n, k = len(rec), len(contract.observations)
    if contract.obs_dict:
        obs = contract.empty_observations(n)
        for f, x in zip(contract.observations, rec.inputs[:k], strict=True):
            obs[f.name] = x
    else:
        obs = rec.inputs[0]
    noise = {graph: rec.inputs[k]} if contract.takes_noise else {}
    k += int(contract.takes_noise)
    state = None
    if contract.states:
        state = np.zeros(n, state_dtype(contract.states))
        for s, x in zip(contract.states, rec.inputs[k:], strict=True):
            state[s.name] = x
    return Feeds(obs, np.full(n, "recorded"), noise, state)


class RecordedRuntime(Runtime):
    """The device, as recorded: asked for the recorded inputs (or their first rows), it answers what it answered."""

    name = FIELD
    description = "the outputs a deployed runtime recorded (inference.field)"

    def __init__(self, source: RuntimeSource, graph: str, rec: Recording) -> None:
        super().__init__(source, graph)
        self.rec = rec

    def _load(self) -> None:
        return None

    def _run(self, arrays: list[np.ndarray]) -> list[np.ndarray]:
        n = len(arrays[0])
        for k, (got, recorded) in enumerate(zip(arrays, self.rec.inputs, strict=True)):
            if n > len(recorded) or not np.array_equal(got, recorded[:n], equal_nan=got.dtype.kind == "f"):
                raise InferenceFailed(f"{FIELD}: input {k} is not what the device recorded (only those rows answer)")
        return [self.rec.outputs[o.name][:n] for o in self.outputs]

    def versions(self) -> dict[str, Any]:
        return {"recorded_by": self.rec.runtime, "chunks": len(self.rec.chunks)}


@dataclass
class Window:
    """One time window of the recording: its steps, the decision output's largest error there (and relative to the
    tolerance granted), the rows beyond tolerance, and the share of steps out of training's range."""

    start_ns: int
    end_ns: int
    steps: int
    max_abs: float
    worst_ratio: float
    mismatched_rows: int
    ood_share: float


@dataclass
class AuditFacts:
    """What an audit adds to verify's result (``audit.json`` and the timeline plot)."""

    steps: int
    chunks: int
    recorded_by: str
    dropped_steps: int
    windows: list[Window] = field(default_factory=list)
    ood: dict[str, Any] = field(default_factory=dict)
    returns: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def audit(
    bundle: Bundle, rec: Recording, reference: Mapping[str, np.ndarray], *,
    cells: Any = None, checkpoint: Any = None, windows: int = 10,
    training_returns: tuple[Sequence[float], str] = ((), ""),
    localizer: Localizer | None = None, tolerance: str | None = None,
) -> tuple[VerifyResult, AuditFacts]:  # fmt: skip
    """Verify the recorded steps against ``reference`` (the training path's outputs on the recorded inputs)."""
    from inference.compare.verifier import VerifyOptions, verify

    view = only_graph(bundle, rec.graph)
    feeds = recorded_feeds(view, rec.graph, rec)
    ref = Reference(feeds, {rec.graph: dict(reference)}, {}, {}, seed=0, episodes=0,
                    skipped_episodes="an audit compares the recorded steps; the episodes are the device's")  # fmt: skip
    label = f"{FIELD}:{rec.runtime}"
    device = {rec.graph: RecordedRuntime(RuntimeSource(view, cells), rec.graph, rec)}
    options = VerifyOptions(observations=max(16, len(rec)), runtimes=(REFERENCE,), tolerance=tolerance)
    inputs = Inputs(recorded=feeds.obs, recorded_from=f"field recording ({len(rec.chunks)} chunks)")
    result = verify(view, options, inputs, cells, checkpoint, reference=ref, extra_runtimes={label: device},
                    localizer=_as_the_device(localizer, rec.runtime))  # fmt: skip
    # A recording answers each step once: "the same input twice" has no meaning for it.
    result.checks = [c for c in result.checks if not (c.runtime == label and c.name == "repeatability")]
    preset = tolerance or bundle.precision
    facts = AuditFacts(len(rec), len(rec.chunks), rec.runtime, rec.dropped_steps)
    z = observation_z(bundle, rec.graph, feeds)
    facts.windows = time_windows(view, rec, reference, tolerance_for(preset, rec.runtime), windows, z)
    facts.ood = out_of_range(bundle, z)
    facts.returns = field_returns(rec, *training_returns)
    result.checks += audit_checks(label, facts)
    return result, facts


def _as_the_device(localizer: Localizer | None, runtime: str) -> Localizer | None:
    """Localise with the runtime the device ran, on this bundle's file: the recording's manifest hash says it is the
    very bundle the device ran (a recording keeps no intermediate tensors)."""
    if localizer is None:
        return None
    own = {"lite-isolated": "lite"}.get(runtime, runtime)

    def localize(_name: str, graph: str, rows: np.ndarray, inputs: Sequence[np.ndarray], tol: Tolerance) -> Any:
        loc = localizer(own, graph, rows, inputs, tol)
        loc.message = f"{loc.message}{'; ' if loc.message else ''}the device's {own} rerun here on the recorded rows"
        return loc

    return localize


def observation_z(bundle: Bundle, graph: str, feeds: Feeds) -> np.ndarray | None:
    """Each recorded observation in training standard deviations from training's mean (the normaliser's
    statistics in the manifest); None when the bundle carries none or the observation is a Dict."""
    norm = bundle.manifest.get("normalization") or {}
    if not norm.get("mean") or bundle.contract(graph).obs_dict:
        return None
    mean, var = np.asarray(norm["mean"], np.float64), np.asarray(norm["var"], np.float64)
    obs = np.asarray(feeds.obs, np.float64).reshape(len(feeds), -1)
    if obs.shape[1] != mean.size:
        return None
    return (obs - mean.ravel()) / np.sqrt(var.ravel() + 1e-8)


def out_of_range(bundle: Bundle, z: np.ndarray | None) -> dict[str, Any]:
    """How far the field's observations lie from training's: per dimension, and the share of steps beyond
    ``OOD_SIGMA`` or clipped by the in-graph normaliser."""
    if z is None:
        return {"available": False, "why": "the bundle records no observation statistics for this observation"}
    clip = float((bundle.manifest.get("normalization") or {}).get("clip") or np.inf)
    finite = np.isfinite(z).all(1)
    z = z[finite]
    absz = np.abs(z)
    return {
        "available": True, "sigma": OOD_SIGMA, "clip": clip, "steps": int(len(z)),
        "share_beyond_sigma": float((absz > OOD_SIGMA).any(1).mean()) if len(z) else 0.0,
        "share_clipped": float((absz > clip).any(1).mean()) if len(z) else 0.0,
        "per_dimension": [{"dimension": d, "mean_abs_z": float(absz[:, d].mean()), "max_abs_z": float(absz[:, d].max()),
                           "share_beyond_sigma": float((absz[:, d] > OOD_SIGMA).mean())} for d in range(z.shape[1])]
        if len(z) else [],
    }  # fmt: skip


def time_windows(
    view: Bundle, rec: Recording, reference: Mapping[str, np.ndarray], tol: Tolerance, count: int,
    z: np.ndarray | None,
) -> list[Window]:  # fmt: skip
    """The decision output's error and the out-of-range share per window of equally many steps, in time order."""
    decision = view.contract(rec.graph).action.distribution_output
    want, got = np.asarray(reference[decision]), np.asarray(rec.outputs[decision])
    bounds = np.linspace(0, len(rec), max(1, min(count, len(rec) // 16 or 1)) + 1).astype(int)
    windows = []
    for lo, hi in zip(bounds[:-1], bounds[1:], strict=True):
        with np.errstate(all="ignore"):
            cmp = compare_arrays(decision, want[lo:hi], got[lo:hi], tol)
            err = np.abs(np.asarray(want[lo:hi], np.float64) - got[lo:hi]).reshape(hi - lo, -1)
        bad = ~(np.isfinite(err).all(1)) | (err > (cmp.atol or 0.0) + (cmp.rtol or 0.0) * np.abs(want[lo:hi]).reshape(
            hi - lo, -1)).any(1)  # fmt: skip
        ood = float((np.abs(z[lo:hi]) > OOD_SIGMA).any(1).mean()) if z is not None and hi > lo else 0.0
        ratio = cmp.max_abs / cmp.atol if cmp.atol else 0.0
        windows.append(Window(int(rec.time_ns[lo]), int(rec.time_ns[hi - 1]), int(hi - lo), cmp.max_abs, ratio,
                              int(bad.sum()), ood))  # fmt: skip
    return windows


def field_returns(rec: Recording, training: Sequence[float], source: str = "", top: int = 5) -> dict[str, Any]:
    """The recorded episodes' returns against training's (``source`` says which: its final evaluation, or its last
    episodes): the episodes that differ most."""
    episodes = rec.episode_returns()
    if not episodes:
        return {"episodes": 0, "why": "no episode ended in the recording with its rewards recorded"}
    returns = np.array([r for *_, r in episodes])
    out: dict[str, Any] = {"episodes": len(episodes), "mean": float(returns.mean()), "std": float(returns.std())}
    if len(training):
        mean = float(np.mean(training))
        gaps = sorted(episodes, key=lambda e: -abs(e[2] - mean))[:top]
        out |= {"training_mean": mean, "training_std": float(np.std(training)), "training_source": source,
                "furthest": [{"episode": e, "env": k, "return": r, "minus_training_mean": r - mean}
                             for e, k, r in gaps]}  # fmt: skip
    return out


def audit_checks(label: str, facts: AuditFacts) -> list[Check]:
    """The audit's own checks: drift over the time windows, the observations' range, the episodes' returns."""
    checks = []
    w = facts.windows
    if w:
        first, last = w[0].max_abs, w[-1].max_abs
        grows = last > 10 * max(first, 1e-12) and last > 0 and w[-1].worst_ratio > 0.1
        windows = f"{len(w)} windows of ~{w[0].steps} steps" if len(w) > 1 else f"1 window of {w[0].steps} steps"
        summary = (f"{windows}: largest error {first:.2e} in the first, {last:.2e} in the last (worst "
                   f"{max(x.worst_ratio for x in w):.2f} of the tolerance)")  # fmt: skip
        checks.append(Check(label, "field.drift", "warn" if grows else "pass",
                            summary + ("; the error grows over time" if grows else ""),
                            metrics={"windows": [dataclasses.asdict(x) for x in w]}))  # fmt: skip
    ood = facts.ood
    if ood.get("available"):
        share, clipped = ood["share_beyond_sigma"], ood["share_clipped"]
        worst = max(ood["per_dimension"], key=lambda d: d["max_abs_z"]) if ood["per_dimension"] else None
        status = "warn" if share > OOD_WARN_SHARE or clipped > 0 else "pass"
        text = (f"{share:.1%} of steps have a dimension beyond {OOD_SIGMA:g} training std, {clipped:.1%} clipped by "
                f"the normaliser (±{ood['clip']:g})")  # fmt: skip
        if worst is not None:
            text += f"; furthest: dimension {worst['dimension']} at {worst['max_abs_z']:.1f} std"
        if status == "warn":
            text += ": the device acts on states training did not cover"
        checks.append(Check(label, "field.out_of_distribution", status, text, metrics=ood))
    else:
        checks.append(Check(label, "field.out_of_distribution", "skip", str(ood.get("why", ""))))
    r = facts.returns
    if r.get("episodes"):
        text = f"{r['episodes']} episodes, return {r['mean']:.1f} ± {r['std']:.1f}"
        if "training_mean" in r:
            far = r["furthest"][0]
            text += (f" ({r['training_source']}: {r['training_mean']:.1f} ± {r['training_std']:.1f}); furthest: "
                     f"episode {far['episode']} env {far['env']} at {far['return']:.1f}")  # fmt: skip
        checks.append(Check(label, "field.returns", "pass", text, metrics=r))
    if facts.dropped_steps:
        checks.append(Check(label, "field.recording", "warn", f"the recorder dropped {facts.dropped_steps} steps "
                            "(the disk fell behind): they are not audited"))  # fmt: skip
    return checks


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
    ax.plot(x, [max(w.worst_ratio, 1e-6) for w in facts.windows], marker="o", label="largest error / tolerance")
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
