"""Check one runtime (one ``Runtime`` per bundle graph) against the reference.

Per graph: every output on the same feeds (Polygraphy-style statistics), discrete actions judged as flips
against the tolerance granted to their scores, the contract's policy-level metrics, NaN handling and
repeatability; a failure gets a diagnosis (``evidence`` measures, ``diagnose`` decides). Per mode:
teacher-forced and free-running episodes, judged in ``episode_checks``. A runtime that was killed from outside
is not judged (status ``error``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from inference.bundle import Bundle, BundleError
from inference.bundle.contract import ContractError, PolicyContract
from inference.compare import episodes as E
from inference.compare.acting import is_discrete, mode_policy
from inference.compare.batches import infer_feeds
from inference.compare.checks import Check
from inference.compare.episodes.checks import free_running_check, near_ties, teacher_forced_check
from inference.compare.feeds import Feeds
from inference.compare.judge.batch_invariance import batch_invariance
from inference.compare.judge.diagnose import not_repeatable, training_mode_ops
from inference.compare.judge.evidence import action_atol, gather_diagnosis, same_shape, select_rows, take_rows
from inference.compare.judge.policy_bounds import PolicyBounds, policy_check
from inference.compare.judge.policy_level import policy_metrics
from inference.compare.judge.stats import ArrayComparison, Preset, Tolerance, compare_arrays, score_allowance
from inference.compare.reference import Inputs, Reference, batch_coupling, changed_on_rerun
from inference.errors import MsrlError
from inference.runtimes.base import Runtime, RuntimeDied


@dataclass
class RuntimeReport:
    """What one runtime's check produced: its info for the report, its checks, its per-step episode diffs."""

    info: dict[str, Any]
    checks: list[Check]
    episode_diffs: dict[str, np.ndarray]
    worst_rows: dict[str, np.ndarray] = field(default_factory=dict)  # graph -> feed rows that differ most


RUNTIME_FAILURE = {
    "stage": "runtime",
    "detail": "the runtime failed or hung on this graph: a runtime defect or an unsupported pattern, not a "
    "numerical difference",
}
LOWERED = {
    "stage": "precision",
    "detail": "the graph follows a precision plan: its lowered layers move the policy beyond what their precision "
    "allows (the layers the plan measured as breaking the bounds alone are named in its policy check)",
}
IN_GRAPH_RANDOMNESS = {
    "stage": "sampling",
    "detail": "sampling inside the graph cannot be reproduced by another runtime; take the noise as an input",
}


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
    asked: bool = True,
    policy: PolicyBounds | None = None,
) -> RuntimeReport:
    """Open, compare, close. ``tolerance`` maps every output name to its tolerance for this runtime; ``preset``
    says what else the tolerance promises (the flip rate, episodes judged by their returns).

    ``env_deterministic`` (the env passed its determinism check) lets free-running episodes skip the env steps
    where the runtime acts exactly like the reference (``episodes.run_episodes(follow=...)``): same results.
    ``asked``: the user named this runtime; a format version it cannot read is then a warning (a failure when
    ``required``), otherwise a fact in the runtimes section only. ``policy``: the policy-level bounds of its
    precision (``policy_bounds``), judged as ``policy.<graph>`` checks.
    """
    failed_to_open = _open(name, runtimes, required, asked)
    if failed_to_open is not None:
        return failed_to_open
    checks: list[Check] = []
    first = next(iter(runtimes.values()))
    info = {"status": "ran", "versions": first.versions(),
            "tolerance": {k: {**v.to_dict(), "rule": v.describe()} for k, v in tolerance.items()}}  # fmt: skip
    diffs: dict[str, np.ndarray] = {}
    worst: dict[str, np.ndarray] = {}
    try:
        worst = _observation_checks(name, runtimes, bundle, ref, tolerance, preset, policy, checkpoint_matches,
                                    info, checks)  # fmt: skip
        for mode, trace in ref.traces.items():
            diffs[mode] = _episode_checks(name, mode, trace, runtimes, bundle, ref, inputs, tolerance, preset,
                                          env_deterministic, checks)  # fmt: skip
    except RuntimeDied as exc:
        checks.append(_died(name, exc))
        info = {"status": exc.status, "reason": str(exc)}
    except (MsrlError, ContractError) as exc:  # outputs that break the contract: this runtime's fault, not the input
        checks.append(Check(name, "inference", "fail", str(exc), diagnosis=RUNTIME_FAILURE))
        if any(c.name.startswith("observations.") for c in checks):
            info["failure"] = str(exc)  # compared, then failed: a verdict on this runtime with its evidence
        else:
            info = {"status": "error", "reason": str(exc)}
    finally:
        restarts = [r for rt in runtimes.values() for r in getattr(rt, "restarts", [])]
        _close(runtimes)
    if restarts and info["status"] == "ran":
        checks.append(Check(name, "restarts", "warn", f"the runtime's process was restarted: {'; '.join(restarts)}; "
                            "every comparison above comes from a complete answer"))  # fmt: skip
    return RuntimeReport(info, checks, diffs, worst)


