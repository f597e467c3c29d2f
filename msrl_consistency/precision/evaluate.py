"""One candidate of a precision plan judged in policy terms: the lowered policy against the unlowered reference on
observations the policy really saw, and in paired seeded episodes.

Per graph, on the evaluation states (visited by the policy in seeded episodes, or recorded on a device): the
sampled actions' mismatch (mean exp|Δ log π|, ESS, k3 KL), the action-flip rate with its 95% upper bound, the
Gaussian mean's shift in units of the policy's std; per mode, the return difference of the same seeded episodes
played by both. ``badness`` puts each number against its bound (1.0: at the bound), so layers can be ranked.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from inference.bundle import Bundle
from inference.compare import episodes as E
from inference.compare.acting import available_modes, mode_policy
from inference.compare.policy_bounds import PolicyBounds, gate_metrics, judge


@dataclass
class States:
    """Observations the policy really saw, with the noise each stochastic graph takes for them, and the paired
    episodes' setting: env, count, seed and the reference's traces (played once)."""

    obs: np.ndarray
    noise: dict[str, np.ndarray]
    source: str
    env: E.EnvSource | None = None
    episodes: int = 0
    seed: int = 0
    traces: dict[str, E.EpisodeTrace] = field(default_factory=dict)
    episode_noise: dict[str, np.ndarray] = field(default_factory=dict)

    def graph_inputs(self, bundle: Bundle, graph: str) -> list[np.ndarray]:
        contract = bundle.contract(graph)
        noise = [self.noise[graph]] if contract.takes_noise else []
        return [*contract.obs_inputs(self.obs), *noise]


@dataclass
class Evaluation:
    kept: frozenset[str]
    graphs: dict[str, dict[str, Any]]
    returns: dict[str, dict[str, float]]
    errors: dict[str, float]  # output -> max |Δ| / the output's largest magnitude, on the states where actions agree
    broken: list[str]
    badness: float

    @property
    def ok(self) -> bool:
        return not self.broken

    def summary(self) -> dict[str, Any]:
        """The numbers a plan records for this candidate."""
        finite = np.isfinite(self.badness)  # inf: Lite could not run this candidate (``broken`` says why)
        out: dict[str, Any] = {"ok": self.ok, "badness": round(self.badness, 4) if finite else None}
        for graph, m in self.graphs.items():
            mm, flips, shift = m.get("mismatch") or {}, m.get("flip_rate") or {}, (m.get("mean_shift_in_std") or {})
            out[graph] = {k: v for k, v in {
                "mean_exp_abs": mm.get("mean_exp_abs"), "ess": mm.get("ess"), "k3_kl": mm.get("k3_kl"),
                "log_ratio_p1": (m.get("log_ratio") or {}).get("p1"),
                "log_ratio_p99": (m.get("log_ratio") or {}).get("p99"), "flip_rate": flips.get("rate"),
                "flip_rate_ucb": flips.get("ucb"), "mean_shift_in_std_p99": shift.get("p99"),
            }.items() if v is not None}  # fmt: skip
        out["returns"] = self.returns
        if self.broken:
            out["broken"] = self.broken
        return out


def reference_episodes(bundle: Bundle, runtimes: Mapping[str, Any], states: States) -> None:
    """The reference's seeded episodes, once per mode (the lowered candidates replay the same seeds and noise)."""
    if states.env is None or not states.episodes:
        return
    for mode, graph in available_modes(bundle).items():
        noise = None
        if mode == "stochastic":
            noise = states.episode_noise[mode] = E.episode_noise(bundle, graph, states.episodes, states.env.max_steps,
                                                                 states.seed)  # fmt: skip
        states.traces[mode] = E.run_episodes(states.env, mode_policy(bundle, runtimes, mode), states.episodes,
                                             states.seed, noise)  # fmt: skip


