"""Seeded observation and noise feeds for comparing runtimes; they know nothing about the runtimes.

Observations come from where a deployment sees them: states visited in seeded episodes or recorded by the
team (added by the caller), samples around the observation statistics, samples within the observation
bounds, and edge cases. The statistics are the bundle's frozen normalisation when it records one, else those of
the visited or recorded observations. Each observation input is sampled as its dtype says: a float input also
gets edge rows far beyond any normalisation clip (±50σ, ±1e4) and NaN rows; an integer input (uint8 frames) gets
integers in its range, all-minimum and all-maximum frames among the edge rows, and never NaN. A ``Dict``
observation is sampled key by key (rows of ``contract.obs_dtype``). A policy that carries state is fed states
recorded along the reference's episodes (or its ``init``), never random ones.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from inference.bundle import Bundle
from inference.bundle.contract import OBS, PolicyContract

FEED_STREAM = 11


@dataclass
class Feeds:
    """Observations with a label per row (where it came from), per graph the noise its stochastic action uses for
    that row (graphs without a stochastic action have none), and the carried states fed with each row."""

    obs: np.ndarray  # rows of the contract's ``obs_dtype`` (structured for a Dict observation)
    source: np.ndarray  # str labels: "episode" | "recorded" | "stats" | "bounds" | "edge" | "nan"
    noise: dict[str, np.ndarray]
    state: np.ndarray | None = None  # rows of ``contract.state_dtype``; None when the policy carries no state

    def __len__(self) -> int:
        return len(self.obs)

    @property
    def finite(self) -> np.ndarray:
        """Rows without NaN (NaN rows are checked separately: argmax of NaN is undefined)."""
        return finite_rows(self.obs)

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
        """The arrays ``graph`` takes, in order: its observation input(s), its noise if it samples inside, and
        the carried states."""
        contract = bundle.contract(graph)
        noise = [self.noise[graph]] if contract.takes_noise else []
        return [*contract.obs_inputs(self.obs), *noise, *contract.state_inputs(self.state)]


def finite_rows(rows: np.ndarray) -> np.ndarray:
    """Per row: no NaN in any float field (integer fields cannot hold NaN)."""
    if rows.dtype.names:
        ok = np.ones(len(rows), bool)
        for name in rows.dtype.names:
            ok &= finite_rows(rows[name])
        return ok
    if rows.dtype.kind != "f":
        return np.ones(len(rows), bool)
    return ~np.isnan(rows.reshape(len(rows), -1)).any(1)


def stochastic_graphs(bundle: Bundle) -> list[str]:
    """Graphs with a stochastic action: they take noise, or their outputs are sampled on the host."""
    return [g for g in bundle.graphs if bundle.contract(g).stochastic_noise_kind is not None]


def draw_noise(bundle: Bundle, rng: np.random.Generator, n: int) -> dict[str, np.ndarray]:
    return {g: bundle.sample_noise(g, rng, n) for g in stochastic_graphs(bundle)}


@dataclass
class Scale:
    """Where one observation input's samples come from: centre and spread, and its finite range."""

    mean: np.ndarray
    std: np.ndarray
    low: np.ndarray
    high: np.ndarray
    integer: bool = False
    every: bool = False  # a Discrete(N) observation: the samples within the bounds visit every index in turn


