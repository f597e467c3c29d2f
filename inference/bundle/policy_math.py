"""NumPy mirrors of the operations policy graphs compute around their networks: the one noise generator, Gumbel-max
sampling, log-softmax, Gaussian log-probabilities and the top-2 margin a discrete decision is judged by. NumPy only:
the deploy side acts with them."""

from __future__ import annotations

import math

import numpy as np

# Uniform noise is kept away from 0 and 1 so that -log(-log(u)) stays finite in float32; the training side's graphs
# clamp with this same bound (1e-6 because MindSpore's CPU log is 0 at 1 - 1.2e-7).
UNIFORM_EPS = np.float32(1e-6)


def sample_noise(rng: np.random.Generator, kind: str, batch: int, dim: int) -> np.ndarray:
    """The project's one noise generator: ``random()`` for uniform, ``standard_normal()`` for normal."""
    if kind == "uniform":
        return rng.random((batch, dim), dtype=np.float32)
    return rng.standard_normal((batch, dim), dtype=np.float32)


def argmax_int32(x: np.ndarray) -> np.ndarray:
    return np.argmax(np.asarray(x), axis=-1).astype(np.int32)


def gumbel(uniform: np.ndarray) -> np.ndarray:
    """Gumbel noise ``-log(-log(u))`` from uniform noise clamped away from 0 and 1, as the exported graphs do."""
    u = np.clip(np.asarray(uniform, np.float32), UNIFORM_EPS, np.float32(1) - UNIFORM_EPS)
    return -np.log(-np.log(u))


def gumbel_argmax(logits: np.ndarray, uniform: np.ndarray) -> np.ndarray:
    """argmax(logits + Gumbel(u)): a sample from softmax(logits), as the exported graphs compute it."""
    return argmax_int32(np.asarray(logits, np.float32) + gumbel(uniform))


def top2_margin(scores: np.ndarray, values: np.ndarray | None = None) -> np.ndarray:
    """Per row ``[margin, |v1|, |v2|, max |v|]``: the gap between the two largest scores, the magnitude of the
    judged output (``values``: logits or Q-values without any Gumbel noise; default the scores) at those two
    entries, and the row's largest magnitude. What a flip between the two is judged with."""
    scores = np.asarray(scores, np.float64)
    values = scores if values is None else np.asarray(values, np.float64)
    order = np.argsort(scores, -1)[..., -2:]
    top = np.take_along_axis(scores, order, -1)
    magnitude = np.abs(np.take_along_axis(values, order, -1))
    row_max = np.where(np.isfinite(values), np.abs(values), 0.0).max(-1)
    return np.stack([top[..., 1] - top[..., 0], magnitude[..., 1], magnitude[..., 0], row_max], -1)


def log_softmax(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, np.float64)
    m = x.max(-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(-1, keepdims=True))


def gaussian_log_prob(mean: np.ndarray, std: np.ndarray, x: np.ndarray) -> np.ndarray:
    mean, std, x = (np.asarray(v, np.float64) for v in (mean, std, x))
    z = (x - mean) / std
    return (-0.5 * z * z - np.log(std) - 0.5 * math.log(2 * math.pi)).sum(-1)
