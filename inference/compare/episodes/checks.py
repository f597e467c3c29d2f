"""Episode verdicts: teacher-forced replay (the runtime acts on the reference's observations, step by step) and
free-running replay (it drives its own env), judged as the tolerance preset promises."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from inference.bundle import Bundle
from inference.bundle.contract import PolicyContract
from inference.compare import episodes as E
from inference.compare.checks import Check
from inference.compare.judge.stats import Preset, Tolerance, flip_bound, ks_two_sample


def near_ties(
    top2: np.ndarray | None, tolerance: Mapping[str, Tolerance], bundle: Bundle, mode: str, ordinary_magnitude: float
) -> np.ndarray | None:
    """Per step (and head, for several heads: ``[T, K, heads]``), whether a differing discrete action is a near-tie
    within the tolerance granted to the scores (None: the policy has no discrete scores, so nothing is forgiven).
    Episode steps are ordinary rows: their atol grows with the largest magnitude among the ordinary rows of the
    scores (``ordinary_magnitude``), or their own if larger, as on the observations (``stats.Tolerance.row_atol``)."""
    if top2 is None:
        return None
    action = bundle.contract(bundle.mode_graph(mode)).action  # type: ignore[arg-type]
    heads = action.heads
    per_head = top2 if top2.ndim == 4 else top2[..., None, :]
    ties = []
    for h, head in enumerate(heads):
        t = per_head[..., h, :]
        tol = tolerance[head]
        row_max = t[..., 3] if t.shape[-1] > 2 else t[..., 1]
        row_atol = tol.atol + tol.scale * np.maximum(row_max, ordinary_magnitude)
        ties.append(t[..., 0] <= flip_bound(t, tol, row_atol, probabilities=action.probs is not None))
    return ties[0] if top2.ndim == 3 else np.stack(ties, -1)


def teacher_forced_check(
    runtime: str, mode: str, trace: E.EpisodeTrace, policy: E.Policy, noise: np.ndarray | None, atol: float,
    near_tie: np.ndarray | None = None, max_rate: float = 0.0, tolerance: Mapping[str, Tolerance] | None = None,
) -> Check:  # fmt: skip
    """The runtime acts on the reference's observation stream; compare the chosen actions step by step.

    ``near_tie`` (discrete actions; per head for several heads): where a differing action is forgiven, in at most
    ``max_rate`` of the steps. A policy that carries state is fed its own previous state; the first step where that
    state leaves the reference's by more than its ``next`` output's ``tolerance`` is reported, and fails the check.
    """
    got, states = E.teacher_forced_actions(trace, policy, noise)
    discrete = policy.contract.action.is_discrete
    if discrete:
        differs = (trace.actions != got).reshape(*trace.alive.shape, -1) & trace.alive[..., None]
        diff = differs.any(-1)
        ties = None if near_tie is None else (near_tie if near_tie.ndim == 3 else near_tie[..., None])
        forgiven = diff & (~differs | ties).all(-1) if ties is not None else np.zeros_like(diff)
        magnitude = ""
    else:
        moved = np.where(trace.alive, E.step_differences(trace.actions, got, discrete), 0.0)
        diff = (moved > atol) & trace.alive
        forgiven = np.zeros_like(diff)
        largest = float(moved.max(initial=0.0))
        magnitude = f" by more than {atol:.1e} (max |diff| {largest:.2e})"
    unexplained = diff & ~forgiven
    steps = np.flatnonzero(diff.any(1))
    first = int(steps[0]) if len(steps) else None
    alive = int(trace.alive.sum())
    metrics = {"differing_actions": int(diff.sum()), "near_ties_forgiven": int(forgiven.sum()),
               "first_divergent_step": first, "steps": alive,
               "bitwise_equal": bool(np.array_equal(got, trace.actions))}  # fmt: skip
    if not discrete:
        metrics.update(max_abs_action_diff=largest, action_atol=atol)
    name = f"episodes.teacher_forced.{mode}"
    drift = state_divergence(policy.contract, trace, states, tolerance or {})
    if drift:
        metrics["state"] = drift
    state_note = ""
    if drift.get("first_divergent_step") is not None:
        state_note = (f"; state {drift['state']} first leaves the reference's beyond tolerance at step "
                      f"{drift['first_divergent_step']} (max |diff| {drift['max_abs']:.2e})")  # fmt: skip
    if not diff.any() and not state_note:
        agree = f"all {alive} actions agree on the reference's observations"
        agree += f" (max |diff| {largest:.2e})" if not discrete else ""
        agree += f", and the carried state within tolerance (max |diff| {drift['max_abs']:.2e})" if drift else ""
        return Check(runtime, name, "pass", agree, metrics)
    summary = f"{int(diff.sum())} of {alive} actions differ" + (magnitude if diff.any() else "")
    if discrete and diff.any():
        summary += f" ({int(forgiven.sum())} at near-ties of the reference's scores)"
    summary += f", first at step {first}" if diff.any() else ""
    if not unexplained.any() and forgiven.sum() <= max_rate * alive and not state_note:
        summary += "; every one at a near-tie of the reference's scores (allowed by the preset)"
        return Check(runtime, name, "pass", summary, metrics)
    return Check(runtime, name, "fail", summary + state_note, metrics)


def state_divergence(
    contract: PolicyContract, trace: E.EpisodeTrace, states: np.ndarray | None, tolerance: Mapping[str, Tolerance]
) -> dict:
    """Where a runtime's own carried state (fed back step after step) leaves the reference's: per state, the first
    step any live episode's state is off by more than the ``next`` output's tolerance (atol growing with the
    largest magnitude of the reference's state, or rtol), and the largest difference. Empty without states."""
    if states is None or trace.states is None:
        return {}
    worst: dict = {"first_divergent_step": None, "max_abs": 0.0, "state": None}
    for s in contract.states:
        ref = np.asarray(trace.states[s.name], np.float64)
        got = np.asarray(states[s.name], np.float64)
        tol = tolerance.get(s.next)
        diff = np.abs(got - ref).reshape(*trace.alive.shape, -1)
        live = diff[trace.alive]
        worst["max_abs"] = max(worst["max_abs"], float(live.max()) if live.size else 0.0)
        if tol is None:
            continue
        atol = tol.atol + tol.scale * float(np.abs(ref).max(initial=0.0))
        beyond = ((diff > atol) & (diff > tol.rtol * np.abs(ref).reshape(diff.shape))).any(-1) & trace.alive
        if beyond.any():
            step = int(np.flatnonzero(beyond.any(1))[0])
            if worst["first_divergent_step"] is None or step < worst["first_divergent_step"]:
                worst.update(first_divergent_step=step, state=s.name)
    return worst


def free_running_check(
    runtime: str, mode: str, diff: dict, trace: E.EpisodeTrace, own: E.EpisodeTrace, teacher_ok: bool, preset: Preset,
    near_tie: np.ndarray | None = None,
) -> Check:  # fmt: skip
    """Each path drives its own env.

    ``exact`` presets: divergence is a failure unless it is explained while the teacher-forced check agrees: the
    env amplifying differences below tolerance (observations drifted first), or a discrete action that flipped at
    a near-tie within the scores' tolerance (``near_tie``, per reference step), after which the episodes part
    ways. ``returns`` presets judge the distribution of episode returns instead.
    """
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
        "returns": own.returns.tolist(),
    }
    if mode == "deterministic" or diff["episodes_diverged"]:  # one overlay per runtime, and any that parts ways
        metrics["trajectory"] = trajectory(trace, own, diff["first_divergent_step"])
    name = f"episodes.free_running.{mode}"
    if not diff["episodes_diverged"]:
        return Check(runtime, name, "pass", f"{len(delta)} episodes match the reference step by step", metrics)
    summary = (
        f"{diff['episodes_diverged']} of {len(delta)} episodes diverge (first at step {min(first) if first else '?'}), "
        f"max |return delta| {metrics['max_abs_return_delta']:.3g}, mean {metrics['mean_return_delta']:+.3g}"
    )
    if preset.free_running == "returns":
        return returns_check(runtime, name, summary, metrics, trace.returns, own.returns, preset)
    firsts = diff["first_divergent_step"]
    diverged = [k for k, f in enumerate(firsts) if f is not None]
    at_tie = [_flipped_at_a_tie(near_tie, trace, own, firsts[k], k) for k in diverged]
    amplified = [diff["amplified"][k] for k in diverged]
    if teacher_ok and diverged and all(a or t for a, t in zip(amplified, at_tie, strict=True)):
        if any(amplified):
            summary += (f"; observations drifted first (step {min(drift)}) from action differences below tolerance "
                        "and the teacher-forced check agrees: the env amplifies them (chaotic dynamics)")  # fmt: skip
        if any(at_tie):
            summary += ("; an action flipped at a near-tie within the tolerance of the scores and the teacher-forced "
                        "check agrees: the episodes part ways there")  # fmt: skip
        return Check(runtime, name, "warn", summary + ", not a policy mismatch", metrics)
    return Check(runtime, name, "fail", summary, metrics)


