"""Make a precision plan: the bundle's layers, calibration on states the policy really saw, each layer's
sensitivity, the cheapest kept set, and its bundle (``python -m msrl_consistency.precision``). Every candidate is
judged by verify's own checks (``evaluate``), so a plan the search accepts is a bundle verify passes."""

from __future__ import annotations

import argparse
import hashlib
import itertools
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

import msrl_consistency.runtimes  # noqa: F401 - registers the MindSpore runtimes (verify's reference) with inference.runtimes
from inference.bundle import Bundle, BundleError, load_bundle
from inference.bundle.plan_claims import QUANTIZED_OPS, check_plan, onnx_nodes
from inference.compare import episodes as E
from inference.compare.inputs import Inputs
from inference.compare.judge.policy_bounds import POLICY_BOUNDS
from inference.compare.judge.stats import PRESETS, tolerance_for
from inference.compare.verifier import judge_runtime
from inference.errors import INTERRUPTS, RuntimeUnavailable, UsageError, first_line
from inference.lite.common import LiteRunnerError
from inference.runtimes.registry import create
from msrl_consistency.artifacts.graphs import ConversionError
from msrl_consistency.precision.evaluate import Evaluation, from_report
from msrl_consistency.precision.layers import Layer, needs_files, policy_layers
from msrl_consistency.precision.lowering import CALIBRATION_SIZE, Fp16Lowering, Int8Lowering, close
from msrl_consistency.precision.search import SearchResult, search
from msrl_consistency.precision.write import write_bundle, write_plan_bundle

CALIBRATION_SEED = 10_000  # offset from --seed: calibration episodes verify's seeds never play


def source_bundle(path: Path, lower: str) -> Bundle:
    try:
        bundle = load_bundle(path)
    except BundleError as exc:
        raise UsageError(str(exc)) from None
    if bundle.precision != "fp32":
        raise UsageError(f"{path} is an {bundle.precision} bundle: a plan lowers a float32 bundle")
    trained = (bundle.plan or {}).get("trained")
    if trained:
        lowered = trained.get("computes_in")
        raise UsageError(f"{path} is a policy trained in {lowered}: its bundle already lowers every actor layer it did "
                         f"not keep and verifies against its own {lowered} Cell"
                         + ("" if lowered == lower else f"; for {lower}, train in it (train --init-from RUN --lower "
                            f"{lower})"))  # fmt: skip
    if bundle.plan:
        raise UsageError(f"{path} already follows a precision plan: plan from the float32 bundle it came from")
    needs_files(bundle, lower, str(path))
    return bundle


def policy_cells(bundle: Bundle, ckpt: Path | None, cell: str | None) -> Callable[[str], Any]:
    """The training path's Cells: the trainer's from the checkpoint, or the team's ``--cell``."""
    from msrl_consistency.artifacts import run_dir as rd
    from msrl_consistency.artifacts.cells import TrainerCells, UserCells

    checkpoint = rd.checkpoint_path(ckpt) if ckpt is not None else None
    if cell is not None:
        return UserCells(cell, checkpoint)
    if (bundle.manifest.get("source") or {}).get("kind") == "cell":
        raise UsageError(f"the bundle was exported from {bundle.manifest['source'].get('cell')!r}: pass --cell")
    if checkpoint is None:
        raise UsageError("pass --ckpt RUN (the run the bundle was exported from)")
    return TrainerCells(checkpoint, bundle.policy_spec or {})


def _visited(bundle: Bundle, runtimes: Any, env: E.EnvSource, want: int, seed: int) -> tuple[np.ndarray, int]:
    """At least ``want`` states the float32 policy visits in seeded deterministic (or stochastic) episodes, 16
    episodes at a time from ``seed`` (short episodes need more of them); returns them and the episodes played."""
    from inference.compare.acting import mode_policy

    mode = "deterministic" if bundle.mode_graph("deterministic") else "stochastic"
    graph = bundle.mode_graph(mode)
    found, played = [], 0
    while sum(len(f) for f in found) < want and played < 1024:
        noise = E.episode_noise(bundle, graph, 16, env.max_steps, seed + played) if mode == "stochastic" else None
        trace = E.run_episodes(env, mode_policy(bundle, runtimes, mode), 16, seed + played, noise)
        found.append(trace.obs[trace.alive])
        played += 16
    return np.concatenate(found), played


