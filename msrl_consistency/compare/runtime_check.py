"""Check one runtime (one ``Runtime`` per bundle graph) against the reference.

Per graph: every output on the same feeds (Polygraphy-style statistics), the contract's policy-level metrics,
NaN handling and repeatability. Per mode: teacher-forced episodes (the runtime acts on the reference's
observations) and free-running episodes (it drives its own env). A failure gets a diagnosis.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from inference.bundle import Bundle, BundleError
from msrl_consistency.compare import episodes as E
from msrl_consistency.compare.acting import is_discrete, mode_policy
from msrl_consistency.compare.checks import Check
from msrl_consistency.compare.diagnose import diagnose
from msrl_consistency.compare.feeds import Feeds
from msrl_consistency.compare.policy_level import policy_metrics
from msrl_consistency.compare.reference import Inputs, Reference, changed_on_rerun
from msrl_consistency.compare.stats import ArrayComparison, Tolerance, compare_arrays
from msrl_consistency.errors import MsrlError
from msrl_consistency.runtimes.base import Runtime


@dataclass
class RuntimeReport:
    """What one runtime's check produced: its info for the report, its checks, its per-step episode diffs."""

    info: dict[str, Any]
    checks: list[Check]
    episode_diffs: dict[str, np.ndarray]


def check_runtime(
    name: str,
    runtimes: Mapping[str, Runtime],
    bundle: Bundle,
    ref: Reference,
    inputs: Inputs,
    tolerance: Mapping[str, Tolerance],
    required: bool,
    checkpoint_matches: bool | None,
) -> RuntimeReport:
    """Open, compare, close. ``tolerance`` maps every output name to its tolerance for this runtime."""
    from msrl_consistency.runtimes.lite import IncompatibleModel

    checks: list[Check] = []
    try:
        for rt in runtimes.values():
            rt.open()
    except IncompatibleModel as exc:
        _close(runtimes)
        diagnosis = {"stage": "version", "detail": "the format is newer than this runtime reads"}
        checks.append(Check(name, "version_contract", "fail" if required else "warn", str(exc), diagnosis=diagnosis))
        return RuntimeReport({"status": "incompatible", "reason": str(exc)}, checks, {})
    except (MsrlError, BundleError) as exc:
        _close(runtimes)
        checks.append(Check(name, "load", "fail", str(exc)))
        return RuntimeReport({"status": "error", "reason": str(exc)}, checks, {})
    first = next(iter(runtimes.values()))
    info = {"status": "ran", "versions": first.versions(), "tolerance": {k: v.to_dict() for k, v in tolerance.items()}}
    diffs: dict[str, np.ndarray] = {}
    try:
        got = {g: rt.infer(*ref.feeds.graph_inputs(bundle, g)) for g, rt in runtimes.items()}
        comparisons = {}
        for graph in bundle.graphs:
            check, comparisons[graph] = _compare_outputs(name, graph, bundle, ref, got[graph], tolerance)
            checks.append(check)
        checks.append(_nan_check(name, bundle, ref, got))
        checks.append(_repeat_check(name, bundle, runtimes, ref.feeds))
        failed = [c for c in checks if c.name.startswith("observations.") and c.status == "fail"]
        if failed:
            diagnosis = _diagnose(bundle, ref, got, comparisons, tolerance, checkpoint_matches).to_dict()
            for c in failed:
                c.diagnosis = diagnosis
        for mode, trace in ref.traces.items():
            policy = mode_policy(bundle, runtimes, mode)
            noise = ref.episode_noise.get(mode)
            atol = _action_atol(bundle, mode, tolerance)
            teacher = _teacher_forced(name, mode, trace, policy, noise, is_discrete(bundle), atol)
            checks.append(teacher)
            assert inputs.env is not None
            own = E.run_episodes(inputs.env, policy, ref.episodes, ref.seed, noise, is_discrete(bundle))
            diff = E.action_differences(trace, own, is_discrete(bundle), atol)
            diffs[mode] = diff["per_step_max"]
            checks.append(_free_running_check(name, mode, diff, trace, teacher.status == "pass"))
    except MsrlError as exc:
        checks.append(Check(name, "inference", "fail", str(exc), diagnosis=RUNTIME_FAILURE))
        info = {"status": "error", "reason": str(exc)}
    finally:
        _close(runtimes)
    return RuntimeReport(info, checks, diffs)


def _close(runtimes: Mapping[str, Runtime]) -> None:
    for rt in runtimes.values():
        rt.close()


