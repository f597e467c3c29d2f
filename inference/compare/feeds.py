"""Seeded observation and noise feeds for comparing runtimes; they know nothing about the runtimes.

Observations come from where a deployment sees them: states visited in seeded episodes or recorded by the
team (added by the caller), samples around the observation statistics, samples within the observation
bounds, and edge cases (zeros, bounds, extremes, far beyond any normalisation clip). The statistics are the
bundle's frozen normalisation when it records one, else those of the visited or recorded observations.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from inference.bundle import Bundle

FEED_STREAM = 11


@dataclass
class Feeds:
    """Observations with a label per row (where it came from) and, per graph, the noise its stochastic action
    uses for that row (graphs without a stochastic action have none)."""

    obs: np.ndarray
    source: np.ndarray  # str labels: "episode" | "recorded" | "stats" | "bounds" | "edge" | "nan"
    noise: dict[str, np.ndarray]

    def __len__(self) -> int:
        return len(self.obs)

    @property
    def finite(self) -> np.ndarray:
        """Rows without NaN (NaN rows are checked separately: argmax of NaN is undefined)."""
        return ~np.isnan(self.obs.reshape(len(self.obs), -1)).any(1)

    @property
    def ordinary(self) -> np.ndarray:
        """Rows a policy could see: not the synthetic extremes (``edge``) or NaN rows, which a tolerance that grows
        with magnitude judges on their own (``stats.Tolerance.row_atol``)."""
        return ~np.isin(self.source, ("edge", "nan"))

    def describe(self, rows: np.ndarray | None = None) -> str:
        """Where the rows came from, e.g. "410 recorded + 9590 synthetic"."""
        labels = self.source if rows is None else self.source[rows]
        real = [(kind, int(np.sum(labels == kind))) for kind in ("recorded", "episode")]
        parts = [f"{n} {kind}" for kind, n in real if n]
        synthetic = int(np.isin(labels, ("stats", "bounds", "edge")).sum())
        if synthetic:
            parts.append(f"{synthetic} synthetic")
        return " + ".join(parts) or "0"

    def graph_inputs(self, bundle: Bundle, graph: str) -> list[np.ndarray]:
        """The arrays ``graph`` takes: the observations, plus its noise if the graph samples inside."""
        if bundle.contract(graph).takes_noise:
            return [self.obs, self.noise[graph]]
        return [self.obs]


def stochastic_graphs(bundle: Bundle) -> list[str]:
    """Graphs with a stochastic action: they take noise, or their outputs are sampled on the host."""
    return [g for g in bundle.graphs if bundle.contract(g).stochastic_noise_kind is not None]


def draw_noise(bundle: Bundle, rng: np.random.Generator, n: int) -> dict[str, np.ndarray]:
    return {g: bundle.sample_noise(g, rng, n) for g in stochastic_graphs(bundle)}


def observation_scale(bundle: Bundle, observed: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Centre and spread to sample around: the bundle's normalisation, else the observed states', else 0 and 1."""
    shape = bundle.contract(bundle.graphs[0]).obs_shape
    norm = bundle.manifest.get("normalization")
    if norm and norm.get("mean") is not None:
        return np.asarray(norm["mean"], np.float64), np.sqrt(np.asarray(norm["var"], np.float64))
    if observed is not None and len(observed):
        finite = observed.reshape(len(observed), -1)
        finite = finite[np.isfinite(finite).all(1)]
        if len(finite):
            return finite.mean(0).reshape(shape), np.maximum(finite.std(0), 1e-3).reshape(shape)
    return np.zeros(shape), np.ones(shape)


def _bounds(bundle: Bundle, mean: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    env = bundle.manifest.get("env") or {}
    low = np.asarray(env.get("obs_low", np.full(mean.shape, -np.inf)), np.float64).reshape(mean.shape)
    high = np.asarray(env.get("obs_high", np.full(mean.shape, np.inf)), np.float64).reshape(mean.shape)
    return low, high


def edge_observations(bundle: Bundle, mean: np.ndarray, std: np.ndarray) -> np.ndarray:
    """Zeros, the centre, far outside the spread, huge values, and the finite observation bounds."""
    low, high = _bounds(bundle, mean)
    rows = [np.zeros_like(mean), mean, mean + 50 * std, mean - 50 * std, np.full_like(mean, 1e4),
            -np.full_like(mean, 1e4)]  # fmt: skip
    for bound in (low, high):
        rows.append(np.where(np.isfinite(bound), bound, mean))
    return np.asarray(rows, np.float32)


def nan_observations(bundle: Bundle, mean: np.ndarray) -> np.ndarray:
    """One all-NaN row and one row with a single NaN: invalid input whose handling is flagged, not failed."""
    rows = np.stack([mean, mean]).astype(np.float32)
    rows[0] = np.nan
    rows.reshape(2, -1)[1, 0] = np.nan
    return rows


def sample_observations(
    bundle: Bundle, n: int, rng: np.random.Generator, mean: np.ndarray, std: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """``n`` observations: half around the statistics (±3σ), the rest within the bounds, edge cases last."""
    low, high = _bounds(bundle, mean)
    edges = edge_observations(bundle, mean, std)[: max(0, n)]
    n_rest = max(0, n - len(edges))
    n_stats = n_rest // 2
    stats = mean + std * rng.uniform(-3.0, 3.0, (n_stats, *mean.shape))
    lo = np.where(np.isfinite(low), low, mean - 4 * std)
    hi = np.where(np.isfinite(high), high, mean + 4 * std)
    bounds = rng.uniform(lo, hi, (n_rest - n_stats, *mean.shape))
    obs = np.concatenate([stats, bounds, edges]).astype(np.float32)
    source = np.array(["stats"] * n_stats + ["bounds"] * (n_rest - n_stats) + ["edge"] * len(edges))
    return obs[:n], source[:n]


def seeded_feeds(bundle: Bundle, n: int, seed: int) -> Feeds:
    """Synthetic feeds from the bundle alone (the export self-check)."""
    rng = np.random.default_rng([seed, FEED_STREAM])
    mean, std = observation_scale(bundle)
    obs, source = sample_observations(bundle, n, rng, mean, std)
    return Feeds(obs, source, draw_noise(bundle, rng, len(obs)))


def comparison_feeds(
    bundle: Bundle, n: int, seed: int, observed: np.ndarray | None, observed_label: str, stream: int
) -> Feeds:
    """The verify feeds: up to a third ``observed`` rows (visited or recorded), the rest sampled, NaN rows last.

    Recorded observations are the team's real inputs, so with no env they fill up to all of ``n``.
    """
    rng = np.random.default_rng([seed, stream])
    observed = np.zeros((0, *bundle.contract(bundle.graphs[0]).obs_shape), np.float32) if observed is None else observed
    cap = n if observed_label == "recorded" else n // 3
    n_obs = min(len(observed), cap)
    pick = observed[np.sort(rng.choice(len(observed), n_obs, replace=False))] if n_obs else observed[:0]
    mean, std = observation_scale(bundle, observed)
    sampled, source = sample_observations(bundle, max(n - n_obs, 0), rng, mean, std)
    obs = np.concatenate([pick.astype(np.float32), sampled, nan_observations(bundle, mean)])
    labels = np.concatenate([np.array([observed_label] * n_obs), source, np.array(["nan"] * 2)])
    return Feeds(obs, labels, draw_noise(bundle, rng, len(obs)))