def _spread(rows: np.ndarray, n: int) -> np.ndarray:
    return rows[np.linspace(0, len(rows) - 1, min(n, len(rows))).astype(int)] if len(rows) else rows


def judge_inputs(bundle: Bundle, args: argparse.Namespace) -> tuple[Inputs, np.ndarray | None]:
    """What verify would play and feed (the bundle's env, ``--env-id`` or ``--env``), and a field recording's
    observations when one is given (its first half calibrates; without an env, its second half is the judge's)."""
    from inference.compare.inputs import resolve_inputs

    recorded = _recorded(bundle, args.recording) if args.recording else None
    if bundle.env_id or args.env_id or args.env:
        return resolve_inputs(bundle, env_id=args.env_id, env=args.env), recorded
    if recorded is None:
        raise UsageError("no env to judge the plan in: pass --env-id or --env (or --recording)")
    half = recorded[len(recorded) // 2 :]
    return Inputs(recorded=half, recorded_from=f"field recording {', '.join(map(str, args.recording))}: its second "
                  f"half"), recorded  # fmt: skip


def _recorded(bundle: Bundle, dirs: list[Path]) -> np.ndarray:
    from inference.bundle.recording import read_recording

    graph = bundle.mode_graph("deterministic") or bundle.graphs[0]
    recording = read_recording(dirs, bundle)
    if len(bundle.contract(graph).obs_inputs(recording.inputs[0][:1])) != 1:
        raise UsageError("a recording calibrates array observations only (this policy takes several inputs)")
    rows = recording.inputs[0][np.isfinite(recording.inputs[0].reshape(len(recording), -1)).all(1)]
    if len(rows) < 2 * 64:
        raise UsageError(f"the recording holds {len(rows)} finite observations; a plan needs at least 128")
    return rows


def calibration_rows(bundle: Bundle, args: argparse.Namespace, inputs: Inputs, recorded: np.ndarray | None) \
        -> tuple[np.ndarray, str]:  # fmt: skip
    """The rows full quantization calibrates on, and where they came from: a field recording's first half, else
    states the float32 policy visits in seeded episodes whose seeds verify never plays."""
    if recorded is not None:
        half = len(recorded) // 2
        where = f"field recording {', '.join(map(str, args.recording))}: its first half ({half} observations)"
        return _spread(recorded[:half], CALIBRATION_SIZE), where
    assert inputs.env is not None
    fp32 = Fp16Lowering(bundle, []).reference()
    try:
        rows, played = _visited(bundle, fp32, inputs.env, CALIBRATION_SIZE, args.seed + CALIBRATION_SEED)
    finally:
        close(fp32)
    return _spread(rows, CALIBRATION_SIZE), (f"states the float32 policy visits in seeded episodes of "
                                             f"{inputs.env.label} ({played} episodes, seeds "
                                             f"{args.seed + CALIBRATION_SEED}..)")  # fmt: skip


def calibration_inputs(bundle: Bundle, rows: np.ndarray, seed: int) -> dict[str, dict[str, np.ndarray]]:
    """Per graph, per input, the rows full quantization calibrates on: the observations, and for a graph that takes
    sampling noise, noise drawn as the contract draws it (the input the policy really takes there)."""
    rng = np.random.default_rng([seed, 8])
    out = {}
    for graph in bundle.graphs:
        contract = bundle.contract(graph)
        names = [t["name"] for t in bundle.graph(graph)["inputs"]]
        noise = [bundle.sample_noise(graph, rng, len(rows))] if contract.takes_noise else []
        out[graph] = dict(zip(names, [*contract.obs_inputs(rows), *noise], strict=True))
    return out


RUNTIME = {"int8": "lite", "fp16": "emulated-fp16"}  # the runtime verify judges each lowered precision on here


def make_plan(args: argparse.Namespace, work: Path, say: Callable[[str], None]) -> tuple[Bundle, SearchResult, dict]:
    """Search the cheapest kept set that verify passes, and write its bundle (see ``evaluate`` for the judge)."""
    from inference.compare.options import VerifyOptions
    from inference.compare.reference_cells import reference_for
    from inference.compare.verifier import env_replays_seeds
    from inference.runtimes.base import RuntimeSource

    bundle = source_bundle(args.bundle, args.lower)
    cells = policy_cells(bundle, args.ckpt, args.cell)
    inputs, recorded = judge_inputs(bundle, args)
    say(f"layers of {bundle.root} ...")
    layers = policy_layers(bundle, cells)
    _something_to_lower(bundle, layers, args.lower)
    kept_given = _given(args.keep, layers)
    calibration, calibrated = (calibration_rows(bundle, args, inputs, recorded) if args.lower == "int8"
                               else (np.zeros((0,)), ""))  # fmt: skip
    lowering = _lowering(args, bundle, layers, work, calibration)
    options = VerifyOptions(observations=args.observations, episodes=args.episodes, seed=args.seed)
    runtime, preset = RUNTIME[args.lower], PRESETS[args.lower]
    bounds = POLICY_BOUNDS[args.lower]
    say(f"verify's reference: {args.observations} observations, {args.episodes} episodes per mode ({inputs.label})")
    reference = reference_for(bundle, RuntimeSource(bundle, cells), inputs, options)
    replays = inputs.env is not None and env_replays_seeds(inputs.env, args.seed)
    record = plan_record(args, bundle, layers, calibration, calibrated)
    record["judge"] = {"runtime": runtime, "preset": preset.name, "observations": args.observations,
                       "episodes": args.episodes, "seed": args.seed, "inputs": inputs.label,
                       "tolerance": tolerance_for(preset.name, runtime).describe()}  # fmt: skip
    count = itertools.count()

    def judge(kept: frozenset[str]) -> Evaluation:
        INTERRUPTS.check()
        where = work / "candidates" / str(next(count))
        provisional = {**record, "kept": sorted(kept), "layers": layer_records(layers, kept, args.lower)}
        try:
            candidate = write_bundle(bundle, where, layers, kept, provisional, lowering)
        except (LiteRunnerError, ConversionError) as exc:  # a lowering this Lite cannot convert
            return Evaluation(kept, {}, {}, [f"Lite cannot convert it: {first_line(exc)}"], float("inf"))
        try:
            runtimes = {g: create(runtime, RuntimeSource(candidate, cells), g) for g in candidate.graphs}
            report, _ = judge_runtime(runtime, runtimes, candidate, reference, inputs, options,
                                      env_deterministic=replays)  # fmt: skip
            return from_report(kept, report, bounds, preset.return_tolerance)
        finally:
            shutil.rmtree(where, ignore_errors=True)

    if kept_given is None:
        result = search(layers, judge, args.max_evaluations, say)
    else:
        every = frozenset(layer.scope for layer in layers)
        sens = {layer.scope: judge(every - {layer.scope}) for layer in layers}
        result = SearchResult(kept_given, judge(kept_given), judge(frozenset()), sens, "given (--keep)",
                              len(layers) + 2)  # fmt: skip
    unusable = [b for b in result.final.broken if b.startswith(("Lite cannot", "the runtime did not run"))]
    if unusable:
        raise RuntimeUnavailable(f"the plan keeping {', '.join(sorted(result.final.kept)) or 'no layer'} cannot run "
                                 f"here: {unusable[0]}")  # fmt: skip
    record.update(kept=sorted(result.kept), layers=layer_records(layers, result.kept, args.lower, result),
                  search={"method": result.method, "evaluations": result.evaluations, "tried": result.tried[:64]},
                  final=result.final.summary(), all_lowered=result.all_lowered.summary())  # fmt: skip
    written = write_plan_bundle(bundle, args.out, layers, result, record, lowering, args.force)
    check_plan(written)  # what the plan says of its files holds, as verify will check before judging them
    return written, result, record


def _something_to_lower(bundle: Bundle, layers: list[Layer], lower: str) -> None:
    """int8 lowers the layers whose weights Lite quantizes (matrix products, convolutions): a policy without one has
    nothing to lower, and its float32 bundle is what the device runs."""
    if lower != "int8":
        return
    reads = {g: onnx_nodes(bundle, g)[1] for g in bundle.graphs}  # the nodes whose weights int8 quantizes
    if not any(n in reads[g] for layer in layers for g, nodes in layer.nodes.items() for n in nodes):
        raise UsageError(f"nothing to lower: {bundle.root} has no layer whose weights int8 quantizes ("
                         f"{', '.join(QUANTIZED_OPS)}); its float32 bundle is what the device runs")  # fmt: skip


def source_graphs(bundle: Bundle) -> dict[str, str]:
    """The fingerprint of the float32 graphs a plan is made from (``plan_claims`` checks it): graph → ONNX sha256."""
    return {g: bundle.graph(g)["files"]["onnx"]["sha256"] for g in bundle.graphs}


def layer_records(layers: list[Layer], kept: frozenset[str], lower: str,
                   result: SearchResult | None = None) -> list[dict[str, Any]]:  # fmt: skip
    return [{"scope": layer.scope, "kind": layer.kind, "cost": layer.cost, "nodes": layer.nodes,
             "precision": "fp32" if layer.scope in kept else lower,
             **({"sensitivity": result.sensitivity[layer.scope].summary()} if result else {})}
            for layer in layers]  # fmt: skip


def _given(keep: str | None, layers: list[Layer]) -> frozenset[str] | None:
    if keep is None:
        return None
    names = [] if keep.strip() == "none" else [k.strip() for k in keep.split(",") if k.strip()]
    known = {layer.scope for layer in layers}
    unknown = [n for n in names if n not in known]
    if unknown:
        raise UsageError(f"--keep names unknown layer(s) {', '.join(unknown)}; the layers are {', '.join(known)}")
    return frozenset(names)


def _lowering(args: argparse.Namespace, bundle: Bundle, layers: list[Layer], work: Path, calibration: np.ndarray) \
        -> Fp16Lowering | Int8Lowering:  # fmt: skip
    from msrl_consistency.artifacts.graphs import ConverterUnavailable

    try:
        if args.lower == "fp16":
            import onnx  # noqa: F401 - the emulation rewrites the ONNX graph

            return Fp16Lowering(bundle, layers)
        return Int8Lowering(bundle, layers, work, calibration_inputs(bundle, calibration, args.seed),
                            args.quantization)  # fmt: skip
    except ConverterUnavailable as exc:
        raise RuntimeUnavailable(str(exc)) from None
    except ImportError as exc:
        raise RuntimeUnavailable(f"the fp16 emulation needs onnx and onnxruntime: {exc}") from None


def plan_record(args: argparse.Namespace, bundle: Bundle, layers: list[Layer], calibration: np.ndarray,
                calibrated: str) -> dict[str, Any]:  # fmt: skip
    """The manifest's ``plan`` section, before the search fills in what it kept and measured."""
    lowered = args.lower
    record: dict[str, Any] = {
        "lower": lowered,
        "quantization": args.quantization if lowered == "int8" else None,
        "kept": [],
        "layers": layer_records(layers, frozenset(), lowered),
        "bounds": POLICY_BOUNDS[lowered].to_dict(),
        "source_graphs": source_graphs(bundle),
        "calibration": None,
        "bundle": str(args.out),
        "source_bundle": str(bundle.root),
    }
    if lowered == "int8" and args.quantization == "full":
        digest = hashlib.sha256(np.ascontiguousarray(calibration).tobytes()).hexdigest()
        record["calibration"] = {"source": calibrated, "count": int(len(calibration)), "sha256": digest}
    return record
