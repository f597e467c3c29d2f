"""Policy-level agreement, chosen by the contract's action kind.

* ``argmax``: flips of the chosen index with the reference's top-2 margin at each (no KL: Q-values are not
  a distribution);
* ``categorical``: flips with margins, KL between the two softmaxes, and |Δ log-prob| of host-sampled actions;
* ``gaussian``: KL between the two Gaussians with the per-state std when the policy outputs one, |Δ log-prob|
  of host-sampled actions, and the deterministic action's difference relative to the action range;
* ``deterministic``: the action difference relative to the action range (exact agreement when discrete).

A ``log_prob`` output (a graph that samples inside) is compared as |Δ log-prob| directly.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from inference.bundle.contract import PolicyContract, gaussian_log_prob, log_softmax


def argmax_flips(ref_scores: np.ndarray, ref_action: np.ndarray, got_action: np.ndarray) -> dict[str, Any]:
    """Rows where the chosen index differs, with the reference's top-2 margin at each."""
    flips = np.flatnonzero(ref_action != got_action)
    top2 = np.sort(ref_scores.astype(np.float64), -1)[:, -2:]
    margin = top2[:, 1] - top2[:, 0]
    return {
        "flips": int(len(flips)),
        "flip_rate": float(len(flips) / max(1, len(ref_action))),
        "flip_rows": flips[:20].tolist(),
        "flip_margins": margin[flips][:20].tolist(),
        "max_flip_margin": float(margin[flips].max()) if len(flips) else None,
        "min_margin_overall": float(margin.min()) if len(margin) else None,
    }


def categorical_kl(ref_logits: np.ndarray, got_logits: np.ndarray) -> np.ndarray:
    """KL(ref || got) between the softmaxes of two logit batches (normalised log-probabilities work as logits)."""
    lp, lq = log_softmax(ref_logits), log_softmax(got_logits)
    with np.errstate(invalid="ignore"):
        return np.where(np.exp(lp) > 0, np.exp(lp) * (lp - lq), 0.0).sum(-1)


def gaussian_kl(ref_mean: np.ndarray, ref_std: np.ndarray, got_mean: np.ndarray, got_std: np.ndarray) -> np.ndarray:
    """KL(ref || got) between diagonal Gaussians, summed over action dims."""
    m1, s1, m2, s2 = (np.asarray(v, np.float64) for v in (ref_mean, ref_std, got_mean, got_std))
    return (np.log(s2 / s1) + (s1**2 + (m1 - m2) ** 2) / (2 * s2**2) - 0.5).sum(-1)


def summarize(values: np.ndarray) -> dict[str, float | None]:
    values = np.asarray(values, np.float64)
    finite = values[np.isfinite(values)]
    if not len(finite):
        return {"mean": None, "max": None}
    return {"mean": float(finite.mean()), "max": float(finite.max())}


# The log-ratio histogram's bins: |log p_runtime(a) - log p_ref(a)| by half decades from 1e-9 to 10, each sign apart.
LOG_RATIO_EDGES = tuple(10.0 ** (k / 2) for k in range(-18, 3))


def log_ratio_distribution(ref_log_prob: np.ndarray, got_log_prob: np.ndarray) -> dict[str, Any]:
    """The distribution of ``log p_runtime(a) - log p_ref(a)`` over the sampled actions, for the report's histogram
    (verl's mismatch plots): quantiles, the exact zeros, and per sign the counts in ``LOG_RATIO_EDGES`` (half
    decades; values beyond the last edge fall in the last bin, below the first in the first)."""
    ratio = np.asarray(got_log_prob, np.float64) - np.asarray(ref_log_prob, np.float64)
    ratio = ratio[np.isfinite(ratio)]
    if not len(ratio):
        return {"count": 0}
    edges = np.asarray(LOG_RATIO_EDGES)
    nonzero = ratio[ratio != 0]
    bins = np.clip(np.searchsorted(edges, np.abs(nonzero), "right") - 1, 0, len(edges) - 2)
    counts = {sign: np.bincount(bins[mask], minlength=len(edges) - 1).tolist()
              for sign, mask in (("negative", nonzero < 0), ("positive", nonzero > 0))}  # fmt: skip
    q = np.percentile(ratio, [0, 1, 50, 99, 100])
    return {"count": int(len(ratio)), "zeros": int((ratio == 0).sum()), "edges": list(LOG_RATIO_EDGES), **counts,
            "quantiles": dict(zip(("min", "p1", "p50", "p99", "max"), map(float, q), strict=True))}  # fmt: skip