def observation_scales(bundle: Bundle, observed: np.ndarray | None = None) -> dict[str, Scale]:
    """Per observation input: the bundle's normalisation and observation bounds (an array observation of our
    trainer), else the observed states' statistics, else 0 and 1; integers within their dtype's range."""
    contract = bundle.contract(bundle.graphs[0])
    norm = bundle.manifest.get("normalization") or {}
    env = bundle.manifest.get("env") or {}
    scales = {}
    for f in contract.observations:
        seen = None if observed is None or not len(observed) else (observed[f.name] if contract.obs_dict else observed)
        dtype = np.dtype(f.dtype)
        if dtype.kind in "iu":
            info = np.iinfo(dtype)
            lo, hi = max(info.min, -(2**15)), min(info.max, 2**15)  # uint8: 0..255
            if f.discrete is not None:
                lo, hi = 0, f.discrete - 1  # a Discrete(N) observation: every index is a valid input, seen or not
            elif seen is not None:
                lo, hi = int(seen.min()), int(seen.max())
            low, high = np.full(f.shape, lo, np.float64), np.full(f.shape, hi, np.float64)
            scales[f.name] = Scale((low + high) / 2, (high - low) / 6, low, high, integer=True,
                                   every=f.discrete is not None)  # fmt: skip
            continue
        mean, std = np.zeros(f.shape), np.ones(f.shape)
        if not contract.obs_dict and norm.get("mean") is not None:
            mean, std = np.asarray(norm["mean"], np.float64), np.sqrt(np.asarray(norm["var"], np.float64))
        elif seen is not None:
            rows = seen.reshape(len(seen), -1).astype(np.float64)
            rows = rows[np.isfinite(rows).all(1)]
            if len(rows):
                mean, std = rows.mean(0).reshape(f.shape), np.maximum(rows.std(0), 1e-3).reshape(f.shape)
        bounds = env if not contract.obs_dict else {}
        low = np.asarray(bounds.get("obs_low", np.full(mean.shape, -np.inf)), np.float64).reshape(mean.shape)
        high = np.asarray(bounds.get("obs_high", np.full(mean.shape, np.inf)), np.float64).reshape(mean.shape)
        scales[f.name] = Scale(mean, std, low, high)
    return scales


def _edges(scale: Scale) -> list[np.ndarray]:
    """A float input: zeros, the centre, far outside the spread, huge values, the finite bounds. An integer input:
    its minimum, maximum and middle everywhere (all-black and all-white frames)."""
    mean, std = scale.mean, scale.std
    if scale.integer:
        return [scale.low, scale.high, np.round(mean)]
    huge = np.full_like(mean, 1e4)
    rows = [np.zeros_like(mean), mean, mean + 50 * std, mean - 50 * std, huge, -huge]
    return rows + [np.where(np.isfinite(bound), bound, mean) for bound in (scale.low, scale.high)]


