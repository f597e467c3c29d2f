"""Policy-level agreement, chosen by the contract's action kind.

* ``argmax``: flips of the chosen index with the reference's top-2 margin at each (no KL: Q-values are not
  a distribution);
* ``categorical``: flips with margins, KL between the two softmaxes, and |Δ log-prob| of host-sampled actions;
* ``gaussian``: KL between the two Gaussians with the per-state std when the policy outputs one, |Δ log-prob|
  of host-sampled actions, and the deterministic action's difference relative to the action range;
* ``deterministic``: the action difference relative to the action range (exact agreement when discrete).

A ``log_prob`` output (a graph that samples inside) is compared as |Δ log-prob| directly; its log-ratio is taken at
the reference's sampled action under both distributions (``same_action_log_probs``), since each graph's own log-prob
is that of its own sample (a Gaussian's is the same for any mean). The log-ratios of sampled
actions also give the mismatch numbers LLM-RL trainers gate rollout-versus-trainer mismatch on (``mismatch``): the
importance weights' mean and effective sample size, the k3 estimate of KL(reference || runtime) and the mean of
exp|Δ log π| (1.0 is a perfect match). Flip rates carry their 95% upper confidence bound (``flip_rate_ucb``), and a
Gaussian head the shift of its mean in units of the policy's std (``mean_shift_in_std``).
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


def flip_rate_ucb(flips: int, n: int, z: float = 1.96) -> float:
    """The upper end of the Wilson score interval of a flip rate (``z``: 1.96 for 95%): what a few thousand
    observations with no flip still allow (about 4e-4 for 10,000), so a rate is judged with its uncertainty."""
    if n <= 0:
        return 1.0
    p = flips / n
    centre = p + z * z / (2 * n)
    spread = z * np.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    return float(min(1.0, (centre + spread) / (1 + z * z / n)))


def mismatch(log_ratio: np.ndarray) -> dict[str, float | int | None]:
    """The mismatch of sampled actions from their log-ratios ``r = log π_runtime(a|s) - log π_ref(a|s)`` (actions
    drawn from the reference): importance weights ``w = exp(r)`` (mean 1 for a perfect match), their normalised
    effective sample size ``(Σw)² / (n Σw²)`` (1 is perfect; verl gates at 0.3), the k3 estimate of
    KL(ref || runtime), ``mean(w - 1 - r)`` (verl's ``k3_kl``), and ``mean(exp|r|)`` (NeMo RL gates at 1.05)."""
    r = np.asarray(log_ratio, np.float64)
    r = r[np.isfinite(r)]
    if not len(r):
        return {"count": 0, "is_mean": None, "ess": None, "k3_kl": None, "mean_exp_abs": None}
    w = np.exp(np.clip(r, -700, 700))
    return {
        "count": int(len(r)),
        "is_mean": float(w.mean()),
        "ess": float(w.sum() ** 2 / (len(r) * (w**2).sum())),
        "k3_kl": float(np.mean(w - 1 - r)),
        "mean_exp_abs": float(np.mean(np.exp(np.minimum(np.abs(r), 700)))),
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
            "quantiles": dict(zip(("min", "p1", "p50", "p99", "max"), map(float, q), strict=True)),
            "mismatch": mismatch(ratio)}  # fmt: skip


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
    if diff.size:
        out["action_error"] = action_error(ref, diff, span)
    return out


def action_error(ref: np.ndarray, diff: np.ndarray, span: np.ndarray | None) -> dict[str, Any]:
    """Each row's largest |Δ action| relative to the action range (an unbounded action: to twice the reference's
    largest |action|), its p99 and max over rows: the action-level bound of a continuous head."""
    if span is not None and np.isfinite(span).all() and (np.asarray(span) > 0).all():
        rel, what = diff / np.broadcast_to(span, diff.shape[1:]), "action range"
    else:
        finite = np.abs(ref.astype(np.float64))[np.isfinite(ref)]
        rel, what = diff / max(2.0 * float(finite.max(initial=0.0)), 1e-12), "reference's action span"
    per_row = np.where(np.isfinite(rel), rel, np.inf).max(1)
    return {"p99": float(np.percentile(per_row, 99)), "max": float(per_row.max()), "relative_to": what}


def same_action_log_probs(
    contract: PolicyContract, ref: Mapping[str, np.ndarray], got: Mapping[str, np.ndarray], noise: np.ndarray | None
) -> tuple[np.ndarray, np.ndarray] | None:
    """log π_ref(a|s) and log π_runtime(a|s) of the action the reference's graph sampled from its noise input ``noise``
    (a categorical head's sampled index; a Gaussian's pre-squash ``mean + std * noise``), from each side's own
    distribution outputs; None when the outputs do not give the distributions."""
    a = contract.action
    heads = range(len(a.heads))
    if a.kind == "categorical" and a.action is not None and all(h in ref and h in got for h in a.heads):
        idx = np.asarray(ref[a.action]).astype(np.int64).reshape(len(ref[a.action]), -1)
        take = lambda out, h: np.take_along_axis(contract.log_probs(out, h), idx[:, h : h + 1], -1)[:, 0]  # noqa: E731
        return sum(take(ref, h) for h in heads), sum(take(got, h) for h in heads)
    if a.kind == "gaussian" and noise is not None and contract.noise_kind == "normal" and a.mean in ref:
        mean_r, mean_g = np.asarray(ref[a.mean], np.float64), np.asarray(got[a.mean], np.float64)  # type: ignore[index]
        std_r, std_g = contract.std(ref, mean_r.shape), contract.std(got, mean_g.shape)
        if np.shape(noise) != mean_r.shape:
            return None
        raw = mean_r + std_r * np.asarray(noise, np.float64)
        return gaussian_log_prob(mean_r, std_r, raw), gaussian_log_prob(mean_g, std_g, raw)
    return None


def policy_metrics(
    contract: PolicyContract,
    ref: Mapping[str, np.ndarray],
    got: Mapping[str, np.ndarray],
    host_noise: np.ndarray | None,
    graph_noise: np.ndarray | None = None,
) -> dict[str, Any]:
    """The kind's metrics for one batch of outputs (rows already restricted to finite observations); ``graph_noise``:
    the noise a graph that samples inside was fed (for the log-ratio at the reference's sampled action)."""
    a = contract.action
    metrics: dict[str, Any] = {}
    ref_action, got_action = contract.env_action(ref), contract.env_action(got)
    heads = range(len(a.heads))
    if a.kind in ("argmax", "categorical", "distributional"):
        ra, ga = ref_action.reshape(len(ref_action), -1), got_action.reshape(len(got_action), -1)
        per_head = [argmax_flips(contract.decision_values(ref, h), ra[:, h], ga[:, h]) for h in heads]
        metrics["argmax"] = (
            per_head[0]
            if not a.multi_head
            else {"flips": sum(f["flips"] for f in per_head), "heads": dict(zip(a.heads, per_head, strict=True))}
        )
        rows_flipped = int((ra != ga).any(1).sum()) if len(ra) else 0
        metrics["argmax"]["flip_rate_ucb"] = flip_rate_ucb(rows_flipped, len(ra))
    if a.kind == "categorical":  # independent heads: the joint KL is the sum of the heads'
        kl = sum(categorical_kl(contract.log_probs(ref, h), contract.log_probs(got, h)) for h in heads)
        metrics["kl"] = summarize(kl)
    if a.kind == "gaussian":
        mean_r, mean_g = ref[a.mean], got[a.mean]  # type: ignore[index]
        std_r, std_g = contract.std(ref, mean_r.shape), contract.std(got, mean_g.shape)
        metrics["kl"] = summarize(gaussian_kl(mean_r, std_r, mean_g, std_g))
        with np.errstate(divide="ignore", invalid="ignore"):
            shift = (np.abs(np.asarray(mean_g, np.float64) - np.asarray(mean_r, np.float64)) / std_r).reshape(
                len(mean_r), -1).max(1) if len(mean_r) else np.zeros(0)  # fmt: skip
        metrics["mean_shift_in_std"] = {**summarize(shift), "p99": float(np.percentile(shift[np.isfinite(shift)], 99))
                                        if np.isfinite(shift).any() else None}  # fmt: skip
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
        same = same_action_log_probs(contract, ref, got, graph_noise)
        metrics["log_ratio"] = log_ratio_distribution(*same) if same is not None else \
            log_ratio_distribution(ref[contract.log_prob], got[contract.log_prob])  # fmt: skip
    return metrics