def _compare_outputs(
    runtime: str, graph: str, bundle: Bundle, ref: Reference, got: dict[str, np.ndarray],
    tolerance: Mapping[str, Tolerance],
) -> tuple[Check, dict[str, ArrayComparison]]:  # fmt: skip
    """Every output of ``graph`` on the finite feeds, plus the contract's policy-level metrics."""
    finite = ref.feeds.finite
    expected = ref.outputs[graph]
    cmps = {k: compare_arrays(k, _rows(expected[k], finite), _rows(got[k], finite), tolerance[k]) for k in expected}
    failed = [c for c in cmps.values() if not c.passed]
    worst = max(cmps.values(), key=lambda c: c.max_abs)
    summary = (
        f"{len(failed)} output(s) differ: "
        + ", ".join(f"{c.name} {c.mismatches}/{c.count} (max abs {c.max_abs:.2e})" for c in failed)
        if failed
        else f"{int(finite.sum())} observations agree; worst {worst.name} max abs {worst.max_abs:.2e}"
    )
    contract = bundle.contract(graph)
    noise = ref.feeds.noise.get(graph)
    host_noise = noise[finite] if noise is not None and contract.samples_on_host else None
    metrics: dict[str, Any] = {"outputs": {k: c.to_dict() for k, c in cmps.items()}}
    metrics.update(policy_metrics(contract, _select(expected, finite), _select(got, finite), host_noise))
    return Check(runtime, f"observations.{graph}", "fail" if failed else "pass", summary, metrics), cmps