def _open(name: str, runtimes: Mapping[str, Runtime], required: bool, asked: bool) -> RuntimeReport | None:
    """Open every graph's runtime; the report of a runtime that cannot (a format too new for it, a crash, a load
    error, inputs it would cast), else None."""
    from inference.runtimes.lite import IncompatibleModel

    checks: list[Check] = []
    try:
        for rt in runtimes.values():
            rt.open()
    except IncompatibleModel as exc:
        _close(runtimes)
        diagnosis = {"stage": "version", "detail": "the format is newer than this runtime reads"}
        if required or asked:
            status = "fail" if required else "warn"
            checks.append(Check(name, "version_contract", status, str(exc), diagnosis=diagnosis))
        return RuntimeReport({"status": "incompatible", "reason": str(exc)}, checks, {})
    except RuntimeDied as exc:
        _close(runtimes)
        return RuntimeReport({"status": exc.status, "reason": str(exc)}, [_died(name, exc)], {})
    except (MsrlError, BundleError) as exc:
        _close(runtimes)
        checks.append(Check(name, "load", "fail", str(exc), diagnosis=RUNTIME_FAILURE))
        return RuntimeReport({"status": "error", "reason": str(exc)}, checks, {})
    cast = _input_casts(runtimes)
    if cast:
        _close(runtimes)
        checks.append(Check(name, "input_dtypes", "fail", cast, diagnosis={"stage": "runtime", "detail": cast}))
        return RuntimeReport({"status": "error", "reason": cast}, checks, {})
    return None


def _observation_checks(
    name: str, runtimes: Mapping[str, Runtime], bundle: Bundle, ref: Reference, tolerance: Mapping[str, Tolerance],
    preset: Preset, policy: PolicyBounds | None, checkpoint_matches: bool | None, info: dict, checks: list[Check],
) -> dict[str, np.ndarray]:  # fmt: skip
    """The reference's observations through the runtime in its batches: outputs, policy bounds, NaN facts,
    repeatability, batch invariance, and a failure's diagnosis; returns each graph's rows that differ most."""
    got = {g: infer_feeds(rt, bundle, g, ref.feeds) for g, rt in runtimes.items()}  # the reference's batches
    comparisons = {}
    for graph in bundle.graphs:
        check, comparisons[graph] = _compare_outputs(name, graph, bundle, ref, got[graph], tolerance, preset)
        checks.append(check)
        gate = policy_check(name, graph, bundle, ref, got[graph], policy, preset) if policy else None
        checks += [gate] if gate is not None else []
    info["nan_propagation"] = _nan_facts(ref, got)
    worst = {g: _worst_rows(bundle, g, ref, got[g], tolerance) for g in bundle.graphs}
    repeat = _repeat_check(name, bundle, runtimes, ref.feeds, tolerance, ref.batch_coupled)
    checks.append(repeat)
    info["batch_invariance"] = batch_invariance(bundle, runtimes, ref.feeds)
    failed = [c for c in checks if c.name.startswith("observations.") and c.status == "fail"]
    if failed:
        lowered = bool(bundle.plan) and preset.name == (bundle.plan or {}).get("lower")
        diagnosis = repeat.diagnosis or (LOWERED if lowered else gather_diagnosis(
            bundle, ref, got, comparisons, tolerance, checkpoint_matches
        ))  # fmt: skip
        for c in failed:
            c.diagnosis = dict(diagnosis)
    return worst