TRAJECTORY_STEPS = 150  # the report's overlaid episode: this many steps, from a little before the parting


def trajectory(ref: E.EpisodeTrace, own: E.EpisodeTrace, firsts: list[int | None]) -> dict:
    """One episode, the reference's and the runtime's, for the report's overlay: the first to diverge (else
    episode 0), on ``TRAJECTORY_STEPS`` steps starting a quarter of them before the first divergent step (else
    from the start); the observation dimension that parts most against its own step-to-step movement, the first
    action dimension, and the steps where the actions differ (at most 50). An observation that is not a flat
    float vector (a Dict, an image) is left out."""
    diverged = [(f, k) for k, f in enumerate(firsts) if f is not None]
    k = min(diverged)[1] if diverged else 0
    steps = int(min(len(ref.alive), len(own.alive)))
    if not steps or k >= ref.alive.shape[1]:
        return {}
    length = int(max(ref.alive[:steps, k].sum(), own.alive[:steps, k].sum()))
    first = firsts[k] if k < len(firsts) else None
    lo = max(0, min(length - TRAJECTORY_STEPS, (first or 0) - TRAJECTORY_STEPS // 4))
    at = np.arange(lo, min(length, lo + TRAJECTORY_STEPS))
    out: dict = {"episode": k, "steps": length, "first_divergent_step": first, "step": at.tolist()}
    act_r = np.asarray(ref.actions[:length, k]).reshape(length, -1)
    act_g = np.asarray(own.actions[:length, k]).reshape(length, -1)
    if act_r.dtype.names is None and act_r.shape == act_g.shape and act_r.size:
        out["action_differs_at"] = np.flatnonzero((act_r != act_g).any(1))[:50].tolist()
        out["action"] = {"reference": _rounded(act_r[at, 0]), "runtime": _rounded(act_g[at, 0])}
    obs_r, obs_g = np.asarray(ref.obs[:length, k]), np.asarray(own.obs[:length, k])
    if obs_r.dtype.names is None and obs_r.dtype.kind == "f" and obs_r.ndim == 2 and obs_r.shape == obs_g.shape:
        r, g = obs_r[at].astype(np.float64), obs_g[at].astype(np.float64)
        with np.errstate(invalid="ignore"):
            gap = np.nan_to_num(np.abs(r - g), nan=np.inf).max(0)
            jitter = np.abs(np.diff(r, axis=0)).mean(0) if len(at) > 1 else np.ones_like(gap)
        d = int(np.argmax(gap / (np.nan_to_num(jitter) + 1e-9))) if gap.max() > 0 else 0
        out["observation"] = {"dimension": d, "reference": _rounded(r[:, d]), "runtime": _rounded(g[:, d])}
    return out


def _rounded(values: np.ndarray) -> list[float]:
    """Six significant digits: a chart's precision, a third of the digits in report.json."""
    return [float(f"{v:.6g}") for v in np.asarray(values, np.float64)]


def _flipped_at_a_tie(
    near_tie: np.ndarray | None, trace: E.EpisodeTrace, own: E.EpisodeTrace, step: int, k: int
) -> bool:  # fmt: skip
    """Whether episode ``k`` parted ways at ``step`` only through heads that flipped at a near-tie: every head that
    differs there (both runs saw the same observations up to that step)."""
    if near_tie is None or step >= len(near_tie):
        return False
    ties = np.atleast_1d(near_tie[step, k]).reshape(-1)
    differs = np.atleast_1d(np.asarray(trace.actions[step, k]) != np.asarray(own.actions[step, k])).reshape(-1)
    return differs.shape == ties.shape and bool(differs.any() and (~differs | ties).all())


# A mean return this far beyond the preset's bound (4x: 20% of the scale under a 5% bound) fails whatever the noise of
# the paired episodes: no lowered precision is allowed to solve the task that much worse, however few episodes ran.
RETURN_GAP_CAP = 4.0


def returns_check(
    runtime: str, name: str, summary: str, metrics: dict, ref: np.ndarray, got: np.ndarray, preset: Preset
) -> Check:
    """Reduced precision: episodes may part ways, the task may not be solved worse (mean and distribution).

    The episodes are paired (same env seeds, same noise): a mean beyond the preset's bound fails when the paired
    differences say it is more than their noise (3 standard errors), and always beyond ``RETURN_GAP_CAP`` times the
    bound. Between the two the run is too short to tell: that is not a pass but an error (could not judge: exit 3),
    naming how many paired episodes would decide."""
    ref_mean, got_mean = float(np.mean(ref)), float(np.mean(got))
    bound = preset.return_tolerance * max(abs(ref_mean), float(np.std(ref)), 1.0)
    ks, p_value = ks_two_sample(ref, got)
    deltas = np.asarray(got, np.float64) - np.asarray(ref, np.float64)
    spread = float(np.std(deltas, ddof=1)) if len(deltas) > 1 else np.inf
    noise = 3.0 * spread / np.sqrt(len(deltas)) if len(deltas) > 1 else np.inf
    metrics.update({"mean_return": got_mean, "reference_mean_return": ref_mean, "mean_return_bound": bound,
                    "mean_return_noise": noise, "ks_statistic": ks, "ks_p_value": p_value})  # fmt: skip
    verdict = f"; mean return {got_mean:.4g} vs {ref_mean:.4g} (bound ±{bound:.3g}), KS p = {p_value:.2f}"
    moved = abs(got_mean - ref_mean)
    if p_value < preset.ks_alpha or (moved > bound and (moved > noise or moved > RETURN_GAP_CAP * bound)):
        return Check(runtime, name, "fail", summary + verdict, metrics)
    if moved <= bound:
        return Check(runtime, name, "pass", summary + verdict + f": the same returns, as the {preset.name} preset "
                     "judges episodes", metrics)  # fmt: skip
    # 3 * spread / sqrt(n) < moved decides: the paired episodes that would tell this move from their noise
    needed = int(np.ceil((3.0 * spread / moved) ** 2)) + 1 if np.isfinite(spread) else None
    metrics["episodes_to_decide"] = needed
    return Check(
        runtime,
        name,
        "error",
        summary + verdict + f": beyond the bound but within the noise of "
        f"{len(deltas)} paired episodes (3 standard errors of their differences: {noise:.3g}), so not "
        f"judged; about {needed or 'more'} episodes (--episodes) would decide",
        metrics,
    )