def _action_range(contract: PolicyContract) -> np.ndarray | None:
    a = contract.action
    if a.low is None or a.high is None:
        return None
    return np.asarray(a.high, np.float64) - np.asarray(a.low, np.float64)


def action_difference(contract: PolicyContract, ref: np.ndarray, got: np.ndarray) -> dict[str, Any]:
    """Agreement of two env-action batches: exact for indices, else max |Δ| absolute and relative to the range."""
    if contract.action.is_discrete:
        agree = (ref == got).reshape(len(ref), -1).all(1)  # every head
        return {"action_agreement": float(agree.mean()) if agree.size else 1.0}
    diff = np.abs(ref.astype(np.float64) - got.astype(np.float64)).reshape(len(ref), -1)
    out: dict[str, Any] = {"max_abs_action_diff": float(diff.max()) if diff.size else 0.0}
    span = _action_range(contract)
    if span is not None and diff.size:
        out["max_action_diff_relative_to_range"] = float((diff / np.broadcast_to(span, diff.shape[1:])).max())
    return out


def policy_metrics(
    contract: PolicyContract,
    ref: Mapping[str, np.ndarray],
    got: Mapping[str, np.ndarray],
    host_noise: np.ndarray | None,
) -> dict[str, Any]:
    """The kind's metrics for one batch of outputs (rows already restricted to finite observations)."""
    a = contract.action
    metrics: dict[str, Any] = {}
    ref_action, got_action = contract.env_action(ref), contract.env_action(got)
    heads = range(len(a.heads))
    if a.kind in ("argmax", "categorical", "distributional"):
        ra, ga = ref_action.reshape(len(ref_action), -1), got_action.reshape(len(got_action), -1)
        per_head = [argmax_flips(contract.decision_values(ref, h), ra[:, h], ga[:, h]) for h in heads]
        metrics["argmax"] = per_head[0] if not a.multi_head else {
            "flips": sum(f["flips"] for f in per_head), "heads": dict(zip(a.heads, per_head, strict=True))}
    if a.kind == "categorical":  # independent heads: the joint KL is the sum of the heads'
        kl = sum(categorical_kl(contract.log_probs(ref, h), contract.log_probs(got, h)) for h in heads)
        metrics["kl"] = summarize(kl)
    if a.kind == "gaussian":
        mean_r, mean_g = ref[a.mean], got[a.mean]  # type: ignore[index]
        std_r, std_g = contract.std(ref, mean_r.shape), contract.std(got, mean_g.shape)
        metrics["kl"] = summarize(gaussian_kl(mean_r, std_r, mean_g, std_g))
    metrics.update(action_difference(contract, ref_action, got_action))
    if host_noise is not None and contract.samples_on_host:
        ref_sample = contract.env_action(ref, host_noise)
        got_sample = contract.env_action(got, host_noise)
        metrics["sampled"] = action_difference(contract, ref_sample, got_sample)
        if a.kind == "categorical":
            idx = ref_sample.astype(np.int64).reshape(len(ref_sample), -1)
            lp_r = sum(np.take_along_axis(contract.log_probs(ref, h), idx[:, h : h + 1], -1)[:, 0] for h in heads)
            lp_g = sum(np.take_along_axis(contract.log_probs(got, h), idx[:, h : h + 1], -1)[:, 0] for h in heads)
        else:
            raw = np.asarray(mean_r, np.float64) + std_r * host_noise  # the reference's pre-squash sample
            lp_r, lp_g = gaussian_log_prob(mean_r, std_r, raw), gaussian_log_prob(mean_g, std_g, raw)
        metrics["abs_delta_log_prob"] = summarize(np.abs(lp_r - lp_g))
        metrics["log_ratio"] = log_ratio_distribution(lp_r, lp_g)
    if contract.log_prob is not None:
        delta = np.abs(ref[contract.log_prob].astype(np.float64) - got[contract.log_prob].astype(np.float64))
        metrics["abs_delta_log_prob"] = summarize(delta)
        metrics["log_ratio"] = log_ratio_distribution(ref[contract.log_prob], got[contract.log_prob])
    return metrics
