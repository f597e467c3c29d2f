"""One candidate of a precision plan judged by verify's own judge: the candidate's bundle, its lowered runtime
(``lite`` for int8, ``emulated-fp16`` for fp16) checked against verify's reference with verify's checks and the
verifier's bar for the precision it computes in (``inference.compare.verifier.judge_runtime``). A candidate is within
the bounds exactly when verify would pass that runtime: no check fails and none could not be judged.

``badness`` ranks candidates and layers: the worst of the measured numbers against their bars (1.0: at a bar), from
the rates themselves (a flip rate, not its upper confidence bound, which every flip-free candidate shares), so that
layers that all pass still rank by how far each moves the policy.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from inference.compare.judge.policy_bounds import PolicyBounds


@dataclass
class Evaluation:
    kept: frozenset[str]
    graphs: dict[str, dict[str, Any]]  # graph -> the policy check's metrics
    returns: dict[str, dict[str, float]]  # mode -> reference and lowered mean return, their difference / scale
    broken: list[str]  # every failing check, one phrase each (and every check that could not be judged)
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
            error = m.get("action_error") or {}
            out[graph] = {k: v for k, v in {
                "mean_exp_abs": mm.get("mean_exp_abs"), "ess": mm.get("ess"), "k3_kl": mm.get("k3_kl"),
                "log_ratio_p1": (m.get("log_ratio") or {}).get("p1"),
                "log_ratio_p99": (m.get("log_ratio") or {}).get("p99"), "flip_rate": flips.get("rate"),
                "flip_rate_ucb": flips.get("ucb"), "mean_shift_in_std_p99": shift.get("p99"),
                "action_error_p99": error.get("p99"), "action_error_max": error.get("max"),
            }.items() if v is not None}  # fmt: skip
        out["returns"] = self.returns
        if self.broken:
            out["broken"] = self.broken
        return out


def from_report(kept: frozenset[str], report: Any, bounds: PolicyBounds, return_tolerance: float) -> Evaluation:
    """The candidate's evaluation from verify's ``RuntimeReport`` of its lowered runtime."""
    if report.info.get("status") != "ran":
        why = report.info.get("reason") or report.info.get("status")
        return Evaluation(kept, {}, {}, [f"the runtime did not run: {why}"], float("inf"))
    broken = [f"{c.name}: {c.summary}" for c in report.checks if c.status in ("fail", "error")]
    graphs = {c.name.split(".", 1)[1]: c.metrics for c in report.checks if c.name.startswith("policy.")}
    badness = max((_policy_badness(m, bounds) for m in graphs.values()), default=0.0)
    for c in report.checks:
        if c.name.startswith("observations."):
            badness = max(badness, _elementwise_badness(c.metrics))
    returns = {}
    for c in report.checks:
        m = c.metrics
        if c.name.startswith("episodes.free_running.") and "reference_mean_return" in m:
            ref, got = float(m["reference_mean_return"]), float(m["mean_return"])
            scale = max(abs(ref), float(np.std(m.get("reference_returns") or [ref])), 1.0)
            returns[c.name.rsplit(".", 1)[1]] = {"reference": ref, "lowered": got, "difference": abs(got - ref) / scale}
    for r in returns.values():
        badness = max(badness, r["difference"] / max(return_tolerance, 1e-12))
    return Evaluation(kept, graphs, returns, broken, float(badness) if np.isfinite(badness) else float("inf"))


def _policy_badness(metrics: Mapping[str, Any], bounds: PolicyBounds) -> float:
    """The policy-level numbers against their bounds (the flip rate itself, not its upper bound)."""
    worst = 0.0
    m = metrics.get("mismatch") or {}
    if m.get("mean_exp_abs") is not None:
        worst = max(worst, (m["mean_exp_abs"] - 1) / (bounds.mean_exp_abs - 1))
    if m.get("ess") is not None:
        worst = max(worst, (1 - m["ess"]) / max(1e-12, 1 - bounds.ess))
    if m.get("k3_kl") is not None:
        worst = max(worst, m["k3_kl"] / bounds.k3_kl)
    if metrics.get("flip_rate") and bounds.flip_rate_ucb:
        worst = max(worst, metrics["flip_rate"]["rate"] / bounds.flip_rate_ucb)
    shift = (metrics.get("mean_shift_in_std") or {}).get("p99")
    if shift is not None:
        worst = max(worst, shift / bounds.mean_shift_in_std)
    error = metrics.get("action_error") or {}
    for key, bound in (("p99", bounds.action_error_p99), ("max", bounds.action_error_max)):
        if bound and error.get(key) is not None:
            worst = max(worst, error[key] / bound)
    return float(worst)


def _elementwise_badness(metrics: Mapping[str, Any]) -> float:
    """How much of its element-wise tolerance each output used (the smallest atol that passes over the tolerance's)."""
    worst = 0.0
    for out in (metrics.get("outputs") or {}).values():
        if out.get("exact") or not out.get("atol"):
            continue
        worst = max(worst, float(out.get("required_atol") or 0.0) / float(out["atol"]))
    return worst
