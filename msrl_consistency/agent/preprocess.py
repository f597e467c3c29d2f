"""In-graph observation normalisation and action post-processing, plus the host running statistics.

The normaliser's mean and variance are Parameters (``requires_grad=False``): training updates them
from rollouts, the checkpoint freezes them, and every exported graph carries them.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from mindspore import Parameter, Tensor, nn, ops

NORM_EPS = 1e-8


class ObsNormalizer(nn.Cell):
    """``clip((obs - mean) / sqrt(var + eps), -clip, clip)``, or identity when disabled."""

    def __init__(self, dim: int, clip: float, enabled: bool = True) -> None:
        super().__init__()
        self.enabled = enabled
        self.clip = float(clip)
        self.mean = Parameter(Tensor(np.zeros(dim, np.float32)), name="mean", requires_grad=False)
        self.var = Parameter(Tensor(np.ones(dim, np.float32)), name="var", requires_grad=False)

    def construct(self, obs: Tensor) -> Tensor:
        if not self.enabled:
            return obs
        x = (obs - self.mean) / ops.sqrt(self.var + NORM_EPS)
        return ops.clamp(x, -self.clip, self.clip)


class ActionPostprocess(nn.Cell):
    """Map a raw Gaussian action to the env's bounds: clip to [-1, 1] or tanh-squash, then rescale."""

    def __init__(self, low: list[float], high: list[float], mode: str = "clip", enabled: bool = True) -> None:
        super().__init__()
        self.mode = mode
        self.enabled = enabled
        low_arr, high_arr = np.asarray(low, np.float32), np.asarray(high, np.float32)
        self.action_center = Parameter(Tensor((high_arr + low_arr) / 2), name="action_center", requires_grad=False)
        self.action_half = Parameter(Tensor((high_arr - low_arr) / 2), name="action_half", requires_grad=False)

    def construct(self, raw: Tensor) -> Tensor:
        if not self.enabled:
            return raw
        squashed = ops.tanh(raw) if self.mode == "tanh" else ops.clamp(raw, -1.0, 1.0)
        return self.action_center + self.action_half * squashed


@dataclass
class RunningMeanStd:
    """Running mean/variance in float64 on the host, merged per batch (Chan et al. parallel variance)."""

    mean: np.ndarray
    var: np.ndarray
    count: float = 1e-4

    @classmethod
    def zeros(cls, dim: int) -> RunningMeanStd:
        return cls(np.zeros(dim, np.float64), np.ones(dim, np.float64))

    def update(self, batch: np.ndarray) -> None:
        self.update_from_moments(*batch_moments(batch, self.mean.shape[0]))

    def update_from_moments(self, b_mean: np.ndarray, b_var: np.ndarray, b_count: float) -> None:
        """Merge a batch given by its mean, variance and count (one rank's, or all ranks' merged)."""
        delta = b_mean - self.mean
        total = self.count + b_count
        self.mean = self.mean + delta * b_count / total
        m2 = self.var * self.count + b_var * b_count + delta**2 * self.count * b_count / total
        self.var = m2 / total
        self.count = total

    def copy_to(self, normalizer: ObsNormalizer) -> None:
        """Write the statistics into the graph Parameters (float32) used for the next rollout."""
        normalizer.mean.set_data(Tensor(self.mean.astype(np.float32)))
        normalizer.var.set_data(Tensor(self.var.astype(np.float32)))


def batch_moments(batch: np.ndarray, dim: int) -> tuple[np.ndarray, np.ndarray, int]:
    """(mean, variance, count) of a batch of observations, in float64."""
    batch = np.asarray(batch, np.float64).reshape(-1, dim)
    return batch.mean(0), batch.var(0), batch.shape[0]


def merge_moments(parts: list[tuple[np.ndarray, np.ndarray, float]]) -> tuple[np.ndarray, np.ndarray, float]:
    """Chan et al.'s parallel merge of (mean, variance, count) triples, in the order given.

    Data-parallel ranks each measure their own rollout; every rank merges all ranks' triples in rank order, so
    every rank computes the same float64 result. M2 (= variance x count) is what adds up. One part is
    returned unchanged (a single process merges nothing).
    """
    if len(parts) == 1:
        return parts[0]
    mean, var, count = parts[0]
    m2 = var * count
    for b_mean, b_var, b_count in parts[1:]:
        delta = b_mean - mean
        total = count + b_count
        mean = mean + delta * b_count / total
        m2 = m2 + b_var * b_count + delta**2 * count * b_count / total
        count = total
    return mean, m2 / count, count


def numpy_normalize(obs: np.ndarray, mean: np.ndarray, var: np.ndarray, clip: float) -> np.ndarray:
    """NumPy reference of ``ObsNormalizer`` (float32 arithmetic, same op order)."""
    obs, mean, var = (np.asarray(a, np.float32) for a in (obs, mean, var))
    x = (obs - mean) / np.sqrt(var + np.float32(NORM_EPS))
    return np.clip(x, -clip, clip)
