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
from functools import cached_property

import numpy as np

from inference.bundle import Bundle
from inference.bundle.contract import OBS, PolicyContract

FEED_STREAM = 11
# Rows are sampled (and observed rows summarised) a chunk of about this many elements at a time, into arrays of the
# observation's own dtype: 10k Atari frames stay 282 MB of uint8, never 2.3 GB of float64 per step of the sampling.
CHUNK_ELEMENTS = 1 << 21


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

    @cached_property
    def finite(self) -> np.ndarray:
        """Rows without NaN (NaN rows are checked separately: argmax of NaN is undefined). Computed once."""
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

    def graph_inputs(self, bundle: Bundle, graph: str, rows: slice | np.ndarray | None = None) -> list[np.ndarray]:
        """The arrays ``graph`` takes, in order: its observation input(s), its noise if it samples inside, and
        the carried states; of ``rows`` only, when given (a Dict observation's inputs are copies: take few rows)."""
        contract = bundle.contract(graph)
        pick = (lambda a: a) if rows is None else (lambda a: a[rows])  # noqa: E731
        noise = [pick(self.noise[graph])] if contract.takes_noise else []
        state = None if self.state is None else pick(self.state)
        return [*contract.obs_inputs(pick(self.obs)), *noise, *contract.state_inputs(state)]


def finite_rows(rows: np.ndarray) -> np.ndarray:
    """Per row: no NaN in any float field (integer fields cannot hold NaN)."""
    if rows.dtype.names:
        ok = np.ones(len(rows), bool)
        for name in rows.dtype.names:
            ok &= finite_rows(rows[name])
        return ok
    if rows.dtype.kind != "f":
        return np.ones(len(rows), bool)
    ok = np.ones(len(rows), bool)
    for at in _chunks(rows):
        ok[at] = ~np.isnan(rows[at].reshape(at.stop - at.start, -1)).any(1)
    return ok


def _chunks(rows: np.ndarray, start: int = 0, stop: int | None = None) -> list[slice]:
    """Row slices of ``rows[start:stop]`` of about ``CHUNK_ELEMENTS`` elements each."""
    return row_chunks(len(rows) if stop is None else stop, row_width(rows), start)


def row_width(rows: np.ndarray) -> int:
    """Elements in one row (a structured row counts its fields' elements)."""
    if rows.dtype.names:
        return max(1, sum(int(np.prod(rows.dtype[name].shape, dtype=np.int64)) for name in rows.dtype.names))
    return max(1, int(np.prod(rows.shape[1:], dtype=np.int64)))


