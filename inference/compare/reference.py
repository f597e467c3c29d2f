"""The reference every runtime is compared with: the training path's outputs on the feeds and its episodes.

Built from the reference runtimes (``ms-cell``: the policy Cell in PyNative) and an observation source, or
loaded from a golden file recorded on another machine (``compare.golden``). Nothing here compares anything.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from inference.bundle import Bundle
from inference.bundle.contract import top2_margin
from inference.compare import episodes as E
from inference.compare.acting import available_modes, mode_policy
from inference.compare.feeds import Feeds, comparison_feeds, seeded_feeds
from inference.compare.inputs import Inputs
from inference.runtimes.base import Runtime
from inference.runtimes.registry import REFERENCE

OBS_STREAM = 17
# Input-scaling hypotheses the diagnosis tests: a graph that lacks the Cell's ``/255`` acts like the Cell on
# observations x255; a graph that scales twice acts like it on observations /255.
INPUT_SCALES = (255.0, 1.0 / 255.0)


@dataclass
class Reference:
    """Reference outputs per graph on ``feeds``, and per mode the episode trace (and the noise it used)."""

    feeds: Feeds
    outputs: dict[str, dict[str, np.ndarray]]
    traces: dict[str, E.EpisodeTrace]
    episode_noise: dict[str, np.ndarray]  # mode -> [T, K, dim]; only modes that sample
    seed: int
    episodes: int
    without_norm: dict[str, np.ndarray] | None = None  # graph -> outputs of the policy without its normalisation
    origin: str = REFERENCE
    skipped_episodes: str | None = None  # why no episodes were replayed
    top2: dict[str, np.ndarray] = field(default_factory=dict)  # mode -> [T, K, 4] ``contract.top2_margin`` per step
    episodes_by: str = REFERENCE  # the runner that played the reference episodes
    repeat_differs: dict[str, list[str]] = field(default_factory=dict)  # graph -> outputs that changed on a re-run
    input_scaled: dict[float, np.ndarray] = field(default_factory=dict)  # k -> decision output on obs x k
    origin_unchecked: str | None = None  # a golden file whose bundle cannot be checked: why (a warning in the report)


def build_reference(
    bundle: Bundle,
    runtimes: Mapping[str, Runtime],
    inputs: Inputs,
    observations: int,
    episodes: int,
    seed: int,
    without_norm: Mapping[str, Runtime] | None = None,
    episode_runtimes: Mapping[str, Runtime] | None = None,
) -> Reference:
    """Play seeded episodes per mode, draw the feeds, and run every graph of the reference on them.

    First, the same rows run twice through every graph: if the outputs change, the graph samples inside and
    nothing else is worth comparing (the Reference then carries only that finding).

    ``episode_runtimes`` play the episodes instead of ``runtimes``: the same Cell compiled, which the caller has
    found bitwise equal to it. Thousands of sequential steps then cost a compiled call each, not an op-by-op one.
    """
    probe = seeded_feeds(bundle, 64, seed)
    repeat = {g: names for g in bundle.graphs if (names := changed_on_rerun(bundle, g, runtimes[g], probe))}
    if repeat:
        why = "the reference is not reproducible (randomness inside the graph)"
        return Reference(probe, {}, {}, {}, seed, episodes, skipped_episodes=why, repeat_differs=repeat)
    traces: dict[str, E.EpisodeTrace] = {}
    noises: dict[str, np.ndarray] = {}
    skipped = None
    if inputs.env is None:
        skipped = "recorded observations only: there is no env to step, so episode replay was skipped"
    else:
        for mode, graph in available_modes(bundle).items():
            noise = None
            if mode == "stochastic":
                noise = noises[mode] = E.episode_noise(bundle, graph, episodes, inputs.env.max_steps, seed)
            policy = mode_policy(bundle, episode_runtimes or runtimes, mode)
            traces[mode] = E.run_episodes(inputs.env, policy, episodes, seed, noise)
    top2 = {mode: _trace_margins(bundle, runtimes, mode, trace, noises.get(mode)) for mode, trace in traces.items()}
    top2 = {mode: v for mode, v in top2.items() if v is not None}
    observed_state = None
    if inputs.recorded is not None:
        observed, label, observed_state = inputs.recorded, "recorded", inputs.recorded_state
    elif traces:
        trace = next(iter(traces.values()))
        observed, label = trace.obs[trace.alive], "episode"
        observed_state = None if trace.states is None else trace.states[trace.alive]
    else:
        observed, label = None, "episode"
    feeds = comparison_feeds(bundle, observations, seed, observed, label, OBS_STREAM, observed_state)
    outputs = {g: runtimes[g].infer(*feeds.graph_inputs(bundle, g)) for g in bundle.graphs}
    evidence = None
    if without_norm:
        evidence = {g: rt.infer(*feeds.graph_inputs(bundle, g))[bundle.contract(g).action.distribution_output]
                    for g, rt in without_norm.items()}  # fmt: skip
    reference = Reference(feeds, outputs, traces, noises, seed, episodes, evidence, skipped_episodes=skipped, top2=top2)
    reference.input_scaled = _input_scaled(bundle, runtimes, feeds)
    return reference


def _input_scaled(bundle: Bundle, runtimes: Mapping[str, Runtime], feeds: Feeds) -> dict[float, np.ndarray]:
    """The deciding graph's decision output on the finite feeds with the observations scaled by each of
    ``INPUT_SCALES``: the evidence that names a graph missing (or repeating) the Cell's input scaling."""
    graph = bundle.mode_graph("deterministic") or bundle.graphs[0]
    contract = bundle.contract(graph)
    decision = contract.action.distribution_output
    inputs = feeds.graph_inputs(bundle, graph)
    if contract.obs_dict or inputs[0].dtype.kind != "f":
        return {}
    rows = feeds.finite
    scaled = {}
    with np.errstate(over="ignore"):
        for k in INPUT_SCALES:
            feed = [(inputs[0][rows] * np.float32(k)).astype(inputs[0].dtype), *(x[rows] for x in inputs[1:])]
            scaled[k] = runtimes[graph].infer(*feed)[decision]
    return scaled


