"""The consistency check, start to finish: validate → reference → every runtime → versions → result.

After Polygraphy's split: *inputs* (``reference.Inputs``: an env or recorded observations), *runners*
(``runtimes``), *comparison* (``runtime_check``) and *report* (``inference.report``). Nothing here
knows whose policy it is: the bundle's contracts say how outputs become actions, and the caller provides
the policy Cells (``RuntimeSource.cells``) that make up the training path.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from pathlib import Path

import numpy as np

from inference.bundle import MODES, Bundle, sha256_file
from inference.bundle.plan_claims import check_plan
from inference.bundle.spaces import check_env_spaces
from inference.compare import episodes as E
from inference.compare.acting import available_modes
from inference.compare.batches import infer_feeds
from inference.compare.checks import Check, VerifyResult
from inference.compare.device_precision import (
    LITE_RUNTIMES,
    Judgement,
    emulation_wanted,
    judgement,
    runtime_precision,
)
from inference.compare.feeds import seeded_feeds
from inference.compare.inputs import Inputs
from inference.compare.judge.diagnose import name_lowered_precision
from inference.compare.judge.localize import Localization, Localizer
from inference.compare.judge.stats import Tolerance, ulp_distance
from inference.compare.options import LOCALIZE_STAGES, VerifyOptions
from inference.compare.reference import REFERENCE, Reference, build_reference
from inference.compare.runtime_check import IN_GRAPH_RANDOMNESS, RuntimeReport, check_runtime
from inference.compare.versions import version_checks
from inference.errors import INTERRUPTS, RuntimeUnavailable, UsageError, first_line
from inference.runtimes.base import CellProvider, Runtime, RuntimeSource
from inference.runtimes.registry import RUNTIMES, create


def verify(
    bundle: Bundle,
    options: VerifyOptions,
    inputs: Inputs,
    cells: CellProvider | None = None,
    checkpoint: Path | None = None,
    reference: Reference | None = None,
    extra_runtimes: Mapping[str, Mapping[str, Runtime]] | None = None,
    progress: Callable[[str], None] = lambda _msg: None,
    localizer: Localizer | None = None,
) -> VerifyResult:
    """Compare every selected runtime against ``reference`` (built from ``cells`` on ``inputs`` when not given).

    ``checkpoint`` only feeds the provenance check (was the bundle exported from it?); ``extra_runtimes`` adds
    runtimes that are not in the registry (graph name → Runtime), e.g. a team's own deploy wrapper. ``localizer``
    (the training side's, or a golden file's recorded layers) names the first diverging layer of a runtime as
    ``options.localize`` says.
    """
    options.validate(bundle)
    check_plan(bundle)  # what a precision plan says of the files is true of them, before they are judged (exit 2)
    default = [n for n in RUNTIMES if not RUNTIMES[n].opt_in]  # opt-in runtimes (emulations) run when named
    if options.device == "ascend" and set(options.runtimes or default) & set(LITE_RUNTIMES):
        _precision_mode_named(bundle)  # Lite on Ascend runs with the bundle's precision mode, or not at all (exit 2)
    source = RuntimeSource(bundle, cells, options.device, options.device_id)
    emulate = ("emulated-fp16",) if emulation_wanted(bundle, options.emulate, options.device) else ()
    required = (*options.required, *(emulate if options.emulate else ()))
    for name in required:  # fail fast, before minutes of comparisons
        reason = RUNTIMES[name].why_not(source)
        if reason:
            raise RuntimeUnavailable(f"required runtime {name} is unavailable: {reason}")
    if inputs.env is None and inputs.recorded is None and reference is None:
        raise UsageError("no observation source: pass --env-id, --env MODULE:FACTORY or --observations-file")
    if inputs.env is not None:
        check_env_matches_contract(bundle, inputs.env)
    checks: list[Check] = []
    runtimes: dict[str, dict] = {}
    env_deterministic = False  # free-running episodes may then skip the env steps that follow the reference
    if inputs.env is not None:
        checks.append(_env_check(inputs.env, options.seed))
        env_deterministic = checks[-1].status == "pass"
    checkpoint_matches = _provenance(bundle, checkpoint, checks)
    localizations: dict[str, Localization] = {}
    twin: dict[str, Runtime] | None = None  # the compiled Cell that played the reference episodes, still open
    origin = REFERENCE if reference is None else reference.origin
    names = [n for n in (options.runtimes or default) if n != REFERENCE or origin != REFERENCE]
    names += [n for n in (*required, *emulate) if n not in names]
    blocked = {n: _blocked(RUNTIMES[n], source) for n in names}  # before the reference: it may be for nothing
    if reference is None:
        reason = RUNTIMES[REFERENCE].why_not(source)
        if reason:
            raise RuntimeUnavailable(f"reference {REFERENCE}: {reason}")
        if not extra_runtimes and all(blocked.values()):  # nothing to compare it with: exit 3 now, not minutes later
            reference = Reference(seeded_feeds(bundle, 64, options.seed), {}, {}, {}, options.seed, options.episodes,
                                  skipped_episodes="not played: no runtime to compare them with")  # fmt: skip
            runtimes[REFERENCE] = {"status": "reference", "reason": "not built: no runtime to compare it with"}
        else:
            progress(f"reference {REFERENCE}: {options.episodes} episodes per mode, {options.observations} "
                     "observations")  # fmt: skip
            keep = TWIN in (*(options.runtimes or default), *required)  # it then serves as ms-graph: compiled once
            reference, twin = _build_reference(bundle, source, inputs, options, keep)
            runtimes[REFERENCE] = {"status": "reference"}
    episode_diffs: dict[str, dict[str, np.ndarray]] = {}
    if reference.repeat_differs:
        detail = "; ".join(f"{g}: {', '.join(outs)}" for g, outs in reference.repeat_differs.items())
        checks.append(Check(REFERENCE, "repeatability", "fail", f"the policy Cell gives different outputs for the "
                            f"same input on two calls ({detail})", diagnosis=IN_GRAPH_RANDOMNESS))  # fmt: skip
        checks += [Check(n, "comparison", "skip", "skipped: the reference is not reproducible") for n in names]
        for rt in (twin or {}).values():
            rt.close()
        return VerifyResult(bundle, options, checks, runtimes, reference, episode_diffs, inputs.describe())
    checks += logits_that_are_probabilities(bundle, reference)
    if checkpoint_matches is False and localizer is not None:
        found = _checkpoint_difference(localizer, bundle, reference, checks)
        if found is not None:
            localizations[CHECKPOINT] = found
            progress(found.line())
    if reference.skipped_episodes:
        checks.append(Check("inputs", "episodes", "skip", reference.skipped_episodes))
    for mode in (set(MODES) - set(available_modes(bundle))) if not reference.skipped_episodes else ():
        kind = bundle.contract(bundle.graphs[0]).action.kind
        why = (f"every graph takes sampling noise and a {kind} action has no noise-free decision"
               if mode == "deterministic" else f"a {kind} policy takes no noise")  # fmt: skip
        checks.append(Check("inputs", f"episodes.{mode}", "skip", f"no {mode} mode: {why}"))
    selected: dict[str, Mapping[str, Runtime] | str] = {}
    for name in names:
        match blocked[name]:
            case ("failed-export", failure):  # the manifest says this format failed at export: this runtime fails
                runtimes[name] = {"status": "failed-export", "reason": failure}
                checks.append(Check(name, "export", "fail", failure, diagnosis={"stage": "runtime", "detail": failure}))
            case ("unavailable", reason):
                selected[name] = reason
            case None:
                selected[name] = twin if name == TWIN and twin else {g: create(name, source, g) for g in bundle.graphs}
    selected.update(extra_runtimes or {})
    asked = set(options.runtimes or ()) | set(required)  # named by the user: what happens to each is a check
    trained = TrainedReference(bundle, source, inputs, options, progress)
    for name, graph_runtimes in selected.items():
        INTERRUPTS.check()
        started = time.perf_counter()
        if isinstance(graph_runtimes, str):
            runtimes[name] = {"status": "unavailable", "reason": graph_runtimes}
            if name in asked:  # otherwise a fact about this machine: the report's runtimes section says it once
                checks.append(Check(name, "available", "skip", f"unavailable: {graph_runtimes}"))
            progress(f"{name}: unavailable")
            continue
        against = trained.reference_for(name) or reference
        report, judged = judge_runtime(name, graph_runtimes, bundle, against, inputs, options, name in required,
                                       checkpoint_matches, env_deterministic, asked=name in asked)  # fmt: skip
        if against is not reference:
            report.info["reference"] = trained.describe()
        runtimes[name], episode_diffs[name] = report.info, report.episode_diffs
        checks += report.checks
        progress(f"{name}: {report.info['status']} ({time.perf_counter() - started:.1f} s)")
        if localizer is not None and _wants_localization(options.localize, report, bundle, name):
            localizations[name] = _localize(localizer, bundle, reference, report, name, judged.tolerance)
            progress(localizations[name].line())
            _preprocessing_first(localizations[name], report.checks)
    if CHECKPOINT in localizations:
        _name_the_layer(localizations[CHECKPOINT], checks)
    name_lowered_precision(bundle, runtimes, checks, localizations)
    checks.extend(version_checks(bundle, runtimes))
    result = VerifyResult(bundle, options, checks, runtimes, reference, episode_diffs, inputs.describe(),
                          localizations)  # fmt: skip
    if not result.compared:
        checks.append(nothing_compared(runtimes))
    return result


class TrainedReference:
    """A bundle of a run trained in the device's numerics (its plan's ``trained``): the runtime that computes the
    plan's lowered precision is judged against the run's own Cell computing in those numerics (the training path,
    ``cells.lowered``), built once when first needed; every other runtime against the float reference."""

    def __init__(self, bundle: Bundle, source: RuntimeSource, inputs: Inputs, options: VerifyOptions,
                 progress: Callable[[str], None]) -> None:  # fmt: skip
        plan = bundle.plan or {}
        self.lower = plan.get("lower") if plan.get("trained") else None
        self.bundle, self.source, self.inputs, self.options, self.progress = bundle, source, inputs, options, progress
        self.built: Reference | None = None

    def reference_for(self, name: str) -> Reference | None:
        if self.lower is None or runtime_precision(self.bundle, name, self.options.device).preset != self.lower:
            return None
        if self.built is None:
            cells = getattr(self.source.cells, "lowered", None)
            if cells is None:
                raise UsageError(f"{self.bundle.root} was trained in {self.lower}: its lowered runtime is judged "
                                 "against the run's own Cell in those numerics; pass --ckpt RUN")  # fmt: skip
            self.progress(f"reference {REFERENCE} in {self.lower} (the training path), for {name}")
            lowered = RuntimeSource(self.bundle, cells, self.options.device, self.options.device_id)
            # Its compiled twin may differ from PyNative in the last bits of a float layer kept in fp32 (a batch's tail
            # rows): the training rollouts ran that compiled graph, and PyNative would play every episode op by op.
            self.built = reference_for(self.bundle, lowered, self.inputs, self.options, twin_ulps=TRAINED_TWIN_ULPS)
        return self.built

    def describe(self) -> str:
        return f"{REFERENCE} in {self.lower}: the run's Cell computing in the numerics it was trained in"


def judge_runtime(
    name: str, graph_runtimes: Mapping[str, Runtime], bundle: Bundle, reference: Reference, inputs: Inputs,
    options: VerifyOptions, required: bool = False, checkpoint_matches: bool | None = None,
    env_deterministic: bool = False, asked: bool = True,
) -> tuple[RuntimeReport, Judgement]:
    """One runtime judged against the reference with the verifier's bar for the precision it computes in
    (``device_precision.judgement``): the one judge of verify and of the precision plan search."""
    judged = judgement(bundle, name, options.device, options.tolerance)
    outputs = {o["name"] for g in bundle.graphs for o in bundle.graph(g)["outputs"]}
    tolerance = {o: options.overrides.get(o, judged.tolerance) for o in outputs}
    report = check_runtime(name, graph_runtimes, bundle, reference, inputs, tolerance, judged.preset, required,
                           checkpoint_matches, env_deterministic, asked=asked, policy=judged.policy)  # fmt: skip
    report.info["precision"] = judged.info
    return report, judged


def reference_for(bundle: Bundle, source: RuntimeSource, inputs: Inputs, options: VerifyOptions,
                  twin_ulps: int = 0) -> Reference:  # fmt: skip
    """The reference verify builds for ``bundle`` with ``options`` (the training path's Cells on ``inputs``);
    ``twin_ulps``: how far its compiled twin may be from PyNative to play the episodes (``_compiled_twin``)."""
    return _build_reference(bundle, source, inputs, options, keep_twin=False, twin_ulps=twin_ulps)[0]


def env_replays_seeds(env: E.EnvSource, seed: int) -> bool:
    """Whether ``env`` replays a seeded trajectory exactly (free-running episodes may then follow the reference)."""
    return _env_check(env, seed).status == "pass"


def _wants_localization(mode: str, report: RuntimeReport, bundle: Bundle, name: str) -> bool:
    if mode == "never" or report.info.get("status") != "ran":
        return False
    stages = {c.diagnosis["stage"] for c in report.checks if c.status == "fail" and c.diagnosis}
    lowered = name == "emulated-fp16" or (name == "lite" and bundle.plan is not None)  # where a precision breaks
    failed = any(c.status == "fail" for c in report.checks)
    fp16_lite = bundle.precision == "fp16" and name in ("lite", "lite-aarch64")  # where the fp16 error grows
    return mode == "always" or bool(stages & LOCALIZE_STAGES) or fp16_lite or (lowered and failed)


def _localize(
    localizer: Localizer, bundle: Bundle, reference: Reference, report: RuntimeReport, name: str, tol: Tolerance
) -> Localization:
    """The runtime's per-layer comparison, on the graph whose outputs failed (else the deciding graph) and the rows
    where its decision output differs most. A localisation that cannot run says why; it never ends the verdict."""
    failed = [c.name.split(".", 1)[1] for c in report.checks
              if c.name.startswith("observations.") and c.status == "fail"]  # fmt: skip
    graph = failed[0] if failed else bundle.mode_graph("deterministic") or bundle.graphs[0]
    rows = report.worst_rows.get(graph, np.zeros(0, int))
    if not len(rows):
        return Localization(name, None, None, [], "not localized: no ordinary observation row to run on")
    inputs = reference.feeds.graph_inputs(bundle, graph, rows)
    try:
        return localizer(name, graph, rows, inputs, tol)
    except Exception as exc:  # noqa: BLE001 - a layer search that fails is reported, the verdict stands
        return Localization(name, None, None, [], f"not localized: {first_line(exc)}", method="none")


def _preprocessing_first(found: Localization, checks: list[Check]) -> None:
    """The first diverging layer is the observation normaliser: the failures the outputs alone called "network" are
    preprocessing (a clip bound, mean or variance the graph holds otherwise than the Cell)."""
    if found.first_role != "preprocessing":
        return
    detail = (f"the first diverging layer is {found.first} ({found.first_kind}), the observation normaliser: the graph "
              "normalises or clips observations otherwise than the Cell (a changed clip bound, mean or variance)")
    for c in checks:
        if c.status == "fail" and c.diagnosis and c.diagnosis.get("stage") == "network":
            c.diagnosis = {"stage": "preprocessing", "detail": detail}


CHECKPOINT = "checkpoint"  # the localisation of a checkpoint other than the bundle's source: its differing layer


def _checkpoint_difference(
    localizer: Localizer, bundle: Bundle, reference: Reference, checks: list[Check]
) -> Localization | None:
    """The checkpoint given is not the one the bundle was exported from: its Parameters against those the bundle
    carries, layer by layer, so the provenance check names what changed (not only that the hash differs)."""
    compare = getattr(localizer, "checkpoint_difference", None)
    if compare is None:
        return None
    deciding = bundle.mode_graph("deterministic") or bundle.graphs[0]
    rows = np.flatnonzero(reference.feeds.finite & reference.feeds.ordinary)[:8]
    if not len(rows):
        rows = np.arange(min(8, len(reference.feeds)))
    found = None
    for graph in (deciding, *(g for g in bundle.graphs if g != deciding)):  # the first graph whose weights differ
        try:
            here = compare(graph, reference.feeds.graph_inputs(bundle, graph, rows))
        except Exception as exc:  # noqa: BLE001 - a comparison that cannot run is said, the verdict stands
            here = Localization(CHECKPOINT, None, None, [], f"not localized: {first_line(exc)}", method="none")
        found = found or here
        if here is not None and here.first is not None:
            found = here
            break
    if found is None:
        return None
    provenance = next(c for c in checks if c.name == "provenance")
    if found.first is not None:
        head = next(r for r in found.layers if r.scope == found.first)
        provenance.summary += (f"; first differing layer: {found.first} ({found.first_kind}), {head.note}, max abs "
                               f"{head.max_abs:.2e}")  # fmt: skip
    else:
        provenance.summary += f"; its parameters against the bundle's: {found.message}"
    provenance.metrics["first_differing_layer"] = found.first
    return found


def _name_the_layer(found: Localization, checks: list[Check]) -> None:
    """A failure diagnosed as provenance names the checkpoint's first differing layer."""
    if found.first is None:
        return
    for c in checks:
        if c.diagnosis and c.diagnosis.get("stage") == "provenance" and found.first not in c.diagnosis["detail"]:
            c.diagnosis = {**c.diagnosis, "detail": f"{c.diagnosis['detail']}; first differing layer: {found.first} "
                           f"({found.first_kind})"}  # fmt: skip


def _precision_mode_named(bundle: Bundle) -> None:
    """Lite on Ascend runs with the bundle's precision mode; a bundle naming none is refused (exit 2, one line)."""
    import platform

    from inference.bundle.precision import PrecisionModeMissing, lite_precision

    try:
        lite_precision(bundle.manifest, "ascend", platform.machine(), f"bundle {bundle.root}")
    except PrecisionModeMissing as exc:
        raise UsageError(str(exc)) from None


def logits_that_are_probabilities(bundle: Bundle, reference: Reference) -> list[Check]:
    """A ``logits`` output whose rows all lie in [0, 1] and sum to 1 is most likely probabilities: sampling would
    then draw from softmax(probs), another policy. Warn and name the fix (``probs = ...``)."""
    checks = []
    for graph in bundle.graphs:
        a = bundle.contract(graph).action
        outputs = reference.outputs.get(graph, {})
        if a.kind != "categorical" or a.logits is None or a.logits not in outputs:
            continue
        rows = np.asarray(outputs[a.logits], np.float64)[reference.feeds.finite]
        if len(rows) and (rows >= 0).all() and (rows <= 1).all() and np.allclose(rows.sum(-1), 1.0, atol=1e-3):
            checks.append(Check("contract", f"roles.{graph}", "warn", f"output {a.logits!r} is declared as logits but "
                                "every row lies in [0, 1] and sums to 1: if it holds probabilities, declare "
                                f"probs = \"{a.logits}\" (sampling from softmax(probabilities) is another policy)"))
    return checks


def _blocked(runtime: type[Runtime], source: RuntimeSource) -> tuple[str, str] | None:
    """Why ``runtime`` cannot be compared: ``("failed-export", why)`` (its format failed at export: a failure of
    the runtime), ``("unavailable", why)`` (not on this machine), or None."""
    failure = runtime.export_failure(source)
    if failure is not None:
        return "failed-export", failure
    reason = runtime.why_not(source)
    return ("unavailable", reason) if reason else None


def nothing_compared(runtimes: Mapping[str, Mapping]) -> Check:
    """No runtime besides the reference produced a comparison: not a pass (exit 3), with every reason."""
    reasons = [f"{name}: {info.get('status')}: {info.get('reason', '')}".rstrip(": ")
               for name, info in runtimes.items() if info.get("status") != "reference"]  # fmt: skip
    detail = "; ".join(reasons) if reasons else "no runtime was selected"
    return Check("verify", "compared", "error", f"nothing was compared against the reference ({detail})")


def _build_reference(
    bundle: Bundle, source: RuntimeSource, inputs: Inputs, options: VerifyOptions, keep_twin: bool, twin_ulps: int = 0
) -> tuple[Reference, dict[str, Runtime] | None]:
    """The reference, and its compiled twin left open when ``keep_twin`` (it is then the ``ms-graph`` runtime)."""
    ref = {g: create(REFERENCE, source, g).open() for g in bundle.graphs}
    evidence: dict[str, Runtime] = {}
    det = bundle.mode_graph("deterministic")
    without = getattr(source.cells, "without_normalization", None)
    compiled, why = _compiled_twin(bundle, source, ref, options.seed, twin_ulps)
    kept = False
    try:
        if det is not None and without is not None:
            cell = without(det)
            if cell is not None:
                evidence[det] = create(REFERENCE, RuntimeSource(bundle, lambda _g: cell), det).open()
        reference = build_reference(
            bundle, ref, inputs, options.observations, options.episodes, options.seed, evidence, compiled
        )
        reference.episodes_by = why
        kept = keep_twin and compiled is not None
        return reference, compiled if kept else None
    finally:
        for rt in (*ref.values(), *evidence.values(), *((compiled or {}).values() if not kept else ())):
            rt.close()


TWIN = "ms-graph"  # the runtime the compiled twin is
TWIN_PROBE = 256
TRAINED_TWIN_ULPS = 4  # a trained lowered Cell's twin: its kept float layers may round their tail rows differently


def _compiled_twin(
    bundle: Bundle, source: RuntimeSource, ref: Mapping[str, Runtime], seed: int, ulps: int = 0
) -> tuple[dict[str, Runtime] | None, str]:
    """The reference Cell compiled (``ms-graph``), if it gives the same bits as PyNative on a seeded probe (or, with
    ``ulps``, the same actions and float outputs within that many ULP).

    PyNative runs op by op (~20 ms a step for a 256-256-128 policy, measured); the compiled Cell runs the same
    kernels in one call (~3 ms). Episodes are sequential, so the reference plays them with the compiled twin
    when the two agree exactly, and stays op by op when they do not.
    """
    if RUNTIMES[TWIN].why_not(source):
        return None, f"{REFERENCE} (ms-graph unavailable)"
    feeds = seeded_feeds(bundle, TWIN_PROBE, seed)
    twin = {g: create(TWIN, source, g).open() for g in bundle.graphs}
    for graph, rt in twin.items():  # in the feeds' chunks: the twin then compiles the batch sizes it plays and feeds
        want, got = infer_feeds(ref[graph], bundle, graph, feeds), infer_feeds(rt, bundle, graph, feeds)
        if not _twins(bundle, graph, want, got, ulps):
            for opened in twin.values():
                opened.close()
            return None, f"{REFERENCE} (the compiled Cell differs from PyNative on graph {graph!r})"
    same = "bitwise equal to" if not ulps else f"the same actions as, and within {ulps} ULP of,"
    return twin, f"ms-graph, {same} {REFERENCE} on {TWIN_PROBE} observations"


def _twins(bundle: Bundle, graph: str, want: Mapping[str, np.ndarray], got: Mapping[str, np.ndarray],
           ulps: int) -> bool:  # fmt: skip
    if all(np.array_equal(want[k], got[k], equal_nan=True) for k in want):
        return True
    if not ulps:
        return False
    contract = bundle.contract(graph)
    if not np.array_equal(np.asarray(contract.env_action(want)), np.asarray(contract.env_action(got))):
        return False
    return all(np.array_equal(want[k], got[k]) if want[k].dtype.kind != "f" else
               ulp_distance(want[k], got[k]) <= ulps for k in want)  # fmt: skip


def _env_check(env: E.EnvSource, seed: int) -> Check:
    problem = E.check_env_determinism(env, seed)
    if problem:
        return Check("env", "env_determinism", "warn", problem + "; episode checks compare only up to divergence")
    return Check("env", "env_determinism", "pass", f"{env.label} reproduces a seeded trajectory exactly")


def _provenance(bundle: Bundle, checkpoint: Path | None, checks: list[Check]) -> bool | None:
    """Was the bundle exported from ``checkpoint``? None when either side does not say."""
    recorded = (bundle.manifest.get("source") or {}).get("checkpoint_sha256")
    if checkpoint is None or not checkpoint.is_file() or not recorded:
        return None
    digest = sha256_file(checkpoint)
    matches = digest == recorded
    summary = "bundle exported from this checkpoint" if matches else (
        "bundle was exported from a different checkpoint (sha256 differs)"
    )  # fmt: skip
    status = "pass" if matches else "fail"
    metrics = {"checkpoint": str(checkpoint), "checkpoint_sha256": digest, "bundle_checkpoint_sha256": recorded}
    checks.append(Check("bundle", "provenance", status, summary, metrics))
    return matches


def check_env_matches_contract(bundle: Bundle, env: E.EnvSource) -> None:
    """The env's spaces agree with what the bundle's contracts declare (``spaces.check_env_spaces``): UsageError
    naming the disagreement, before any episode runs."""
    made = env.make()
    try:
        obs_space, act_space = made.observation_space, made.action_space
    finally:
        made.close()
    for graph in bundle.graphs:
        width = lambda name, g=graph: bundle.output_shape(g, name)[-1]  # noqa: E731
        shape = lambda name, g=graph: bundle.output_shape(g, name)  # noqa: E731
        where = f"contract of graph {graph!r} vs env {env.label}"
        check_env_spaces(bundle.contract(graph), obs_space, act_space, width, where, shape)
