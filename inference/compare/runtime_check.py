"""Check one runtime (one ``Runtime`` per bundle graph) against the reference.

Per graph: every output on the same feeds (Polygraphy-style statistics), the discrete action as the preset
judges flips, the contract's policy-level metrics, NaN handling and repeatability; a failure gets a diagnosis.
Per mode: teacher-forced and free-running episodes, judged in ``episode_checks``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from inference.bundle import Bundle, BundleError
from inference.compare import episodes as E
from inference.compare.acting import is_discrete, mode_policy
from inference.compare.checks import Check
from inference.compare.diagnose import diagnose
from inference.compare.episode_checks import free_running_check, near_ties, teacher_forced_check
from inference.compare.feeds import Feeds
from inference.compare.policy_level import policy_metrics
from inference.compare.reference import Inputs, Reference, changed_on_rerun
from inference.compare.stats import ArrayComparison, Preset, Tolerance, compare_arrays
from inference.contract import PolicyContract, top2_margin
from inference.errors import MsrlError
from inference.runtimes.base import Runtime


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
    preset: Preset,
    required: bool,
    checkpoint_matches: bool | None,
    env_deterministic: bool = False,
) -> RuntimeReport:
    """Open, compare, close. ``tolerance`` maps every output name to its tolerance for this runtime; ``preset``
    says what else the tolerance promises (flips at near-ties, episodes judged by their returns).

    ``env_deterministic`` (the env passed its determinism check) lets free-running episodes skip the env steps
    where the runtime acts exactly like the reference (``episodes.run_episodes(follow=...)``): same results.
    """
    from inference.runtimes.lite import IncompatibleModel

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
            check, comparisons[graph] = _compare_outputs(name, graph, bundle, ref, got[graph], tolerance, preset)
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
            atol = _action_atol(bundle, mode, tolerance, trace.actions[trace.alive])
            margins = near_ties(preset, ref.top2.get(mode), tolerance, bundle, mode)
            teacher = teacher_forced_check(
                name, mode, trace, policy, noise, is_discrete(bundle), atol, margins, preset.max_flip_rate
            )
            checks.append(teacher)
            assert inputs.env is not None
            follow = trace if env_deterministic else None
            own = E.run_episodes(inputs.env, policy, ref.episodes, ref.seed, noise, is_discrete(bundle), follow)
            diff = E.action_differences(trace, own, is_discrete(bundle), atol)
            diffs[mode] = diff["per_step_max"]
            checks.append(free_running_check(name, mode, diff, trace, own, teacher.status == "pass", preset))
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
    tolerance: Mapping[str, Tolerance], preset: Preset,
) -> tuple[Check, dict[str, ArrayComparison]]:  # fmt: skip
    """Every output of ``graph`` on the finite feeds, the discrete action as the preset judges flips, and the
    contract's policy-level metrics."""
    finite = ref.feeds.finite
    expected = ref.outputs[graph]
    contract = bundle.contract(graph)
    cmps = {k: compare_arrays(k, _rows(expected[k], finite), _rows(got[k], finite), tolerance[k]) for k in expected}
    ref_out, got_out = _select(expected, finite), _select(got, finite)
    noise = ref.feeds.noise.get(graph)
    flips = None
    if contract.action.is_discrete:
        graph_noise = noise[finite] if noise is not None and contract.takes_noise else None
        scores_tol = tolerance[contract.action.distribution_output]
        flips = judge_flips(contract, ref_out, got_out, graph_noise, preset, scores_tol)
    # A discrete action output is judged as an action (flips), not element by element.
    failed = [c for k, c in cmps.items() if not c.passed and not (flips and k == contract.action.action)]
    parts = [f"{c.name} {c.mismatches}/{c.count} (max abs {c.max_abs:.2e})" for c in failed]
    if flips and not flips["ok"]:
        parts.append(f"{flips['flips']} action flip(s) of {flips['count']}, {flips['explained']} at near-ties")
    worst = max(cmps.values(), key=lambda c: c.max_abs)
    summary = f"{int(finite.sum())} observations agree; worst {worst.name} max abs {worst.max_abs:.2e}"
    if flips and flips["flips"]:
        summary += f"; {flips['flips']} action flip(s) at near-ties, within the {preset.name} preset"
    if parts:
        summary = f"{len(parts)} output(s) differ: " + ", ".join(parts)
    host_noise = noise[finite] if noise is not None and contract.samples_on_host else None
    metrics: dict[str, Any] = {"outputs": {k: c.to_dict() for k, c in cmps.items()}}
    metrics.update(policy_metrics(contract, ref_out, got_out, host_noise))
    if flips is not None:
        metrics["flips"] = flips
    return Check(runtime, f"observations.{graph}", "fail" if parts else "pass", summary, metrics), cmps


def judge_flips(
    contract: PolicyContract, ref: Mapping[str, np.ndarray], got: Mapping[str, np.ndarray], noise: np.ndarray | None,
    preset: Preset, tol: Tolerance,
) -> dict[str, Any]:  # fmt: skip
    """Discrete actions that differ, each explained or not by a near-tie of the reference's decision scores."""
    ref_action, got_action = contract.env_action(ref), contract.env_action(got)
    rows = np.flatnonzero(ref_action != got_action)
    scores = contract.decision_scores(ref, noise)
    explained = np.zeros(len(rows), bool)
    margins = np.full(len(rows), np.nan)
    if scores is not None and len(rows):
        margin, scale = top2_margin(scores[rows])
        margins, explained = margin, margin <= preset.flip_bound(scale, tol)
    rate = len(rows) / max(1, len(ref_action))
    ok = not len(rows) or (preset.allow_flips and bool(explained.all()) and rate <= preset.max_flip_rate)
    return {
        "ok": ok,
        "flips": int(len(rows)),
        "count": int(len(ref_action)),
        "explained": int(explained.sum()),
        "rate": rate,
        "max_rate": preset.max_flip_rate if preset.allow_flips else 0.0,
        "rows": rows[:20].tolist(),
        "margins": margins[:20].tolist(),
    }


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


def _action_atol(
    bundle: Bundle, mode: str, tolerance: Mapping[str, Tolerance], actions: np.ndarray | None = None
) -> float:
    """The absolute difference two continuous actions may have in ``mode``: the acting output's atol, plus its
    ``scale`` times the largest reference action (a preset whose error grows with the magnitude)."""
    graph = bundle.mode_graph(mode)
    action = bundle.contract(graph).action  # type: ignore[arg-type]
    tol = tolerance[action.action or action.distribution_output]
    largest = float(np.abs(actions).max()) if actions is not None and actions.size and tol.scale else 0.0
    return tol.atol + tol.scale * largest


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
    has_det = bundle.mode_graph("deterministic") is not None
    atol = _action_atol(bundle, "deterministic", tolerance, np.asarray(ref_action)) if has_det else 1e-6
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
        atol=tolerance[decision].atol,
        rtol=tolerance[decision].rtol,
    )