def _episode_checks(
    name: str, mode: str, trace: Any, runtimes: Mapping[str, Runtime], bundle: Bundle, ref: Reference, inputs: Inputs,
    tolerance: Mapping[str, Tolerance], preset: Preset, env_deterministic: bool, checks: list[Check],
) -> np.ndarray:  # fmt: skip
    """One mode's episodes: teacher-forced on the reference's observations, then free-running in the env; returns
    the per-step largest action difference."""
    policy = mode_policy(bundle, runtimes, mode)
    noise = ref.episode_noise.get(mode)
    atol = action_atol(bundle, mode, tolerance, trace.actions[trace.alive])
    margins = near_ties(ref.top2.get(mode), tolerance, bundle, mode, _ordinary_magnitude(bundle, ref, mode))
    teacher = teacher_forced_check(name, mode, trace, policy, noise, atol, margins, preset.max_flip_rate,
                                   tolerance)  # fmt: skip
    checks.append(teacher)
    assert inputs.env is not None
    if env_deterministic and teacher.metrics["bitwise_equal"]:
        # Every action bit for bit the reference's, on its observations, in its batches, from the same states:
        # in an env that replays a seed exactly, this runtime's own episodes are the reference's.
        own = trace
    else:
        own = E.run_episodes(inputs.env, policy, ref.episodes, ref.seed, noise, trace if env_deterministic
                             else None)  # fmt: skip
    diff = E.action_differences(trace, own, is_discrete(bundle), atol)
    free = free_running_check(name, mode, diff, trace, own, teacher.status == "pass", preset, margins)
    if own is trace:
        free.summary += (" (every teacher-forced action equals the reference's bit for bit and the env replays "
                         "a seed exactly, so the free run is the reference's own)")  # fmt: skip
    checks.append(free)
    return diff["per_step_max"]


def _worst_rows(
    bundle: Bundle, graph: str, ref: Reference, got: Mapping[str, np.ndarray], tolerance: Mapping[str, Tolerance],
    n: int = 8,
) -> np.ndarray:  # fmt: skip
    """The ordinary feed rows where the graph's outputs are furthest beyond their tolerance (the rows a localisation
    runs on): the decision output's rows when it fails, else those of any output that does (Q-values next to an
    integer action, a network's features)."""
    rows = np.flatnonzero(ref.feeds.finite & ref.feeds.ordinary)
    decision = bundle.contract(graph).action.distribution_output
    worst, deciding = np.zeros(len(rows)), np.zeros(len(rows))  # error / tolerance per row: any output, the decision
    for name, want in ref.outputs[graph].items():
        want, have = np.asarray(want, np.float64), np.asarray(got.get(name), np.float64)
        if want.shape != have.shape or want.ndim == 0 or want.shape[0] != len(ref.feeds) or name not in tolerance:
            continue
        tol = tolerance[name]
        with np.errstate(all="ignore"):
            over = np.abs(want - have) / (tol.atol + tol.rtol * np.abs(want))
        over = np.nan_to_num(over.reshape(len(want), -1).max(1)[rows], nan=0.0, posinf=0.0)
        worst = np.maximum(worst, over)
        if name == decision:
            deciding = np.where(over > 1.0, over, 0.0)
    order = np.lexsort((-worst, -deciding))  # the decision output's failing rows first
    return np.sort(rows[order[:n]])


