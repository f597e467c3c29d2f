"""The reference every runtime is compared with: the training path's outputs on the feeds and its episodes.

Built from the reference runtimes (``ms-cell``: the policy Cell in PyNative) and an observation source, or
loaded from a golden file recorded on another machine (``compare.golden``). Nothing here compares anything.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from inference.bundle import Bundle
from inference.bundle.contract import PolicyContract, top2_margin
from inference.compare import episodes as E
from inference.compare.acting import ModePolicy, available_modes, check_batch, mode_policy
from inference.compare.batches import infer_feeds, infer_rows, input_row_bytes
from inference.compare.feeds import Feeds, comparison_feeds, seeded_feeds
from inference.compare.inputs import Inputs
from inference.compare.judge.stats import Tolerance, compare_arrays, tolerance_for
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
    # graph -> outputs whose rows depend on the other rows of their batch in the Cell itself (None: not measured)
    batch_coupled: dict[str, list[str]] | None = None


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
    top2: dict[str, np.ndarray] = {}
    skipped = None
    if inputs.env is None:
        skipped = "recorded observations only: there is no env to step, so episode replay was skipped"
    else:
        for mode, graph in available_modes(bundle).items():
            noise = None
            if mode == "stochastic":
                noise = noises[mode] = E.episode_noise(bundle, graph, episodes, inputs.env.max_steps, seed)
            policy = mode_policy(bundle, episode_runtimes or runtimes, mode)
            margins = _margin_recorder(bundle.contract(graph), policy)
            traces[mode] = E.run_episodes(inputs.env, policy, episodes, seed, noise)
            if margins:
                top2[mode] = np.stack(margins)
    observed_state, alive = None, None
    if inputs.recorded is not None:
        observed, label, observed_state = inputs.recorded, "recorded", inputs.recorded_state
    elif traces:  # the visited rows, as a view of the trace (a copy of every frame visited would double it)
        trace = next(iter(traces.values()))
        steps, k = trace.alive.shape
        observed, label, alive = trace.obs.reshape(steps * k, *trace.obs.shape[2:]), "episode", trace.alive.ravel()
        observed_state = None if trace.states is None else trace.states.reshape(steps * k)
    else:
        observed, label = None, "episode"
    rows = None if alive is None else np.flatnonzero(alive)
    feeds = comparison_feeds(bundle, observations, seed, observed, label, OBS_STREAM, observed_state, rows)
    outputs = {g: infer_feeds(runtimes[g], bundle, g, feeds) for g in bundle.graphs}
    evidence = None
    if without_norm:
        evidence = {g: infer_feeds(rt, bundle, g, feeds)[bundle.contract(g).action.distribution_output]
                    for g, rt in without_norm.items()}  # fmt: skip
    reference = Reference(feeds, outputs, traces, noises, seed, episodes, evidence, skipped_episodes=skipped, top2=top2)
    reference.input_scaled = _input_scaled(bundle, runtimes, feeds)
    reference.batch_coupled = {g: coupled for g in bundle.graphs
                               if (coupled := _cell_coupling(bundle, g, runtimes[g], feeds))}  # fmt: skip
    return reference


def _cell_coupling(bundle: Bundle, graph: str, runtime: Runtime, feeds: Feeds) -> list[str]:
    """The outputs whose rows depend on the other rows of their batch in the reference Cell itself (judged with
    MindSpore's own graph tolerance): the evidence that tells a network that couples rows from a graph exported in
    training mode."""
    outputs = {o["name"] for o in bundle.graph(graph)["outputs"]}
    tol = tolerance_for("fp32", "ms-graph")
    return batch_coupling(bundle, graph, runtime, feeds, dict.fromkeys(outputs, tol))[0]


def _input_scaled(bundle: Bundle, runtimes: Mapping[str, Runtime], feeds: Feeds) -> dict[float, np.ndarray]:
    """The deciding graph's decision output on the finite feeds with the observations scaled by each of
    ``INPUT_SCALES``: the evidence that names a graph missing (or repeating) the Cell's input scaling."""
    graph = bundle.mode_graph("deterministic") or bundle.graphs[0]
    contract = bundle.contract(graph)
    decision = contract.action.distribution_output
    if contract.obs_dict or np.dtype(contract.observations[0].dtype).kind != "f":
        return {}
    rows = np.flatnonzero(feeds.finite)

    def scaled_inputs(k: float, at: np.ndarray) -> list[np.ndarray]:
        x = feeds.graph_inputs(bundle, graph, rows[at])
        with np.errstate(over="ignore"):
            return [(x[0] * np.float32(k)).astype(x[0].dtype), *x[1:]]

    width = input_row_bytes(bundle, graph)
    return {k: infer_rows(runtimes[graph], len(rows), width, lambda at, k=k: scaled_inputs(k, at))[decision]
            for k in INPUT_SCALES}  # fmt: skip


def _margin_recorder(contract: PolicyContract, policy: ModePolicy) -> list[np.ndarray]:
    """Hooks ``policy`` to record, at every step it acts, the top-2 decision-score margin and magnitudes of each row
    (discrete actions only; ``[K, 4]``, ``[K, heads, 4]`` for several heads): the scores behind the trace's own
    actions, at the batch they were computed in, which judge a differing action on teacher-forced replay."""
    margins: list[np.ndarray] = []
    if contract.action.kind not in ("argmax", "categorical"):
        return margins
    heads = contract.action.heads

    def record(outputs: Mapping[str, np.ndarray], noise: np.ndarray | None) -> None:
        per_head = [top2_margin(contract.decision_scores(outputs, noise, h), outputs[head])
                    for h, head in enumerate(heads)]  # fmt: skip
        margins.append(per_head[0] if len(heads) == 1 else np.stack(per_head, -2))

    policy.on_outputs = record
    return margins


def changed_on_rerun(bundle: Bundle, graph: str, runtime: Runtime, feeds: Feeds) -> list[str]:
    """Outputs that differ when the same rows run twice (same batch, same bits expected): randomness inside the
    graph, which no other runtime can reproduce."""
    rows = feeds.graph_inputs(bundle, graph, slice(0, 64))
    first, again = _infer(bundle, graph, runtime, rows), _infer(bundle, graph, runtime, rows)
    return [k for k, v in again.items() if not np.array_equal(v, first[k], equal_nan=True)]


def batch_coupling(
    bundle: Bundle, graph: str, runtime: Runtime, feeds: Feeds, tolerance: Mapping[str, Tolerance]
) -> tuple[list[str], float]:
    """The outputs whose rows change beyond tolerance when the other rows of their batch are replaced by others
    (same batch size: kernels block by shape, not content, so only a graph that couples rows moves them), and the
    largest move of a row between a batch of 32 and of 64 with the same rows (the batch size's numerical effect)."""
    rows = np.flatnonzero(feeds.finite & feeds.ordinary)
    if len(rows) < 64:
        rows = np.arange(len(feeds))
    half = min(32, len(rows) // 2)
    if half < 1:
        return [], 0.0
    head, one = rows[:half], rows[half : 2 * half]
    other = rows[2 * half : 3 * half] if len(rows) >= 3 * half else head
    run = lambda idx: _infer(bundle, graph, runtime, feeds.graph_inputs(bundle, graph, idx))  # noqa: E731
    first, second, alone = run(np.concatenate([head, one])), run(np.concatenate([head, other])), run(head)
    coupled, moved = [], 0.0
    for k, a in first.items():
        b, c = second[k], alone[k]
        if a.ndim and a.shape[:1] == (2 * half,) and b.shape == a.shape:
            if not compare_arrays(k, a[:half], b[:half], tolerance[k]).passed:
                coupled.append(k)
            if c.shape == a[:half].shape and a.dtype.kind == "f":
                with np.errstate(invalid="ignore"):
                    moved = max(moved, float(np.nan_to_num(np.abs(a[:half].astype(np.float64) - c)).max(initial=0)))
    return coupled, moved


def _infer(bundle: Bundle, graph: str, runtime: Runtime, inputs: list[np.ndarray]) -> dict[str, np.ndarray]:
    """One call, its outputs checked to follow the batch (``acting.WrongBatch`` with the shapes otherwise)."""
    outputs = runtime.infer(*inputs)
    declared = {o["name"]: tuple(o["shape"]) for o in bundle.graph(graph)["outputs"]}
    check_batch(getattr(runtime, "name", "the runtime"), declared, outputs, len(inputs[0]))
    return outputs