def _rows(array: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """The rows of a batched output; an output that ignores the batch (a state-independent std) is kept whole."""
    return array[rows] if array.ndim and array.shape[0] == len(rows) else array


def _select(outputs: Mapping[str, np.ndarray], rows: np.ndarray) -> dict[str, np.ndarray]:
    return {k: _rows(v, rows) for k, v in outputs.items()}


def _nan_check(runtime: str, bundle: Bundle, ref: Reference, got: dict[str, dict[str, np.ndarray]]) -> Check:
    rows = ~ref.feeds.finite
    mismatched = []
    for graph, outs in got.items():
        for k, v in outs.items():
            expected = ref.outputs[graph][k]
            if v.dtype.kind != "f" or v.shape[:1] != rows.shape:
                continue
            if not np.array_equal(np.isnan(v[rows]), np.isnan(expected[rows])):
                mismatched.append(k)
    # NaN observations are invalid input: a runtime that handles them differently is flagged, not failed.
    if mismatched:
        summary = f"NaN observations propagate differently in {', '.join(sorted(set(mismatched)))}"
        return Check(runtime, "nan_propagation", "warn", summary)
    summary = f"{int(rows.sum())} NaN observations propagate as in the reference (flagged; actions undefined)"
    return Check(runtime, "nan_propagation", "pass", summary)


def _repeat_check(runtime: str, bundle: Bundle, runtimes: Mapping[str, Runtime], feeds: Feeds) -> Check:
    changed = {g: names for g, rt in runtimes.items() if (names := changed_on_rerun(bundle, g, rt, feeds))}
    if changed:
        detail = "; ".join(f"{g}: {', '.join(names)}" for g, names in changed.items())
        return Check(runtime, "repeatability", "fail", f"the same input gives different outputs on a re-run ({detail})",
                     diagnosis=IN_GRAPH_RANDOMNESS)  # fmt: skip
    return Check(runtime, "repeatability", "pass", "the same input gives the same bits twice")


RUNTIME_FAILURE = {
    "stage": "runtime",
    "detail": "the runtime failed or hung on this graph (stopped by its watchdog): a runtime defect or an unsupported "
    "pattern, not a numerical difference",
}
IN_GRAPH_RANDOMNESS = {
    "stage": "sampling",
    "detail": "sampling inside the graph cannot be reproduced by another runtime; take the noise as an input",
}


def _action_atol(bundle: Bundle, mode: str, tolerance: Mapping[str, Tolerance]) -> float:
    graph = bundle.mode_graph(mode)
    action = bundle.contract(graph).action  # type: ignore[arg-type]
    return tolerance[action.action or action.distribution_output].atol


def _diagnose(
    bundle: Bundle, ref: Reference, got: dict[str, dict[str, np.ndarray]], cmps: dict[str, dict[str, ArrayComparison]],
    tolerance: Mapping[str, Tolerance], checkpoint_matches: bool | None,
):  # fmt: skip
    det = bundle.mode_graph("deterministic") or bundle.graphs[0]
    contract = bundle.contract(det)
    decision = contract.action.distribution_output
    finite = ref.feeds.finite
    ref_out, got_out = _select(ref.outputs[det], finite), _select(got[det], finite)
    ref_action, got_action = contract.env_action(ref_out), contract.env_action(got_out)
    atol = _action_atol(bundle, "deterministic", tolerance) if bundle.mode_graph("deterministic") else 1e-6
    if contract.action.is_discrete:
        action_ok = bool(np.array_equal(ref_action, got_action))
    else:
        action_ok = bool(np.allclose(ref_action, got_action, atol=atol, rtol=0, equal_nan=True))
    sto = bundle.mode_graph("stochastic")
    if sto is not None and sto != det:
        sample_ok = all(c.passed for c in cmps[sto].values())
    elif sto is not None:
        noise = ref.feeds.noise[sto][finite]
        a, b = contract.env_action(ref_out, noise), contract.env_action(got_out, noise)
        sample_ok = bool(np.array_equal(a, b) if contract.action.is_discrete else np.allclose(a, b, atol=atol, rtol=0))
    else:
        sample_ok = True
    value_ok = all(cmps[g][bundle.contract(g).value].passed for g in bundle.graphs if bundle.contract(g).value)
    without = ref.without_norm.get(det) if ref.without_norm else None
    return diagnose(
        det_param_ok=cmps[det][decision].passed,
        det_action_ok=action_ok,
        sample_ok=sample_ok,
        value_ok=value_ok,
        got_param=got_out[decision],
        param_without_norm=None if without is None else _rows(without, finite),
        got_action=got_action,
        unscaled_action=None if contract.action.is_discrete else ref_out[decision],
        max_rel_param=cmps[det][decision].max_rel,
        cosine_param=cmps[det][decision].cosine,
        bundle_precision=bundle.precision,
        checkpoint_matches=checkpoint_matches,
    )


def _teacher_forced(
    runtime: str, mode: str, trace: E.EpisodeTrace, policy: E.Policy, noise: np.ndarray | None, discrete: bool,
    atol: float,
) -> Check:  # fmt: skip
    """The runtime acts on the reference's observation stream; compare the chosen actions step by step."""
    got = E.teacher_forced_actions(trace, policy, noise)
    diff = E.step_differences(trace.actions, got, discrete)
    diff = (diff > (0.5 if discrete else atol)) & trace.alive
    steps = np.flatnonzero(diff.any(1))
    first = int(steps[0]) if len(steps) else None
    metrics = {"differing_actions": int(diff.sum()), "first_divergent_step": first, "steps": int(trace.alive.sum())}
    summary = (
        f"{int(diff.sum())} of {int(trace.alive.sum())} actions differ, first at step {first}"
        if diff.any()
        else f"all {int(trace.alive.sum())} actions agree on the reference's observations"
    )
    return Check(runtime, f"episodes.teacher_forced.{mode}", "fail" if diff.any() else "pass", summary, metrics)


def _free_running_check(runtime: str, mode: str, diff: dict, trace: E.EpisodeTrace, teacher_ok: bool) -> Check:
    """Each path drives its own env. Divergence is a failure unless it is the env amplifying differences
    below tolerance: observations drifted first and the policy agrees step by step when teacher-forced."""
    first = [f for f in diff["first_divergent_step"] if f is not None]
    drift = [d for d in diff["first_observation_drift"] if d is not None]
    delta = diff["return_delta"]
    metrics = {
        "episodes_diverged": diff["episodes_diverged"],
        "first_divergent_step": min(first) if first else None,
        "first_divergent_step_per_episode": diff["first_divergent_step"],
        "first_observation_drift": min(drift) if drift else None,
        "differing_steps": diff["differing_steps"],
        "max_abs_return_delta": float(np.abs(delta).max()) if len(delta) else 0.0,
        "mean_return_delta": float(delta.mean()) if len(delta) else 0.0,
        "reference_returns": trace.returns.tolist(),
    }
    name = f"episodes.free_running.{mode}"
    if not diff["episodes_diverged"]:
        return Check(runtime, name, "pass", f"{len(delta)} episodes match the reference step by step", metrics)
    diverged = [k for k, f in enumerate(diff["first_divergent_step"]) if f is not None]
    amplified = teacher_ok and all(diff["amplified"][k] for k in diverged)
    summary = (
        f"{diff['episodes_diverged']} of {len(delta)} episodes diverge (first at step {min(first) if first else '?'}), "
        f"max |return delta| {metrics['max_abs_return_delta']:.3g}, mean {metrics['mean_return_delta']:+.3g}"
    )
    if amplified:
        summary += (
            f"; observations drifted first (step {min(drift)}) from action differences below tolerance and the "
            "teacher-forced check agrees: the env amplifies them (chaotic dynamics), not a policy mismatch"
        )
        return Check(runtime, name, "warn", summary, metrics)
    return Check(runtime, name, "fail", summary, metrics)