def _input_casts(runtimes: Mapping[str, Runtime]) -> str | None:
    """A loaded model whose inputs are not the dtypes the contract declares (the runtime would cast them)."""
    for graph, rt in runtimes.items():
        declared = [m.dtype for m in rt.inputs]
        actual = rt.model_input_dtypes()
        if actual is not None and list(actual) != declared:
            pairs = ", ".join(f"{m.name} {a} (contract: {m.dtype})" for m, a in zip(rt.inputs, actual, strict=False)
                              if a != m.dtype)  # fmt: skip
            return f"the {graph} model in {rt.name} takes {pairs}: the runtime would cast the input"
    return None


def _died(name: str, exc: RuntimeDied) -> Check:
    """A runtime killed from outside (twice), or that never answered, could not be judged: not a verdict on the bundle
    (exit 3)."""
    return Check(name, "inference", "error", str(exc), diagnosis={"stage": "runtime", "detail": exc.detail})


def _close(runtimes: Mapping[str, Runtime]) -> None:
    for rt in runtimes.values():
        rt.close()


def _compare_outputs(
    runtime: str, graph: str, bundle: Bundle, ref: Reference, got: dict[str, np.ndarray],
    tolerance: Mapping[str, Tolerance], preset: Preset,
) -> tuple[Check, dict[str, ArrayComparison]]:  # fmt: skip
    """Every output of ``graph`` on the finite feeds, the discrete action judged as flips, and the contract's
    policy-level metrics. A log-prob of a flipped sampled action is the flip's consequence, counted once (as it)."""
    finite = preset.judged(ref.feeds)
    pooled = ref.feeds.ordinary[finite]
    expected = ref.outputs[graph]
    contract = bundle.contract(graph)
    ref_out, got_out = select_rows(expected, finite), select_rows(got, finite)
    noise = ref.feeds.noise.get(graph)
    flips, flipped = None, np.zeros(int(finite.sum()), bool)
    heads = contract.action.heads
    if contract.action.is_discrete and all(same_shape(ref_out, got_out, head) for head in heads):
        graph_noise = noise[finite] if noise is not None and contract.takes_noise else None
        flips, flipped = judge_flips(contract, ref_out, got_out, graph_noise, preset, tolerance, pooled)
    cmps = {}
    for k in expected:
        r, g, rows = take_rows(expected[k], finite), take_rows(got[k], finite), pooled
        if k == contract.log_prob and flipped.any() and r.shape == g.shape and len(r) == len(flipped):
            r, g, rows = r[~flipped], g[~flipped], pooled[~flipped]
        cmps[k] = compare_arrays(k, r, g, tolerance[k], rows)
    failed, summary = outputs_verdict(cmps, flips, contract.action.action, f"{ref.feeds.describe(finite)} observations")
    host_noise = noise[finite] if noise is not None and contract.samples_on_host else None
    metrics: dict[str, Any] = {"outputs": {k: c.to_dict() for k, c in cmps.items()}}
    if all(same_shape(ref_out, got_out, k) for k in ref_out):
        graph_noise = noise[finite] if noise is not None and contract.takes_noise else None
        metrics.update(policy_metrics(contract, ref_out, got_out, host_noise, graph_noise))
    if flips is not None:
        metrics["flips"] = flips
    return Check(runtime, f"observations.{graph}", "fail" if failed else "pass", summary, metrics), cmps


