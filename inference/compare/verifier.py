"""The consistency check, start to finish: validate → reference → every runtime → versions → result.

After Polygraphy's split: *inputs* (``reference.Inputs``: an env or recorded observations), *runners*
(``runtimes``), *comparison* (``runtime_check``) and *report* (``inference.report``). Nothing here
knows whose policy it is: the bundle's contracts say how outputs become actions, and the caller provides
the policy Cells (``RuntimeSource.cells``) that make up the training path.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from inference.bundle import MODES, Bundle, sha256_file
from inference.bundle.plan_claims import check_plan
from inference.bundle.spaces import check_env_spaces
from inference.compare import episodes as E
from inference.compare.acting import available_modes
from inference.compare.checks import Check, VerifyResult, version_checks
from inference.compare.divergence import (
    CHECKPOINT,
    checkpoint_difference,
    localize_failure,
    name_the_layer,
    preprocessing_first,
    wants_localization,
)
from inference.compare.feeds import seeded_feeds
from inference.compare.inputs import Inputs
from inference.compare.judge.device_precision import (
    LITE_RUNTIMES,
    Judgement,
    emulation_wanted,
    judgement,
)
from inference.compare.judge.diagnose import name_lowered_precision
from inference.compare.judge.localize import Localization, Localizer
from inference.compare.options import VerifyOptions
from inference.compare.reference import REFERENCE, Reference
from inference.compare.reference_cells import TWIN, TrainedReference, build_with_twin
from inference.compare.runtime_check import IN_GRAPH_RANDOMNESS, RuntimeReport, check_runtime
from inference.errors import INTERRUPTS, RuntimeUnavailable, UsageError
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
    run = _Verification(bundle, options, inputs, progress, localizer)
    source, names, required = run.validate(cells, reference)
    checkpoint_matches = run.check_inputs(checkpoint)
    blocked = {n: _blocked(RUNTIMES[n], source) for n in names}  # before the reference: it may be for nothing
    reference, twin = run.reference(reference, source, blocked, bool(extra_runtimes))
    if reference.repeat_differs:
        return run.unreproducible(reference, names, twin)
    run.check_reference(reference, checkpoint_matches)
    selected = run.select(names, blocked, twin, source)
    selected.update(extra_runtimes or {})
    trained = TrainedReference(bundle, source, inputs, options, progress)
    for name, graph_runtimes in selected.items():
        run.judge(name, graph_runtimes, reference, trained, required, checkpoint_matches)
    return run.verdict(reference)


@dataclass
class _Verification:
    """One verify's stages and what they gather: checks, each runtime's facts, episode differences, localisations."""

    bundle: Bundle
    options: VerifyOptions
    inputs: Inputs
    progress: Callable[[str], None]
    localizer: Localizer | None
    checks: list[Check] = field(default_factory=list)
    runtimes: dict[str, dict] = field(default_factory=dict)
    episode_diffs: dict[str, dict[str, np.ndarray]] = field(default_factory=dict)
    localizations: dict[str, Localization] = field(default_factory=dict)
    env_deterministic: bool = False  # free-running episodes may then skip the env steps that follow the reference
    asked: set[str] = field(default_factory=set)  # runtimes the user named: what happens to each is a check
    keep_twin: bool = False  # the reference's compiled twin then serves as ms-graph (compiled once)

    def validate(self, cells: CellProvider | None, reference: Reference | None) -> tuple[RuntimeSource, list, tuple]:
        """Usage errors (exit 2) and required runtimes that cannot run (exit 3), before minutes of comparisons;
        the runtimes to run, the required ones last."""
        bundle, options = self.bundle, self.options
        options.validate(bundle)
        check_plan(bundle)  # what a precision plan says of the files is true of them, before they are judged
        default = [n for n in RUNTIMES if not RUNTIMES[n].opt_in]  # opt-in runtimes (emulations) run when named
        if options.device == "ascend" and set(options.runtimes or default) & set(LITE_RUNTIMES):
            _precision_mode_named(bundle)  # Lite on Ascend runs with the bundle's precision mode, or not at all
        source = RuntimeSource(bundle, cells, options.device, options.device_id)
        emulate = ("emulated-fp16",) if emulation_wanted(bundle, options.emulate, options.device) else ()
        required = (*options.required, *(emulate if options.emulate else ()))
        for name in required:
            reason = RUNTIMES[name].why_not(source)
            if reason:
                raise RuntimeUnavailable(f"required runtime {name} is unavailable: {reason}")
        if self.inputs.env is None and self.inputs.recorded is None and reference is None:
            raise UsageError("no observation source: pass --env-id, --env MODULE:FACTORY or --observations-file")
        if self.inputs.env is not None:
            check_env_matches_contract(bundle, self.inputs.env)
        origin = REFERENCE if reference is None else reference.origin
        names = [n for n in (options.runtimes or default) if n != REFERENCE or origin != REFERENCE]
        names += [n for n in (*required, *emulate) if n not in names]
        self.asked = set(options.runtimes or ()) | set(required)
        self.keep_twin = TWIN in (*(options.runtimes or default), *required)  # it then serves as ms-graph
        return source, names, required

    def check_inputs(self, checkpoint: Path | None) -> bool | None:
        """Whether the env replays its seeds, and whether the bundle came from ``checkpoint`` (None: unknown)."""
        if self.inputs.env is not None:
            self.checks.append(_env_check(self.inputs.env, self.options.seed))
            self.env_deterministic = self.checks[-1].status == "pass"
        return _provenance(self.bundle, checkpoint, self.checks)

    def reference(
        self, given: Reference | None, source: RuntimeSource, blocked: dict, extra: bool
    ) -> tuple[Reference, dict[str, Runtime] | None]:  # fmt: skip
        """The given reference, else the training path's on the inputs (and its compiled twin, kept open when it
        serves as ms-graph); not built when no runtime could be compared with it (exit 3 now, not minutes later)."""
        if given is not None:
            return given, None
        reason = RUNTIMES[REFERENCE].why_not(source)
        if reason:
            raise RuntimeUnavailable(f"reference {REFERENCE}: {reason}")
        options = self.options
        if not extra and all(blocked.values()):
            self.runtimes[REFERENCE] = {"status": "reference", "reason": "not built: no runtime to compare it with"}
            return Reference(seeded_feeds(self.bundle, 64, options.seed), {}, {}, {}, options.seed, options.episodes,
                             skipped_episodes="not played: no runtime to compare them with"), None  # fmt: skip
        self.progress(f"reference {REFERENCE}: {options.episodes} episodes per mode, {options.observations} "
                      "observations")  # fmt: skip
        self.runtimes[REFERENCE] = {"status": "reference"}
        return build_with_twin(self.bundle, source, self.inputs, options, self.keep_twin)

    def unreproducible(self, reference: Reference, names: list, twin: dict[str, Runtime] | None) -> VerifyResult:
        """A Cell that answers the same input differently (an in-graph RNG): nothing can be compared with it."""
        detail = "; ".join(f"{g}: {', '.join(outs)}" for g, outs in reference.repeat_differs.items())
        self.checks.append(Check(REFERENCE, "repeatability", "fail", f"the policy Cell gives different outputs for "
                                 f"the same input on two calls ({detail})", diagnosis=IN_GRAPH_RANDOMNESS))  # fmt: skip
        self.checks += [Check(n, "comparison", "skip", "skipped: the reference is not reproducible") for n in names]
        for rt in (twin or {}).values():
            rt.close()
        return VerifyResult(self.bundle, self.options, self.checks, self.runtimes, reference, self.episode_diffs,
                            self.inputs.describe())  # fmt: skip

    def check_reference(self, reference: Reference, checkpoint_matches: bool | None) -> None:
        """What the reference itself says: probabilities named as logits, the layer another checkpoint changed,
        the episodes and modes not played."""
        bundle = self.bundle
        self.checks += logits_that_are_probabilities(bundle, reference)
        if checkpoint_matches is False and self.localizer is not None:
            found = checkpoint_difference(self.localizer, bundle, reference, self.checks)
            if found is not None:
                self.localizations[CHECKPOINT] = found
                self.progress(found.line())
        if reference.skipped_episodes:
            self.checks.append(Check("inputs", "episodes", "skip", reference.skipped_episodes))
        for mode in (set(MODES) - set(available_modes(bundle))) if not reference.skipped_episodes else ():
            kind = bundle.contract(bundle.graphs[0]).action.kind
            why = (f"every graph takes sampling noise and a {kind} action has no noise-free decision"
                   if mode == "deterministic" else f"a {kind} policy takes no noise")  # fmt: skip
            self.checks.append(Check("inputs", f"episodes.{mode}", "skip", f"no {mode} mode: {why}"))

    def select(
        self, names: list, blocked: dict, twin: dict[str, Runtime] | None, source: RuntimeSource
    ) -> dict[str, Mapping[str, Runtime] | str]:
        """Each runtime to judge (its graphs' Runtimes), or why it is unavailable; a format that failed at export
        fails here."""
        selected: dict[str, Mapping[str, Runtime] | str] = {}
        for name in names:
            match blocked[name]:
                case ("failed-export", failure):  # the manifest says this format failed at export
                    self.runtimes[name] = {"status": "failed-export", "reason": failure}
                    self.checks.append(Check(name, "export", "fail", failure,
                                             diagnosis={"stage": "runtime", "detail": failure}))  # fmt: skip
                case ("unavailable", reason):
                    selected[name] = reason
                case None:
                    selected[name] = (twin if name == TWIN and twin else
                                      {g: create(name, source, g) for g in self.bundle.graphs})  # fmt: skip
        return selected

    def judge(
        self, name: str, graph_runtimes: Mapping[str, Runtime] | str, reference: Reference,
        trained: TrainedReference, required: tuple, checkpoint_matches: bool | None,
    ) -> None:  # fmt: skip
        """One runtime's checks (against the trained reference where it computes the trained numerics), and where
        it diverges when it fails."""
        INTERRUPTS.check()
        started = time.perf_counter()
        if isinstance(graph_runtimes, str):
            self.runtimes[name] = {"status": "unavailable", "reason": graph_runtimes}
            if name in self.asked:  # otherwise a fact about this machine: the report's runtimes section says it
                self.checks.append(Check(name, "available", "skip", f"unavailable: {graph_runtimes}"))
            self.progress(f"{name}: unavailable")
            return
        against = trained.reference_for(name) or reference
        report, judged = judge_runtime(name, graph_runtimes, self.bundle, against, self.inputs, self.options,
                                       name in required, checkpoint_matches, self.env_deterministic,
                                       asked=name in self.asked)  # fmt: skip
        if against is not reference:
            report.info["reference"] = trained.describe()
        self.runtimes[name], self.episode_diffs[name] = report.info, report.episode_diffs
        self.checks += report.checks
        self.progress(f"{name}: {report.info['status']} ({time.perf_counter() - started:.1f} s)")
        if self.localizer is not None and wants_localization(self.options.localize, report, self.bundle, name):
            found = localize_failure(self.localizer, self.bundle, reference, report, name, judged.tolerance)
            self.localizations[name] = found
            self.progress(found.line())
            preprocessing_first(found, report.checks)

    def verdict(self, reference: Reference) -> VerifyResult:
        """The checks that span runtimes (the layer a checkpoint changed, a lowered precision, versions), and a run
        that compared nothing failing."""
        if CHECKPOINT in self.localizations:
            name_the_layer(self.localizations[CHECKPOINT], self.checks)
        name_lowered_precision(self.bundle, self.runtimes, self.checks, self.localizations)
        self.checks.extend(version_checks(self.bundle, self.runtimes))
        result = VerifyResult(self.bundle, self.options, self.checks, self.runtimes, reference, self.episode_diffs,
                              self.inputs.describe(), self.localizations)  # fmt: skip
        if not result.compared:
            self.checks.append(nothing_compared(self.runtimes))
        return result


def judge_runtime(
    name: str,
    graph_runtimes: Mapping[str, Runtime],
    bundle: Bundle,
    reference: Reference,
    inputs: Inputs,
    options: VerifyOptions,
    required: bool = False,
    checkpoint_matches: bool | None = None,
    env_deterministic: bool = False,
    asked: bool = True,
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


def env_replays_seeds(env: E.EnvSource, seed: int) -> bool:
    """Whether ``env`` replays a seeded trajectory exactly (free-running episodes may then follow the reference)."""
    return _env_check(env, seed).status == "pass"


def _precision_mode_named(bundle: Bundle) -> None:
    """Lite on Ascend runs with the bundle's precision mode; a bundle naming none is refused (exit 2, one line)."""
    import platform

    from inference.bundle.precision_mode import PrecisionModeMissing, lite_precision

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
            checks.append(
                Check(
                    "contract",
                    f"roles.{graph}",
                    "warn",
                    f"output {a.logits!r} is declared as logits but "
                    "every row lies in [0, 1] and sums to 1: if it holds probabilities, declare "
                    f'probs = "{a.logits}" (sampling from softmax(probabilities) is another policy)',
                )
            )
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