def evaluate(
    bundle: Bundle, reference: Mapping[str, Any], lowered: Mapping[str, Any], states: States, bounds: PolicyBounds,
    kept: frozenset[str], reference_outputs: dict[str, dict[str, np.ndarray]] | None = None,
) -> Evaluation:  # fmt: skip
    """``lowered`` against ``reference`` (graph → runtime) on ``states`` (see the module docstring)."""
    graphs: dict[str, dict[str, Any]] = {}
    errors: dict[str, float] = {}
    broken: list[str] = []
    badness = 0.0
    rows = np.ones(len(states.obs), bool)
    for graph in bundle.graphs:
        inputs = states.graph_inputs(bundle, graph)
        if reference_outputs is not None and graph in reference_outputs:
            want = reference_outputs[graph]
        else:
            want = reference[graph].infer(*inputs)
            if reference_outputs is not None:
                reference_outputs[graph] = want
        got = lowered[graph].infer(*inputs)
        contract = bundle.contract(graph)
        metrics = gate_metrics(contract, want, got, states.noise.get(graph), rows)
        graphs[graph] = metrics
        agree = np.ones(len(states.obs), bool)
        if contract.action.is_discrete:  # a flipped action's outputs (its log-prob) are the flip's: counted as a flip
            ra, ga = np.asarray(contract.env_action(want)), np.asarray(contract.env_action(got))
            agree = (ra.reshape(len(ra), -1) == ga.reshape(len(ga), -1)).all(1)
        for name, w in want.items():
            w64, g64 = np.asarray(w, np.float64)[agree], np.asarray(got[name], np.float64)[agree]
            if w64.dtype.kind == "f" and w64.shape == g64.shape and w64.size:
                scale = float(np.abs(w64[np.isfinite(w64)]).max(initial=0.0)) or 1.0
                diff = np.abs(w64 - g64)
                errors[name] = max(errors.get(name, 0.0), float(np.nanmax(np.where(np.isfinite(diff), diff, np.inf)))
                                   / scale)  # fmt: skip
        broken += [f"{graph}: {b}" for b in judge(metrics, bounds)]
        badness = max(badness, _badness(metrics, bounds))
    returns = {}
    for mode, trace in states.traces.items():
        own = E.run_episodes(states.env, mode_policy(bundle, lowered, mode), states.episodes, states.seed,
                             states.episode_noise.get(mode))  # fmt: skip
        ref_r, low_r = trace.returns.astype(np.float64), own.returns.astype(np.float64)
        scale = max(abs(float(ref_r.mean())), float(ref_r.std()), 1.0)
        diff = abs(float(low_r.mean() - ref_r.mean())) / scale
        returns[mode] = {"reference": float(ref_r.mean()), "lowered": float(low_r.mean()), "difference": diff}
        if bounds.return_difference is not None:
            badness = max(badness, diff / bounds.return_difference)
            if diff > bounds.return_difference:
                broken.append(f"{mode} episodes: mean return {low_r.mean():.4g} vs {ref_r.mean():.4g}, "
                              f"|Δ| {diff:.1%} of the scale > {bounds.return_difference:.0%}")  # fmt: skip
    return Evaluation(kept, graphs, returns, errors, broken, badness)


def _badness(metrics: Mapping[str, Any], bounds: PolicyBounds) -> float:
    """The worst of the numbers measured against their bounds: 1.0 at a bound, above it beyond."""
    worst = 0.0
    m = metrics.get("mismatch") or {}
    if m.get("mean_exp_abs") is not None:
        worst = max(worst, (m["mean_exp_abs"] - 1) / (bounds.mean_exp_abs - 1))
    if m.get("ess") is not None:
        worst = max(worst, (1 - m["ess"]) / max(1e-12, 1 - bounds.ess))
    if m.get("k3_kl") is not None:
        worst = max(worst, m["k3_kl"] / bounds.k3_kl)
    if metrics.get("flip_rate") and bounds.flip_rate_ucb:
        worst = max(worst, metrics["flip_rate"]["ucb"] / bounds.flip_rate_ucb)
    shift = (metrics.get("mean_shift_in_std") or {}).get("p99")
    if shift is not None:
        worst = max(worst, shift / bounds.mean_shift_in_std)
    return float(worst) if np.isfinite(worst) else float("inf")