def outputs_verdict(
    cmps: Mapping[str, ArrayComparison], flips: Mapping[str, Any] | None, action: str | None, observed: str
) -> tuple[list[str], str]:
    """What failed among a graph's output comparisons (each failing output, and the flips beyond the preset's rate),
    and the check's one-line summary (``observed``: which observations agreed). A discrete action output (``action``)
    is judged as an action (flips), not element by element."""
    failed = [c for k, c in cmps.items() if not c.passed and not (flips and k == action)]
    parts = [c.describe() for c in failed]
    if flips and not flips["ok"]:
        parts.append(f"{flips['flips']} action flip(s) of {flips['count']}, {flips['explained']} within the "
                     "tolerance of the scores")  # fmt: skip
    worst = max(cmps.values(), key=lambda c: c.max_abs)
    summary = f"{observed} agree; worst {worst.name} max abs {worst.max_abs:.2e}"
    if flips and flips["flips"]:
        summary += f"; {flips['flips']} action flip(s) at near-ties within the tolerance of the scores"
    if parts:
        differ = f"{len(failed)} output(s) differ: " if failed else "outputs agree, actions do not: "
        summary = differ + "; ".join(parts)
    return parts, summary


def judge_flips(
    contract: PolicyContract, ref: Mapping[str, np.ndarray], got: Mapping[str, np.ndarray], noise: np.ndarray | None,
    preset: Preset, tolerance: Mapping[str, Tolerance], pooled: np.ndarray | None = None,
    row_atol: Mapping[str, np.ndarray] | None = None,
) -> tuple[dict[str, Any], np.ndarray]:  # fmt: skip
    """Discrete actions that differ, head by head, each explained or not by the tolerance granted to the scores: a
    flip from the reference's choice ``i`` to ``j`` is within tolerance when the reference's score margin
    ``s_i - s_j`` is at most what the two entries' allowances close (``stats.score_allowance``). ``row_atol``
    overrides a head's per-row atol (default ``Tolerance.row_atol`` with ``pooled`` ordinary rows). Returns the
    verdict and the rows where any head flipped."""
    a = contract.action
    ref_action, got_action = contract.env_action(ref), contract.env_action(got)
    n = len(ref_action)
    ra, ga = np.asarray(ref_action).reshape(n, -1), np.asarray(got_action).reshape(n, -1)
    flipped = (ra != ga).any(1)
    rows_all, margins_all, explained_all, heads = [], [], [], []
    for h, head in enumerate(a.heads):
        rows = np.flatnonzero(ra[:, h] != ga[:, h])
        scores = contract.decision_scores(ref, noise, h)
        explained = np.zeros(len(rows), bool)
        margins = np.full(len(rows), np.nan)
        if scores is not None and len(rows):
            tol = tolerance[head]
            values = np.asarray(contract.decision_values(ref, h), np.float64)
            atol = (row_atol or {}).get(head)
            atol = (tol.row_atol(values, pooled) if atol is None else np.asarray(atol))[rows]
            s, v = np.asarray(scores, np.float64)[rows], values[rows]
            i, j = ra[rows, h].astype(np.int64), ga[rows, h].astype(np.int64)
            valid = (j >= 0) & (j < s.shape[-1])  # an index outside the scores is never a near-tie
            j = np.clip(j, 0, s.shape[-1] - 1)
            at = np.arange(len(rows))
            margins = s[at, i] - s[at, j]
            bound = score_allowance(tol, v[at, i], v[at, j], atol, a.probs is not None)
            explained = valid & (margins <= bound)
        heads.append({"head": head, "flips": int(len(rows)), "explained": int(explained.sum())})
        rows_all.append(rows)
        margins_all.append(margins)
        explained_all.append(explained)
    explained = np.concatenate(explained_all)
    rate = int(flipped.sum()) / max(1, n)
    ok = not flipped.any() or (bool(explained.all()) and rate <= preset.max_flip_rate)
    verdict = {
        "ok": ok,
        "flips": int(len(explained)),
        "count": int(n),
        "explained": int(explained.sum()),
        "rate": rate,
        "max_rate": preset.max_flip_rate,
        "rows": np.concatenate(rows_all)[:20].tolist(),
        "margins": np.concatenate(margins_all)[:20].tolist(),
    }
    if a.multi_head:
        verdict["heads"] = heads
    return verdict, flipped


