"""Mismatch in policy terms, gated: the bounds a runtime's policy must keep against the reference's, per precision.

Element-wise tolerances say whether numbers agree; these say whether the *policy* does, in the terms LLM-RL
trainers gate rollout-versus-trainer mismatch on (``policy_level.mismatch``): the mean of exp|Δ log π| over sampled
actions (NeMo RL: 1.05), the importance weights' effective sample size (verl: 0.3), the k3 estimate of KL, the
95% upper confidence bound of the action-flip rate and, for a Gaussian head, the shift of the mean in units of the
policy's std. Judged on the ordinary observation rows (synthetic ±1e4 extremes are judged element-wise only).

For every continuous head (deterministic or Gaussian) the env action itself is bounded too: its error relative to the
action range (``action_error``, max and p99 over rows), so a policy whose log-ratio says nothing (a deterministic
action) is still judged in its own terms.

The bounds belong to the verifier, one set per precision a runtime computes in, never to the bundle under test: a
precision plan recorded in a manifest may only tighten them (``PolicyBounds.tightened``). The defaults are set from
measurements (``bench/precision_plans.py``, ``bench/results/precision_plans.md``): fp32 runtimes of trained policies
stay within 1 + 1e-4 of a perfect match (worst mean exp|Δ log π| measured 1.00005, k3 KL 4e-9, on Pendulum-v1); the
fp16 emulation of the same policies within 1.003 (k3 KL 2e-6). Each default sits one to two orders of magnitude above
what agreeing runtimes reach and below what a broken layer gives (the LayerNorm that fp16 overflows: mean
exp|Δ log π| 1.6, ESS 0.62). int8 may move the policy by no more than fp16 moves it, plus at most 1% flips (upper
bound), 2% of the action range at p99 and 5% of the return.

Who decides (``Preset.policy_decides``): under int8 the bounds are the verdict (element-wise numbers of a quantized
graph say little). Under fp32 and fp16 the element-wise tolerance decides and a policy beyond these bounds is a
warning: a Gaussian head with a very small std turns differences the tolerance accepts into large log-ratios, which is
the policy's sharpness, not a fault of the runtime.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from inference.compare.checks import Check
from inference.compare.judge.evidence import same_shape, select_rows
from inference.compare.judge.policy_level import flip_rate_ucb, policy_metrics


@dataclass(frozen=True)
class PolicyBounds:
    mean_exp_abs: float  # mean exp|Δ log π| of sampled actions, at most (1.0: a perfect match)
    ess: float  # normalised effective sample size of the importance weights, at least
    k3_kl: float  # k3 estimate of KL(reference || runtime), at most
    mean_shift_in_std: float  # Gaussian heads: p99 over rows of max |Δ mean| / std, at most
    flip_rate_ucb: float | None = None  # discrete actions: 95% upper bound of the flip rate, at most (None: not gated)
    return_difference: float | None = None  # paired episodes: |Δ mean return| / max(|ref mean|, 1), at most
    action_error_p99: float | None = None  # continuous actions: p99 over rows of max |Δ action| / range, at most
    action_error_max: float | None = None  # continuous actions: the largest |Δ action| / range, at most

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def tightened(self, claimed: Mapping[str, Any] | None) -> PolicyBounds:
        """These bounds with every number of ``claimed`` (a plan's recorded bounds) that is stricter: a bundle may ask
        to be judged more strictly, never less. A value that is not a finite number is ignored."""
        out = asdict(self)
        for key, value in (claimed or {}).items():
            if key not in out or isinstance(value, bool) or not isinstance(value, int | float) or \
                    not np.isfinite(value):  # fmt: skip
                continue
            mine = out[key]
            if mine is None:
                continue  # not gated by the verifier: a claim cannot add a bar it would then own
            out[key] = max(mine, min(float(value), 1.0)) if key == "ess" else min(mine, float(value))
        return PolicyBounds(**out)


POLICY_BOUNDS: dict[str, PolicyBounds] = {
    "fp32": PolicyBounds(mean_exp_abs=1.001, ess=0.999, k3_kl=1e-6, mean_shift_in_std=1e-3, action_error_p99=1e-4,
                         action_error_max=1e-3),
    "fp16": PolicyBounds(mean_exp_abs=1.05, ess=0.9, k3_kl=1e-3, mean_shift_in_std=0.05, action_error_p99=0.01,
                         action_error_max=0.05),
    "int8": PolicyBounds(mean_exp_abs=1.05, ess=0.9, k3_kl=1e-3, mean_shift_in_std=0.1, flip_rate_ucb=0.01,
                         return_difference=0.05, action_error_p99=0.02, action_error_max=0.1),
}  # fmt: skip
# A lowered runtime against the Cell that was trained computing in the same numerics (``train --lower``): the two
# compute the same integers (int8: Lite's rounding rules, fixed-point rescale and Tanh included) or the same fp16
# roundings, so what may differ is a rounding boundary now and then (int8 measured bit for bit on CartPole-v1,
# Pendulum-v1 and BipedalWalker-v3: bench/results/lowered_training.md), never the quantization error the
# post-training bounds above allow.
TRAINED_BOUNDS: dict[str, PolicyBounds] = {
    "int8": PolicyBounds(mean_exp_abs=1.005, ess=0.99, k3_kl=1e-4, mean_shift_in_std=0.01, flip_rate_ucb=0.005,
                         return_difference=0.02, action_error_p99=0.005, action_error_max=0.05),
    "fp16": PolicyBounds(mean_exp_abs=1.005, ess=0.99, k3_kl=1e-4, mean_shift_in_std=0.01, flip_rate_ucb=0.005,
                         return_difference=0.02, action_error_p99=0.002, action_error_max=0.01),
}  # fmt: skip


def gate_metrics(
    contract: Any, ref: Mapping[str, np.ndarray], got: Mapping[str, np.ndarray], noise: np.ndarray | None,
    rows: np.ndarray,
) -> dict[str, Any]:  # fmt: skip
    """The policy-level numbers a gate reads, on ``rows`` (a mask): ``mismatch`` of sampled actions, the flip rate
    with its upper bound, the Gaussian mean shift."""
    r, g = select_rows(ref, rows), select_rows(got, rows)
    if not rows.any() or not all(same_shape(r, g, k) for k in r):
        return {}
    host = noise[rows] if noise is not None and contract.samples_on_host else None
    inside = noise[rows] if noise is not None and contract.takes_noise else None
    metrics = policy_metrics(contract, r, g, host, inside)
    out: dict[str, Any] = {"rows": int(rows.sum())}
    if "log_ratio" in metrics and metrics["log_ratio"].get("count"):
        out["mismatch"] = metrics["log_ratio"]["mismatch"]
        out["log_ratio"] = {k: metrics["log_ratio"]["quantiles"][k] for k in ("p1", "p50", "p99")}
    if contract.action.is_discrete:
        ra = np.asarray(contract.env_action(r)).reshape(int(rows.sum()), -1)
        ga = np.asarray(contract.env_action(g)).reshape(int(rows.sum()), -1)
        flips = int((ra != ga).any(1).sum())
        out["flip_rate"] = {"count": flips, "rate": flips / max(1, len(ra)), "ucb": flip_rate_ucb(flips, len(ra))}
    if "mean_shift_in_std" in metrics:
        out["mean_shift_in_std"] = metrics["mean_shift_in_std"]
    if "action_error" in metrics:
        out["action_error"] = metrics["action_error"]
    return out


def judge(metrics: Mapping[str, Any], bounds: PolicyBounds, rate_only: bool = False) -> list[str]:
    """What breaks ``bounds``, one phrase each (empty: within them). ``rate_only``: the flip rate itself against its
    bound, not its upper confidence bound (what a verdict on too few rows to bound it can still say)."""
    broken = []
    m = metrics.get("mismatch") or {}
    if m.get("mean_exp_abs") is not None and not m["mean_exp_abs"] <= bounds.mean_exp_abs:
        broken.append(f"mean exp|Δ log π| {m['mean_exp_abs']:.4g} > {bounds.mean_exp_abs:g}")
    if m.get("ess") is not None and not m["ess"] >= bounds.ess:
        broken.append(f"ESS {m['ess']:.4g} < {bounds.ess:g}")
    if m.get("k3_kl") is not None and not m["k3_kl"] <= bounds.k3_kl:
        broken.append(f"k3 KL {m['k3_kl']:.3g} > {bounds.k3_kl:g}")
    flips = metrics.get("flip_rate")
    if flips and bounds.flip_rate_ucb is not None and not flips["rate" if rate_only else "ucb"] <= bounds.flip_rate_ucb:
        broken.append(
            f"flip rate {flips['rate']:.2%} (95% upper bound {flips['ucb']:.2%}) > {bounds.flip_rate_ucb:.2%}"
        )
    shift = (metrics.get("mean_shift_in_std") or {}).get("p99")
    if shift is not None and not shift <= bounds.mean_shift_in_std:
        broken.append(f"p99 |Δ mean| / std {shift:.3g} > {bounds.mean_shift_in_std:g}")
    error = metrics.get("action_error") or {}
    for key, bound in (("p99", bounds.action_error_p99), ("max", bounds.action_error_max)):
        if bound is not None and error.get(key) is not None and not error[key] <= bound:
            broken.append(f"{key} |Δ action| {error[key]:.3g} of the action range > {bound:g}")
    return broken


def describe(metrics: Mapping[str, Any]) -> str:
    """The numbers in one phrase, for the console and report.md."""
    parts = []
    m = metrics.get("mismatch") or {}
    if m.get("count"):
        parts.append(f"mean exp|Δ log π| {m['mean_exp_abs']:.6f}, ESS {m['ess']:.4f}, k3 KL {m['k3_kl']:.2e}, "
                     f"IS mean {m['is_mean']:.4f} ({m['count']} sampled actions)")  # fmt: skip
    if metrics.get("flip_rate"):
        f = metrics["flip_rate"]
        parts.append(f"flips {f['count']} ({f['rate']:.2%}, 95% upper bound {f['ucb']:.2%})")
    shift = (metrics.get("mean_shift_in_std") or {}).get("p99")
    if shift is not None:
        parts.append(f"p99 |Δ mean| / std {shift:.2e}")
    error = metrics.get("action_error") or {}
    if error.get("max") is not None:
        parts.append(
            f"|Δ action| of the {error.get('relative_to', 'action range')}: p99 {error['p99']:.2e}, "
            f"max {error['max']:.2e}"
        )
    return "; ".join(parts)


def plan_culprit(plan: Mapping[str, Any]) -> str:
    """The lowered layers of a plan that broke the bounds when lowered alone (the plan's measured sensitivity), most
    sensitive first: the layers to keep."""
    lowered = [layer for layer in plan.get("layers", []) if layer.get("precision") != "fp32"]
    badness = lambda layer: (layer.get("sensitivity") or {}).get("badness")  # noqa: E731 - None: could not run
    bad = sorted((layer for layer in lowered if not (layer.get("sensitivity") or {}).get("ok", True)),
                 key=lambda layer: -float(badness(layer) if badness(layer) is not None else "inf"))  # fmt: skip
    if not bad:
        return ""
    names = ", ".join(f"{layer['scope']} (alone: badness {layer['sensitivity'].get('badness')})" for layer in bad)
    return f"; lowered here although it breaks the bounds alone: {names}"


def policy_check(
    runtime: str, graph: str, bundle: Any, ref: Any, got: Mapping[str, np.ndarray], bounds: PolicyBounds,
    preset: Any,
) -> Check | None:  # fmt: skip
    """The ``policy.<graph>`` check: the graph's policy-level mismatch against ``bounds`` on the rows ``preset``
    (a ``stats.Preset``) judges, among the ordinary ones (None when the graph gives none of these numbers)."""
    rows = preset.judged(ref.feeds) & ref.feeds.ordinary
    rows = rows if rows.any() else ref.feeds.finite & ref.feeds.ordinary
    noise = ref.feeds.noise.get(graph)
    metrics = gate_metrics(bundle.contract(graph), ref.outputs[graph], got, noise, rows)
    if not any(k in metrics for k in ("mismatch", "flip_rate", "mean_shift_in_std", "action_error")):
        return None
    metrics["bounds"] = {**bounds.to_dict(), "preset": preset.name}
    broken = judge(metrics, bounds, rate_only=True)
    text = describe(metrics)
    unsure = [] if broken else judge(metrics, bounds)  # within on the rate, beyond on its upper bound: too few rows
    if broken and not preset.policy_decides:
        return Check(runtime, f"policy.{graph}", "warn", f"the policy moved beyond the {preset.name} bounds although "
                     f"the element-wise tolerance decides here: {'; '.join(broken)} ({text})", metrics)  # fmt: skip
    if broken:
        culprit = plan_culprit(bundle.plan) if bundle.plan else ""
        return Check(runtime, f"policy.{graph}", "fail", f"the policy moved beyond the {preset.name} bounds: "
                     f"{'; '.join(broken)} ({text}){culprit}", metrics,
                     {"stage": "precision", "detail": f"the runtime's action distribution differs from the "
                      f"reference's beyond what {preset.name} allows"})  # fmt: skip
    if unsure:
        return Check(runtime, f"policy.{graph}", "warn", f"within the {preset.name} policy bounds on the rate, but too "
                     f"few observations ({metrics['rows']}) to bound it: {'; '.join(unsure)}; more --observations "
                     f"would ({text})", metrics)  # fmt: skip
    return Check(runtime, f"policy.{graph}", "pass", f"within the {preset.name} policy bounds: {text}", metrics)