def row_chunks(stop: int, width: int, start: int = 0, budget: int = CHUNK_ELEMENTS) -> list[slice]:
    """Slices of ``range(start, stop)`` holding at most ``budget`` units (elements, or bytes) of ``width`` per row
    each (one row at least)."""
    step = max(1, budget // max(1, width))
    return [slice(a, min(a + step, stop)) for a in range(start, stop, step)]


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


def observation_scales(
    bundle: Bundle, observed: np.ndarray | None = None, rows: np.ndarray | None = None
) -> dict[str, Scale]:
    """Per observation input: the bundle's normalisation and observation bounds (an array observation of our
    trainer), else the statistics of the observed states (``observed[rows]``; all of them without ``rows``), else
    0 and 1; integers within their dtype's range. Statistics are gathered a chunk at a time."""
    contract = bundle.contract(bundle.graphs[0])
    norm = bundle.manifest.get("normalization") or {}
    env = bundle.manifest.get("env") or {}
    rows = None if observed is None else (np.arange(len(observed)) if rows is None else np.asarray(rows))
    scales = {}
    for f in contract.observations:
        seen = None if rows is None or not len(rows) else (observed[f.name] if contract.obs_dict else observed)
        dtype = np.dtype(f.dtype)
        if dtype.kind in "iu":
            info = np.iinfo(dtype)
            lo, hi = max(info.min, -(2**15)), min(info.max, 2**15)  # uint8: 0..255
            if f.discrete is not None:
                lo, hi = 0, f.discrete - 1  # a Discrete(N) observation: every index is a valid input, seen or not
            elif seen is not None:
                chunks = row_chunks(len(rows), int(np.prod(seen.shape[1:], dtype=np.int64)))
                bounds = [(int(x.min()), int(x.max())) for at in chunks if (x := seen[rows[at]]).size]
                lo, hi = min(b[0] for b in bounds), max(b[1] for b in bounds)
            low, high = np.full(f.shape, lo, np.float64), np.full(f.shape, hi, np.float64)
            scales[f.name] = Scale((low + high) / 2, (high - low) / 6, low, high, integer=True,
                                   every=f.discrete is not None)  # fmt: skip
            continue
        mean, std = np.zeros(f.shape), np.ones(f.shape)
        if not contract.obs_dict and norm.get("mean") is not None:
            mean, std = np.asarray(norm["mean"], np.float64), np.sqrt(np.asarray(norm["var"], np.float64))
        elif seen is not None:
            moments = _moments(seen, rows)
            if moments is not None:
                mean, std = moments[0].reshape(f.shape), np.maximum(moments[1], 1e-3).reshape(f.shape)
        bounds = env if not contract.obs_dict else {}
        low = np.asarray(bounds.get("obs_low", np.full(mean.shape, -np.inf)), np.float64).reshape(mean.shape)
        high = np.asarray(bounds.get("obs_high", np.full(mean.shape, np.inf)), np.float64).reshape(mean.shape)
        scales[f.name] = Scale(mean, std, low, high)
    return scales


def _moments(seen: np.ndarray, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
    """Mean and standard deviation per element over the finite rows ``seen[rows]``, a chunk at a time (two passes:
    the deviations from the mean, as ``np.std`` takes them)."""
    width = int(np.prod(seen.shape[1:], dtype=np.int64))
    chunks = row_chunks(len(rows), width)
    total, count = np.zeros(width), 0
    for at in chunks:
        x = seen[rows[at]].reshape(-1, width).astype(np.float64)
        x = x[np.isfinite(x).all(1)]
        total, count = total + x.sum(0), count + len(x)
    if not count:
        return None
    mean, square = total / count, np.zeros(width)
    for at in chunks:
        x = seen[rows[at]].reshape(-1, width).astype(np.float64)
        x = x[np.isfinite(x).all(1)]
        square += ((x - mean) ** 2).sum(0)
    return mean, np.sqrt(square / count)


def _edges(scale: Scale) -> list[np.ndarray]:
    """A float input: zeros, the centre, far outside the spread, huge values, the finite bounds. An integer input:
    its minimum, maximum and middle everywhere (all-black and all-white frames)."""
    mean, std = scale.mean, scale.std
    if scale.integer:
        return [scale.low, scale.high, np.round(mean)]
    huge = np.full_like(mean, 1e4)
    rows = [np.zeros_like(mean), mean, mean + 50 * std, mean - 50 * std, huge, -huge]
    return rows + [np.where(np.isfinite(bound), bound, mean) for bound in (scale.low, scale.high)]


def _sample_into(scale: Scale, rng: np.random.Generator, stats: np.ndarray, bounds: np.ndarray) -> None:
    """Fill ``stats`` with rows around the statistics (±3σ) and ``bounds`` with rows within the bounds, a chunk at a
    time, each cast to its array's dtype on the way in (the generator's stream is the one whole draws would take)."""
    mean, std = scale.mean, scale.std
    lo = np.where(np.isfinite(scale.low), scale.low, mean - 4 * std)
    hi = np.where(np.isfinite(scale.high), scale.high, mean + 4 * std)
    for out, draw in ((stats, lambda k: mean + std * rng.uniform(-3.0, 3.0, (k, *mean.shape))),
                      (bounds, lambda k: rng.uniform(lo, hi, (k, *mean.shape)))):  # fmt: skip
        for at in _chunks(out):
            x = draw(at.stop - at.start)
            out[at] = np.clip(np.round(x), scale.low, scale.high) if scale.integer else x
    if scale.every and len(bounds):  # each index once (in a seeded order) before any repeats: a changed row is fed
        span = np.arange(int(scale.low.min()), int(scale.high.max()) + 1)
        order = np.concatenate([rng.permutation(span) for _ in range(-(-len(bounds) // len(span)))])[: len(bounds)]
        bounds[...] = order.reshape(-1, *([1] * mean.ndim))


def sample_observations(
    bundle: Bundle, n: int, rng: np.random.Generator, scales: dict[str, Scale], out: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """``n`` observation rows: half around the statistics (±3σ), the rest within the bounds, edge cases last; written
    into ``out`` (``n`` rows of ``contract.obs_dtype``) when given."""
    contract = bundle.contract(bundle.graphs[0])
    edges = {name: _edges(scale) for name, scale in scales.items()}
    n_edges = min(max(len(rows) for rows in edges.values()), max(0, n))
    n_rest = max(0, n - n_edges)
    n_stats = n_rest // 2
    rows = contract.empty_observations(max(0, n)) if out is None else out
    for f in contract.observations:
        column = rows[f.name] if contract.obs_dict else rows
        _sample_into(scales[f.name], rng, column[:n_stats], column[n_stats:n_rest])
        for k in range(n_edges):
            column[n_rest + k] = np.asarray(edges[f.name][k % len(edges[f.name])]).reshape(f.shape)
    # the edge rows of Discrete(N) observations (indices 0, N-1 and the middle) are ordinary inputs, not extremes
    edge = "bounds" if all(scale.every for scale in scales.values()) else "edge"
    source = np.array(["stats"] * n_stats + ["bounds"] * (n_rest - n_stats) + [edge] * n_edges)
    return rows, source


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
    observed_state: np.ndarray | None = None, observed_rows: np.ndarray | None = None,
) -> Feeds:  # fmt: skip
    """The verify feeds: up to a third ``observed`` rows (visited or recorded, with the states they were visited
    with; ``observed_rows`` say which rows of ``observed`` count, all without), the rest sampled, NaN rows last.

    Recorded observations are the team's real inputs, so with no env they fill up to all of ``n``. The rows are
    written into one array of the observation's dtype: nothing else of their size is held.
    """
    rng = np.random.default_rng([seed, stream])
    contract = bundle.contract(bundle.graphs[0])
    observed = contract.empty_observations(0) if observed is None else observed
    among = np.arange(len(observed)) if observed_rows is None else np.asarray(observed_rows)
    cap = n if observed_label == "recorded" else n // 3
    n_obs = min(len(among), cap)
    picked = among[np.sort(rng.choice(len(among), n_obs, replace=False))] if n_obs else np.zeros(0, int)
    scales = observation_scales(bundle, observed, among)
    n_sampled = max(n - n_obs, 0)
    nan = nan_observations(bundle, scales)
    obs = contract.empty_observations(n_obs + n_sampled + len(nan))
    for at in _chunks(obs, 0, n_obs):
        obs[at] = observed[picked[at]].astype(contract.obs_dtype)
    _, source = sample_observations(bundle, n_sampled, rng, scales, obs[n_obs : n_obs + n_sampled])
    obs[n_obs + n_sampled :] = nan
    labels = np.concatenate([np.array([observed_label] * n_obs), source, np.array(["nan"] * len(nan))])
    noise = draw_noise(bundle, rng, len(obs))
    state = None
    if contract.states:
        if observed_state is None or not n_obs:  # observations recorded without their states: every row at ``init``
            state = feed_states(bundle, rng, len(obs), _rows(observed_state, among))
        else:
            rest = feed_states(bundle, rng, len(obs) - n_obs, observed_state[among])
            state = np.concatenate([observed_state[picked], rest])
    return Feeds(obs, labels, noise, state)


def _rows(array: np.ndarray | None, rows: np.ndarray) -> np.ndarray | None:
    return None if array is None else array[rows]
