"""Seeded observation and noise feeds for comparing runtimes.

Three sources, as a deployment sees them: states around the normalisation statistics, samples within
the observation bounds, and edge cases (zeros, bounds, extremes). States visited in seeded episodes are
added by ``verify`` (it needs a policy to drive the env).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from inference.bundle import Bundle

FEED_STREAM = 11


@dataclass
class Feeds:
    """Observations with a label per row (which source it came from) and the matching sampling noise."""

    obs: np.ndarray
    source: np.ndarray  # str labels: "stats" | "bounds" | "edge" | "episode"
    noise: np.ndarray

    def __len__(self) -> int:
        return len(self.obs)


def _finite_bounds(bundle: Bundle) -> tuple[np.ndarray, np.ndarray]:
    env = bundle.manifest["env"]
    return np.asarray(env["obs_low"], np.float64), np.asarray(env["obs_high"], np.float64)


def edge_observations(bundle: Bundle) -> np.ndarray:
    """Zeros, the normalisation mean, finite bounds, and values far beyond the clip range."""
    norm = bundle.manifest["normalization"]
    mean, std = np.asarray(norm["mean"]), np.sqrt(np.asarray(norm["var"]))
    low, high = _finite_bounds(bundle)
    rows = [
        np.zeros_like(mean),
        mean,
        mean + 50 * std,
        mean - 50 * std,
        np.full_like(mean, 1e4),
        -np.full_like(mean, 1e4),
    ]
    for bound in (low, high):
        rows.append(np.where(np.isfinite(bound), bound, mean))
    return np.asarray(rows, np.float32)


def sample_observations(bundle: Bundle, n: int, rng: np.random.Generator) -> Feeds:
    """``n`` observations: half around the statistics (±3σ), the rest within bounds, plus edge cases."""
    norm = bundle.manifest["normalization"]
    mean, std = np.asarray(norm["mean"]), np.sqrt(np.asarray(norm["var"]))
    low, high = _finite_bounds(bundle)
    edges = edge_observations(bundle)[: max(0, n)]
    n_rest = max(0, n - len(edges))
    n_stats = n_rest // 2
    stats = mean + std * rng.uniform(-3.0, 3.0, (n_stats, len(mean)))
    lo = np.where(np.isfinite(low), low, mean - 4 * std)
    hi = np.where(np.isfinite(high), high, mean + 4 * std)
    bounds = rng.uniform(lo, hi, (n_rest - n_stats, len(mean)))
    obs = np.concatenate([stats, bounds, edges]).astype(np.float32)
    source = np.array(["stats"] * n_stats + ["bounds"] * (n_rest - n_stats) + ["edge"] * len(edges))
    return Feeds(obs[:n], source[:n], bundle.sample_noise(rng, len(obs[:n])))


def seeded_feeds(bundle: Bundle, n: int, seed: int) -> Feeds:
    return sample_observations(bundle, n, np.random.default_rng([seed, FEED_STREAM]))