def _sample(scale: Scale, rng: np.random.Generator, n_stats: int, n_bounds: int) -> tuple[np.ndarray, np.ndarray]:
    """``n_stats`` rows around the statistics (±3σ) and ``n_bounds`` within the bounds."""
    mean, std = scale.mean, scale.std
    stats = mean + std * rng.uniform(-3.0, 3.0, (n_stats, *mean.shape))
    lo = np.where(np.isfinite(scale.low), scale.low, mean - 4 * std)
    hi = np.where(np.isfinite(scale.high), scale.high, mean + 4 * std)
    bounds = rng.uniform(lo, hi, (n_bounds, *mean.shape))
    if scale.every:  # each index once (in a seeded order) before any repeats: a changed table row is always fed
        span = np.arange(int(scale.low.min()), int(scale.high.max()) + 1)
        order = np.concatenate([rng.permutation(span) for _ in range(-(-n_bounds // len(span)))])[:n_bounds]
        bounds = np.broadcast_to(order.reshape(-1, *([1] * mean.ndim)), (n_bounds, *mean.shape)).astype(np.float64)
    if scale.integer:
        stats, bounds = (np.clip(np.round(x), scale.low, scale.high) for x in (stats, bounds))
    return stats, bounds


def sample_observations(
    bundle: Bundle, n: int, rng: np.random.Generator, scales: dict[str, Scale]
) -> tuple[np.ndarray, np.ndarray]:
    """``n`` observation rows: half around the statistics (±3σ), the rest within the bounds, edge cases last."""
    contract = bundle.contract(bundle.graphs[0])
    edges = {name: _edges(scale) for name, scale in scales.items()}
    n_edges = min(max(len(rows) for rows in edges.values()), max(0, n))
    n_rest = max(0, n - n_edges)
    n_stats = n_rest // 2
    columns = {}
    for f in contract.observations:
        stats, bounds = _sample(scales[f.name], rng, n_stats, n_rest - n_stats)
        edge = [edges[f.name][k % len(edges[f.name])] for k in range(n_edges)]
        columns[f.name] = np.concatenate([stats, bounds, np.asarray(edge).reshape(n_edges, *f.shape)])
    # the edge rows of Discrete(N) observations (indices 0, N-1 and the middle) are ordinary inputs, not extremes
    edge = "bounds" if all(scale.every for scale in scales.values()) else "edge"
    source = np.array(["stats"] * n_stats + ["bounds"] * (n_rest - n_stats) + [edge] * n_edges)
    return as_rows(contract, columns)[:n], source[:n]


def nan_observations(bundle: Bundle, scales: dict[str, Scale]) -> np.ndarray:
    """One row with every float input NaN and one with a single NaN: invalid input, flagged, not judged. None for a
    policy whose observations are all integers (they cannot hold NaN)."""
    contract = bundle.contract(bundle.graphs[0])
    floats = [f.name for f in contract.observations if np.dtype(f.dtype).kind == "f"]
    columns = {name: np.stack([scale.mean, scale.mean]) for name, scale in scales.items()}
    if not floats:
        return as_rows(contract, columns)[:0]
    for name in floats:
        columns[name][0] = np.nan
    columns[floats[0]].reshape(2, -1)[1, 0] = np.nan
    return as_rows(contract, columns)


def as_rows(contract: PolicyContract, columns: dict[str, np.ndarray]) -> np.ndarray:
    """Observation rows of ``contract.obs_dtype`` from one array per input."""
    if not contract.obs_dict:
        return np.asarray(columns[OBS], contract.obs_dtype)
    rows = contract.empty_observations(len(next(iter(columns.values()))))
    for name, column in columns.items():
        rows[name] = column
    return rows


def feed_states(bundle: Bundle, rng: np.random.Generator, n: int, observed: np.ndarray | None) -> np.ndarray | None:
    """States for ``n`` rows: drawn from the states recorded along the reference's episodes, else the ``init``."""
    contract = bundle.contract(bundle.graphs[0])
    if not contract.states:
        return None
    if observed is None or not len(observed):
        return contract.initial_state(n)
    return observed[rng.integers(0, len(observed), n)]


def seeded_feeds(bundle: Bundle, n: int, seed: int) -> Feeds:
    """Synthetic feeds from the bundle alone (the export self-check)."""
    rng = np.random.default_rng([seed, FEED_STREAM])
    obs, source = sample_observations(bundle, n, rng, observation_scales(bundle))
    return Feeds(obs, source, draw_noise(bundle, rng, len(obs)), feed_states(bundle, rng, len(obs), None))


def comparison_feeds(
    bundle: Bundle, n: int, seed: int, observed: np.ndarray | None, observed_label: str, stream: int,
    observed_state: np.ndarray | None = None,
) -> Feeds:  # fmt: skip
    """The verify feeds: up to a third ``observed`` rows (visited or recorded, with the states they were visited
    with), the rest sampled, NaN rows last.

    Recorded observations are the team's real inputs, so with no env they fill up to all of ``n``.
    """
    rng = np.random.default_rng([seed, stream])
    contract = bundle.contract(bundle.graphs[0])
    observed = contract.empty_observations(0) if observed is None else observed
    cap = n if observed_label == "recorded" else n // 3
    n_obs = min(len(observed), cap)
    picked = np.sort(rng.choice(len(observed), n_obs, replace=False)) if n_obs else np.zeros(0, int)
    scales = observation_scales(bundle, observed)
    sampled, source = sample_observations(bundle, max(n - n_obs, 0), rng, scales)
    nan = nan_observations(bundle, scales)
    obs = np.concatenate([observed[picked].astype(contract.obs_dtype), sampled, nan])
    labels = np.concatenate([np.array([observed_label] * n_obs), source, np.array(["nan"] * len(nan))])
    noise = draw_noise(bundle, rng, len(obs))
    state = None
    if contract.states:
        if observed_state is None or not n_obs:  # observations recorded without their states: every row at ``init``
            state = feed_states(bundle, rng, len(obs), observed_state)
        else:
            state = np.concatenate([observed_state[picked], feed_states(bundle, rng, len(obs) - n_obs, observed_state)])
    return Feeds(obs, labels, noise, state)
