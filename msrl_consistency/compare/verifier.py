"""The consistency check: seeded observations and seeded episodes through every runtime vs the reference.

The reference is the training path (``ms-cell``), or a golden file recorded from it on another machine.
Every comparison becomes a ``Check`` with a status, the worst numbers and, on failure, a diagnosis.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from inference.bundle import Bundle, BundleError, sha256_file
from msrl_consistency.compare import episodes as E
from msrl_consistency.compare import policy_level as P
from msrl_consistency.compare.diagnose import diagnose
from msrl_consistency.compare.feeds import Feeds, edge_observations, sample_observations
from msrl_consistency.compare.stats import TOLERANCE_PRESETS, Tolerance, compare_arrays, tolerance_for
from msrl_consistency.errors import MsrlError, RuntimeUnavailable, UsageError
from msrl_consistency.runtimes.base import Runtime, RuntimeSource
from msrl_consistency.runtimes.registry import REFERENCE, RUNTIMES, create

REPORT_SCHEMA = "msrl-consistency/verify-report"
REPORT_SCHEMA_VERSION = 1
OBS_STREAM = 17
GRAPHS = ("policy", "policy_sample")


@dataclass
class VerifyOptions:
    observations: int = 10_000
    episodes: int = 20
    seed: int = 0
    tolerance: str | None = None  # preset; default: the bundle's precision
    overrides: dict[str, Tolerance] = field(default_factory=dict)  # output name -> tolerance
    runtimes: list[str] | None = None  # None: every registered runtime that is available
    required: list[str] = field(default_factory=list)
    device: str = "cpu"
    device_id: int = 0


@dataclass
class Check:
    runtime: str
    name: str
    status: str  # pass | fail | warn | skip
    summary: str
    metrics: dict[str, Any] = field(default_factory=dict)
    diagnosis: dict[str, str] | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Reference:
    """Reference outputs: from the training path, or loaded from a golden file."""

    feeds: Feeds
    det: dict[str, np.ndarray]
    sto: dict[str, np.ndarray]
    traces: dict[str, E.EpisodeTrace]  # "deterministic" | "stochastic"
    episode_noise: np.ndarray
    param_without_norm: np.ndarray | None = None
    origin: str = REFERENCE


@dataclass
class VerifyResult:
    bundle: Bundle
    options: VerifyOptions
    checks: list[Check]
    runtimes: dict[str, dict[str, Any]]
    reference: Reference
    episode_diffs: dict[str, dict[str, np.ndarray]]  # runtime -> mode -> per-step max action diff

    @property
    def failed(self) -> list[Check]:
        return [c for c in self.checks if c.status == "fail"]

    @property
    def exit_code(self) -> int:
        return 1 if self.failed else 0


# -- reference ----------------------------------------------------------------------------------------
def _policy_fn(runtime_det: Runtime, runtime_sto: Runtime) -> E.Policy:
    """(obs, noise | None) -> env actions, through the deterministic or the sampling graph."""

    def act(obs: np.ndarray, noise: np.ndarray | None) -> np.ndarray:
        if noise is None:
            return runtime_det.infer(obs)["action"]
        return runtime_sto.infer(obs, noise)["action"]

    return act


def build_reference(bundle: Bundle, source: RuntimeSource, options: VerifyOptions) -> tuple[Reference, Runtime]:
    det, sto = create(REFERENCE, source, "policy").open(), create(REFERENCE, source, "policy_sample").open()
    try:
        horizon = E.max_episode_steps(bundle.env_id)
        noise = E.episode_noise(bundle, options.episodes, horizon, options.seed)
        act = _policy_fn(det, sto)
        traces = {
            "deterministic": E.run_episodes(bundle.env_id, act, options.episodes, options.seed, None, bundle.discrete),
            "stochastic": E.run_episodes(bundle.env_id, act, options.episodes, options.seed, noise, bundle.discrete),
        }
        feeds = _observations(bundle, traces["deterministic"], options)
        ref_det, ref_sto = det.infer(feeds.obs), sto.infer(feeds.obs, feeds.noise)
        # What the policy would output without its normalisation: evidence for the preprocessing diagnosis.
        normalizer = det.policy.normalizer  # type: ignore[attr-defined]
        without_norm = None
        if normalizer.enabled:
            normalizer.enabled = False
            try:
                without_norm = det.infer(feeds.obs)[det.outputs[1].name]
            finally:
                normalizer.enabled = True
        return Reference(feeds, ref_det, ref_sto, traces, noise, without_norm), det
    finally:
        sto.close()


def _observations(bundle: Bundle, trace: E.EpisodeTrace, options: VerifyOptions) -> Feeds:
    """A third from visited states (when available), the rest sampled, edge cases and NaN rows last."""
    rng = np.random.default_rng([options.seed, OBS_STREAM])
    visited = trace.obs[trace.alive]
    n_visit = min(len(visited), options.observations // 3)
    pick = visited[rng.choice(len(visited), n_visit, replace=False)] if n_visit else visited[:0]
    sampled = sample_observations(bundle, options.observations - n_visit, rng)
    nan_rows = edge_observations(bundle)[:2].copy()
    nan_rows[0, :] = np.nan
    nan_rows[1, 0] = np.nan
    obs = np.concatenate([pick.astype(np.float32), sampled.obs, nan_rows])
    source = np.concatenate([np.array(["episode"] * n_visit), sampled.source, np.array(["nan"] * 2)])
    return Feeds(obs, source, bundle.sample_noise(rng, len(obs)))


# -- the run --------------------------------------------------------------------------------------------
def verify(
    bundle: Bundle,
    checkpoint: Path | None,
    options: VerifyOptions,
    reference: Reference | None = None,
    extra_runtimes: dict[str, tuple[Runtime, Runtime]] | None = None,
    progress: Callable[[str], None] = lambda _msg: None,
) -> VerifyResult:
    """Compare every selected runtime against ``reference`` (built from ``checkpoint`` when not given)."""
    preset = options.tolerance or bundle.manifest["precision"]
    if preset not in TOLERANCE_PRESETS:
        raise UsageError(f"unknown tolerance preset {preset!r}; choose {', '.join(TOLERANCE_PRESETS)}")
    source = RuntimeSource(bundle, checkpoint, options.device, options.device_id)
    for name in options.required:  # fail fast, before minutes of comparisons
        if name not in RUNTIMES:
            raise UsageError(f"unknown runtime {name!r}; choose from {', '.join(RUNTIMES)}")
        reason = RUNTIMES[name].why_not(source)
        if reason:
            raise RuntimeUnavailable(f"required runtime {name} is unavailable: {reason}")
    checks: list[Check] = []
    runtimes: dict[str, dict[str, Any]] = {}
    checks.append(_env_check(bundle, options))
    checkpoint_matches = None
    if checkpoint is not None and checkpoint.is_file():
        checkpoint_matches = sha256_file(checkpoint) == bundle.manifest["source"]["checkpoint_sha256"]
        checks.append(
            Check(
                "bundle",
                "provenance",
                "pass" if checkpoint_matches else "fail",
                "bundle exported from this checkpoint"
                if checkpoint_matches
                else "bundle was exported from a different checkpoint (sha256 differs)",
                {"checkpoint": str(checkpoint)},
            )
        )
    ref_runtime = None
    if reference is None:
        reason = RUNTIMES[REFERENCE].why_not(source)
        if reason:
            raise RuntimeUnavailable(f"reference {REFERENCE}: {reason}")
        progress(f"reference {REFERENCE}: {options.episodes} episodes per mode, {options.observations} observations")
        reference, ref_runtime = build_reference(bundle, source, options)
        runtimes[REFERENCE] = {"status": "reference", "versions": ref_runtime.versions()}
    names = options.runtimes or [n for n in RUNTIMES if n != REFERENCE]
    names += [n for n in options.required if n not in names]
    for name in names:
        if name not in RUNTIMES:
            raise UsageError(f"unknown runtime {name!r}; choose from {', '.join(RUNTIMES)}")
    episode_diffs: dict[str, dict[str, np.ndarray]] = {}
    pairs: dict[str, tuple[Runtime, Runtime] | str] = {}
    for name in names:
        if name == REFERENCE and reference.origin == REFERENCE:
            continue
        reason = RUNTIMES[name].why_not(source)
        pairs[name] = reason if reason else (create(name, source, "policy"), create(name, source, "policy_sample"))
    pairs.update(extra_runtimes or {})
    for name, pair in pairs.items():
        started = time.perf_counter()
        if isinstance(pair, str):
            runtimes[name] = {"status": "unavailable", "reason": pair}
            checks.append(Check(name, "available", "skip", f"unavailable: {pair}"))
            progress(f"{name}: unavailable")
            continue
        runtimes[name] = _check_runtime(
            name, pair, bundle, reference, preset, options, checks, episode_diffs, checkpoint_matches
        )
        progress(f"{name}: {runtimes[name]['status']} ({time.perf_counter() - started:.1f} s)")
    if ref_runtime is not None:
        ref_runtime.close()
    checks.extend(_version_checks(bundle, runtimes))
    return VerifyResult(bundle, options, checks, runtimes, reference, episode_diffs)


def _env_check(bundle: Bundle, options: VerifyOptions) -> Check:
    problem = E.check_env_determinism(bundle.env_id, options.seed)
    if problem:
        return Check("env", "env_determinism", "warn", problem + "; episode checks compare only up to divergence")
    return Check("env", "env_determinism", "pass", f"{bundle.env_id} reproduces a seeded trajectory exactly")


def _check_runtime(
    name: str,
    pair: tuple[Runtime, Runtime],
    bundle: Bundle,
    ref: Reference,
    preset: str,
    options: VerifyOptions,
    checks: list[Check],
    episode_diffs: dict[str, dict[str, np.ndarray]],
    checkpoint_matches: bool | None,
) -> dict[str, Any]:
    from msrl_consistency.runtimes.lite import IncompatibleModel

    det, sto = pair
    try:
        det.open()
        sto.open()
    except IncompatibleModel as exc:
        status = "fail" if name in options.required else "warn"
        checks.append(
            Check(
                name,
                "version_contract",
                status,
                str(exc),
                diagnosis={"stage": "version", "detail": "the format is newer than this runtime reads"},
            )
        )
        return {"status": "incompatible", "reason": str(exc)}
    except (MsrlError, BundleError) as exc:
        checks.append(Check(name, "load", "fail", str(exc)))
        return {"status": "error", "reason": str(exc)}
    try:
        tol_default = tolerance_for(preset, name)
        tol = {o.name: options.overrides.get(o.name, tol_default) for o in det.outputs + sto.outputs}
        info = {"status": "ran", "versions": det.versions(), "tolerance": {k: v.to_dict() for k, v in tol.items()}}
        got_det = det.infer(ref.feeds.obs)
        got_sto = sto.infer(ref.feeds.obs, ref.feeds.noise)
        det_check, det_cmp = _compare_outputs(name, "observations.policy", ref.det, got_det, tol, ref.feeds)
        sto_check, sto_cmp = _compare_outputs(name, "observations.policy_sample", ref.sto, got_sto, tol, ref.feeds)
        _policy_metrics(bundle, ref, got_det, got_sto, det_check, sto_check)
        checks += [det_check, sto_check, _nan_check(name, ref, got_det, got_sto)]
        param = det.outputs[1].name
        det_param_ok = det_cmp[param].passed
        det_action_ok = det_cmp["action"].passed
        if det_check.status == "fail" or sto_check.status == "fail":
            diag = diagnose(
                det_param_ok=det_param_ok,
                det_action_ok=det_action_ok,
                sample_ok=sto_check.status != "fail",
                value_ok=sto_cmp["value"].passed,
                got_param=got_det[param],
                param_without_norm=ref.param_without_norm,
                got_action=got_det["action"],
                unscaled_action=None if bundle.discrete else ref.det[param],
                max_rel_param=det_cmp[param].max_rel,
                cosine_param=det_cmp[param].cosine,
                bundle_precision=bundle.manifest["precision"],
                checkpoint_matches=checkpoint_matches,
            ).to_dict()
            for c in (det_check, sto_check):
                if c.status == "fail":
                    c.diagnosis = diag
        act = _policy_fn(det, sto)
        episode_diffs[name] = {}
        atol = tol["action"].atol
        for mode, trace in ref.traces.items():
            noise = ref.episode_noise if mode == "stochastic" else None
            teacher = _teacher_forced(name, mode, trace, act, noise, bundle.discrete, atol)
            checks.append(teacher)
            own = E.run_episodes(bundle.env_id, act, options.episodes, options.seed, noise, bundle.discrete)
            diff = E.action_differences(trace, own, bundle.discrete, atol)
            episode_diffs[name][mode] = diff["per_step_max"]
            checks.append(_free_running_check(name, mode, diff, trace, teacher.status == "pass"))
        return info
    except MsrlError as exc:
        checks.append(Check(name, "inference", "fail", str(exc)))
        return {"status": "error", "reason": str(exc)}
    finally:
        det.close()
        sto.close()


def _compare_outputs(
    runtime: str,
    check: str,
    ref: dict[str, np.ndarray],
    got: dict[str, np.ndarray],
    tol: dict[str, Tolerance],
    feeds: Feeds,
) -> tuple[Check, dict[str, Any]]:
    finite = ~np.isnan(feeds.obs).any(1)  # NaN rows are checked separately (argmax of NaN is undefined)
    cmps = {k: compare_arrays(k, ref[k][finite], got[k][finite], tol[k]) for k in ref}
    failed = [c for c in cmps.values() if not c.passed]
    worst = max(cmps.values(), key=lambda c: c.max_abs)
    summary = (
        f"{len(failed)} output(s) differ: "
        + ", ".join(f"{c.name} {c.mismatches}/{c.count} (max abs {c.max_abs:.2e})" for c in failed)
        if failed
        else f"{int(finite.sum())} observations agree; worst {worst.name} max abs {worst.max_abs:.2e}"
    )
    metrics = {"outputs": {k: c.to_dict() for k, c in cmps.items()}}
    return Check(runtime, check, "fail" if failed else "pass", summary, metrics), cmps


def _policy_metrics(
    bundle: Bundle, ref: Reference, got_det: dict, got_sto: dict, det_check: Check, sto_check: Check
) -> None:
    finite = ~np.isnan(ref.feeds.obs).any(1)
    param = "logits" if bundle.discrete else "mean"
    r_param, g_param = ref.det[param][finite], got_det[param][finite]
    if bundle.discrete:
        det_check.metrics["argmax"] = P.argmax_flips(
            r_param, g_param, ref.det["action"][finite], got_det["action"][finite]
        )
        kl = P.categorical_kl(r_param, g_param)
    else:
        kl = P.gaussian_kl(r_param, g_param, np.asarray(bundle.manifest["gaussian_log_std"]))
    det_check.metrics["kl"] = P.summarize(kl)
    ra, ga = ref.sto["action"][finite], got_sto["action"][finite]
    agree = (ra == ga) if bundle.discrete else np.all(np.isclose(ra, ga, atol=1e-5, rtol=1e-5), axis=-1)
    dlogp = np.abs(ref.sto["log_prob"][finite].astype(np.float64) - got_sto["log_prob"][finite])
    sto_check.metrics["action_agreement"] = float(agree.mean())
    sto_check.metrics["abs_delta_log_prob"] = P.summarize(dlogp)


def _nan_check(runtime: str, ref: Reference, got_det: dict, got_sto: dict) -> Check:
    rows = np.isnan(ref.feeds.obs).any(1)
    mismatched = []
    for outs, ref_outs in ((got_det, ref.det), (got_sto, ref.sto)):
        for k, v in outs.items():
            if v.dtype.kind != "f":
                continue
            if not np.array_equal(np.isnan(v[rows]), np.isnan(ref_outs[k][rows])):
                mismatched.append(k)
    # NaN observations are invalid input: a runtime that handles them differently is flagged, not failed.
    status = "warn" if mismatched else "pass"
    summary = (
        f"NaN observations propagate differently in {', '.join(sorted(set(mismatched)))} (e.g. Clip maps NaN "
        "to a bound)"
        if mismatched
        else f"{int(rows.sum())} NaN observations propagate as in the reference (flagged; actions undefined)"
    )
    return Check(runtime, "nan_propagation", status, summary)


def _teacher_forced(runtime, mode, trace: E.EpisodeTrace, act, noise, discrete: bool, atol: float) -> Check:
    """Both paths act on the reference's observation stream; compare the chosen actions step by step."""
    got = np.stack([act(trace.obs[t], None if noise is None else noise[t]) for t in range(len(trace.obs))])
    if discrete:
        diff = (got != trace.actions) & trace.alive
    else:
        diff = (np.abs(got - trace.actions).reshape(*trace.alive.shape, -1).max(-1) > atol) & trace.alive
    steps = np.flatnonzero(diff.any(1))
    first = int(steps[0]) if len(steps) else None
    metrics = {"differing_actions": int(diff.sum()), "first_divergent_step": first, "steps": int(trace.alive.sum())}
    status = "fail" if diff.any() else "pass"
    summary = (
        f"{int(diff.sum())} of {int(trace.alive.sum())} actions differ, first at step {first}"
        if diff.any()
        else f"all {int(trace.alive.sum())} actions agree on the reference's observations"
    )
    return Check(runtime, f"episodes.teacher_forced.{mode}", status, summary, metrics)


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
    if not diff["episodes_diverged"]:
        return Check(
            runtime, f"episodes.free_running.{mode}", "pass", f"{len(delta)} episodes match the reference step by step",
            metrics,
        )  # fmt: skip
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
        return Check(runtime, f"episodes.free_running.{mode}", "warn", summary, metrics)
    return Check(runtime, f"episodes.free_running.{mode}", "fail", summary, metrics)