def _nan_facts(ref: Reference, got: dict[str, dict[str, np.ndarray]]) -> dict[str, Any]:
    """How this runtime handles the NaN observations (invalid input, not judged): the outputs whose NaN pattern
    differs from the reference's. A fact about the runtime for the report's runtimes section, not a check."""
    rows = ~ref.feeds.finite
    differ = sorted({
        k for graph, outs in got.items() for k, v in outs.items()
        if v.dtype.kind == "f" and v.shape[:1] == rows.shape and ref.outputs[graph][k].shape == v.shape
        and not np.array_equal(np.isnan(v[rows]), np.isnan(ref.outputs[graph][k][rows]))
    })  # fmt: skip
    return {"rows": int(rows.sum()), "outputs_differing": differ}


def _repeat_check(
    runtime: str, bundle: Bundle, runtimes: Mapping[str, Runtime], feeds: Feeds, tolerance: Mapping[str, Tolerance],
    cell_coupled: Mapping[str, list[str]] | None = None,
) -> Check:  # fmt: skip
    """The same rows twice give the same bits, and a row's outputs do not change (beyond tolerance) when the other
    rows of its batch change: a graph that fails either samples inside, runs BatchNorm/Dropout in training mode, or
    couples rows (a reduction over the batch). How far the batch's size alone moves a row (a few ULP where kernels
    block the GEMM by batch) is measured and reported: numerics, not coupling."""
    changed = {g: names for g, rt in runtimes.items() if (names := changed_on_rerun(bundle, g, rt, feeds))}
    batch: dict[str, list[str]] = {}
    size_effect = 0.0
    for g, rt in runtimes.items():
        coupled, moved = batch_coupling(bundle, g, rt, feeds, tolerance)
        size_effect = max(size_effect, moved)
        if coupled:
            batch[g] = coupled
    metrics = {"batch_size_effect_max_abs": size_effect}
    if not changed and not batch:
        effect = f" (the batch's size alone moves a row by at most {size_effect:.1e})" if size_effect else ""
        return Check(runtime, "repeatability", "pass", "the same input gives the same bits twice, and a row's outputs "
                     f"do not depend on the other rows of its batch{effect}", metrics)  # fmt: skip
    ops = sorted({op for g in (*changed, *batch) for op in _graph_ops(runtimes[g])})
    what = "the graph" if not ops else f"the {next(iter(runtimes.values())).fmt} graph"
    cell_couples = None if cell_coupled is None else any(g in cell_coupled for g in batch)
    diagnosis = not_repeatable(ops, bool(batch) and not changed, what, cell_couples).to_dict()
    detail = "; ".join(f"{g}: {', '.join(names)}" for g, names in (changed or batch).items())
    summary = ("the same input gives different outputs on a re-run" if changed else
               "a row's outputs change with the other rows of its batch") + f" ({detail})"  # fmt: skip
    return Check(runtime, "repeatability", "fail", summary, metrics, diagnosis=diagnosis)


def _graph_ops(runtime: Runtime) -> list[str]:
    if runtime.fmt is None:
        return []
    try:
        return training_mode_ops(runtime.model_path().read_bytes())
    except (OSError, BundleError):
        return []


def _ordinary_magnitude(bundle: Bundle, ref: Reference, mode: str) -> float:
    """The largest magnitude of ``mode``'s decision scores over the ordinary observation rows: what a tolerance that
    grows with magnitude grants every ordinary row (``stats.Tolerance.row_atol``)."""
    graph = bundle.mode_graph(mode)
    rows = ref.feeds.ordinary & ref.feeds.finite
    largest = 0.0
    for head in bundle.contract(graph).action.heads:  # type: ignore[arg-type]
        scores = np.asarray(ref.outputs.get(graph, {}).get(head, np.zeros(0)), np.float64)  # type: ignore[call-overload]
        if scores.ndim >= 1 and scores.shape[0] == len(rows) and rows.any():
            finite = scores[rows]
            largest = max(largest, float(np.abs(finite[np.isfinite(finite)]).max(initial=0.0)))
    return largest
