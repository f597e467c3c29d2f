"""Policy-level agreement: argmax flips with their top-2 margins, |Δ log-prob|, KL between action laws."""

from __future__ import annotations

import numpy as np


def _log_softmax(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    m = x.max(-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(-1, keepdims=True))


def argmax_flips(
    ref_logits: np.ndarray, got_logits: np.ndarray, ref_action: np.ndarray, got_action: np.ndarray
) -> dict:
    """Rows where the chosen action differs, with the reference's top-2 logit margin at each."""
    flips = np.flatnonzero(ref_action != got_action)
    top2 = np.sort(ref_logits.astype(np.float64), -1)[:, -2:]
    margin = top2[:, 1] - top2[:, 0]
    return {
        "flips": int(len(flips)),
        "flip_rate": float(len(flips) / max(1, len(ref_action))),
        "flip_rows": flips[:20].tolist(),
        "flip_margins": margin[flips][:20].tolist(),
        "min_margin_overall": float(margin.min()) if len(margin) else None,
    }


def categorical_kl(ref_logits: np.ndarray, got_logits: np.ndarray) -> np.ndarray:
    lp, lq = _log_softmax(ref_logits), _log_softmax(got_logits)
    return (np.exp(lp) * (lp - lq)).sum(-1)


def gaussian_kl(ref_mean: np.ndarray, got_mean: np.ndarray, log_std: np.ndarray) -> np.ndarray:
    """KL between diagonal Gaussians sharing the state-independent std (only the means can differ)."""
    var = np.exp(2.0 * np.asarray(log_std, np.float64))
    return ((ref_mean.astype(np.float64) - got_mean.astype(np.float64)) ** 2 / (2.0 * var)).sum(-1)


def summarize(values: np.ndarray) -> dict:
    values = np.asarray(values, np.float64)
    finite = values[np.isfinite(values)]
    if not len(finite):
        return {"mean": None, "max": None}
    return {"mean": float(finite.mean()), "max": float(finite.max())}