def _version_checks(bundle: Bundle, runtimes: dict[str, dict[str, Any]]) -> list[Check]:
    """The bundle's exporter versions against each runtime's: a mismatched MindSpore major.minor is flagged."""
    exporter = bundle.manifest["exporter"]
    checks = []
    for name, info in runtimes.items():
        ms_version = info.get("versions", {}).get("mindspore")
        if (
            ms_version
            and exporter.get("mindspore")
            and ms_version.split(".")[:2] != exporter["mindspore"].split(".")[:2]
        ):
            checks.append(
                Check(
                    name,
                    "version_contract",
                    "warn",
                    f"exported with MindSpore {exporter['mindspore']}, running {ms_version}",
                )
            )
    return checks


# -- golden files -------------------------------------------------------------------------------------
def save_golden(path: Path, result: VerifyResult) -> None:
    """Inputs, reference outputs and episode traces in one portable .npz (plus the manifest hash)."""
    ref, bundle = result.reference, result.bundle
    arrays: dict[str, np.ndarray] = {
        "obs": ref.feeds.obs,
        "source": ref.feeds.source.astype("U8"),
        "noise": ref.feeds.noise,
        "episode_noise": ref.episode_noise,
    }
    arrays.update({f"det/{k}": v for k, v in ref.det.items()})
    arrays.update({f"sto/{k}": v for k, v in ref.sto.items()})
    for mode, trace in ref.traces.items():
        for field_name in ("obs", "actions", "rewards", "alive"):
            arrays[f"trace/{mode}/{field_name}"] = getattr(trace, field_name)
    meta = {
        "env_id": bundle.env_id,
        "seed": result.options.seed,
        "episodes": result.options.episodes,
        "manifest_sha256": sha256_file(bundle.root / "manifest.json"),
    }
    arrays["meta"] = np.array(json.dumps(meta))
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp.npz")
    np.savez_compressed(tmp, **arrays)
    tmp.replace(path)


def load_golden(path: Path, bundle: Bundle, options: VerifyOptions) -> Reference:
    if not path.is_file():
        raise UsageError(f"golden file not found: {path}")
    try:
        data = np.load(path, allow_pickle=False)
        meta = json.loads(str(data["meta"]))
    except (OSError, ValueError, KeyError) as exc:
        raise UsageError(f"{path} is not a golden file written by verify --save-golden ({exc})") from None
    if meta["env_id"] != bundle.env_id:
        raise UsageError(f"golden file is for {meta['env_id']}, the bundle for {bundle.env_id}")
    options.seed, options.episodes = meta["seed"], meta["episodes"]
    traces = {
        mode: E.EpisodeTrace(*(data[f"trace/{mode}/{f}"] for f in ("obs", "actions", "rewards", "alive")))
        for mode in ("deterministic", "stochastic")
    }
    feeds = Feeds(data["obs"], data["source"], data["noise"])
    det = {k.split("/", 1)[1]: data[k] for k in data.files if k.startswith("det/")}
    sto = {k.split("/", 1)[1]: data[k] for k in data.files if k.startswith("sto/")}
    return Reference(feeds, det, sto, traces, data["episode_noise"], None, origin=f"golden:{path.name}")