def _trace_margins(
    bundle: Bundle, runtimes: Mapping[str, Runtime], mode: str, trace: E.EpisodeTrace, noise: np.ndarray | None
) -> np.ndarray | None:
    """The reference's top-2 decision-score margin and magnitudes at every step of a trace (discrete actions
    only): what judges a differing action on teacher-forced replay. ``[T, K, 4]``; ``[T, K, heads, 4]`` for
    several heads. A policy that carries state is fed the states it was fed along the trace."""
    graph = bundle.mode_graph(mode)
    contract = bundle.contract(graph)  # type: ignore[arg-type]
    if contract.action.kind not in ("argmax", "categorical"):
        return None
    steps, k = trace.alive.shape
    obs = trace.obs.reshape(steps * k, *trace.obs.shape[2:])
    flat_noise = None if noise is None else noise[:steps].reshape(steps * k, -1)
    state = None if trace.states is None else trace.states.reshape(steps * k)
    # deterministic mode through a noise-input graph: fed zero noise, judged on its scores alone
    graph_noise = [contract.zero_noise(steps * k) if flat_noise is None else flat_noise] if contract.takes_noise else []
    inputs = [*contract.obs_inputs(obs), *graph_noise, *contract.state_inputs(state)]
    outputs = runtimes[graph].infer(*inputs)  # type: ignore[index]
    heads = contract.action.heads
    per_head = [top2_margin(contract.decision_scores(outputs, flat_noise, h), outputs[head])
                for h, head in enumerate(heads)]  # fmt: skip
    margins = per_head[0] if len(heads) == 1 else np.stack(per_head, -2)
    return margins.reshape(steps, k, *margins.shape[1:])


def changed_on_rerun(bundle: Bundle, graph: str, runtime: Runtime, feeds: Feeds) -> list[str]:
    """Outputs that differ when the same rows run twice (same batch, same bits expected): randomness inside the
    graph, which no other runtime can reproduce."""
    rows = [x[:64] for x in feeds.graph_inputs(bundle, graph)]
    first, again = runtime.infer(*rows), runtime.infer(*rows)
    return [k for k, v in again.items() if not np.array_equal(v, first[k], equal_nan=True)]
