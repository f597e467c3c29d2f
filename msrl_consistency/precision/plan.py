"""Make a precision plan: the bundle's layers, the states the policy really saw, each layer's sensitivity, the
cheapest kept set, the plan's tolerance and its bundle (``python -m msrl_consistency.precision``)."""

from __future__ import annotations

import argparse
import hashlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from inference.bundle import Bundle, BundleError, load_bundle
from inference.compare import episodes as E
from inference.compare.policy_bounds import PLAN_BOUNDS, PolicyBounds
from inference.errors import RuntimeUnavailable, UsageError, first_line
from inference.lite.common import LiteRunnerError
from msrl_consistency.artifacts.graphs import ConversionError
from msrl_consistency.precision.evaluate import Evaluation, States, evaluate, reference_episodes
from msrl_consistency.precision.layers import Layer, policy_layers
from msrl_consistency.precision.lowering import CALIBRATION_SIZE, Fp16Lowering, Int8Lowering, close
from msrl_consistency.precision.search import SearchResult, search
from msrl_consistency.precision.write import write_plan_bundle

CALIBRATION_SEED, EVALUATION_SEED = 10_000, 20_000  # offsets from --seed: three disjoint sets of seeded episodes


def source_bundle(path: Path, lower: str) -> Bundle:
    try:
        bundle = load_bundle(path)
    except BundleError as exc:
        raise UsageError(str(exc)) from None
    if bundle.precision != "fp32":
        raise UsageError(f"{path} is an {bundle.precision} bundle: a plan lowers a float32 bundle")
    if bundle.plan:
        raise UsageError(f"{path} already follows a precision plan: plan from the float32 bundle it came from")
    for graph in bundle.graphs:  # int8 is converted from the ONNX graph into a .ms; fp16 is emulated on the ONNX graph
        if not bundle.has_file(graph, "onnx") or (lower == "int8" and not bundle.has_file(graph, "ms")):
            need = ".onnx and .ms" if lower == "int8" else ".onnx"
            raise UsageError(f"{path}: graph {graph!r} needs its {need} (export with --formats mindir,onnx,ms)")
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


def collect_states(bundle: Bundle, args: argparse.Namespace, env: E.EnvSource | None) \
        -> tuple[States, np.ndarray, str]:  # fmt: skip
    """The evaluation states, the calibration rows and where those came from: a field recording's observations
    (first half calibrates, second half evaluates), else states the float32 policy visits in seeded episodes
    (disjoint seeds)."""
    rng = np.random.default_rng([args.seed, 7])
    if args.recording:
        from inference.bundle.recording import read_recording

        graph = bundle.mode_graph("deterministic") or bundle.graphs[0]
        recording = read_recording(args.recording, bundle)
        if len(bundle.contract(graph).obs_inputs(recording.inputs[0][:1])) != 1:
            raise UsageError("a recording calibrates array observations only (this policy takes several inputs)")
        rows = recording.inputs[0][np.isfinite(recording.inputs[0].reshape(len(recording), -1)).all(1)]
        if len(rows) < 2 * 64:
            raise UsageError(f"the recording holds {len(rows)} finite observations; a plan needs at least 128")
        half = len(rows) // 2
        calibration, evaluation = _spread(rows[:half], CALIBRATION_SIZE), _spread(rows[half:], args.states)
        where = f"field recording {', '.join(map(str, args.recording))}"
        source = f"{where}: its second half ({len(rows) - half} observations)"
        calibrated = f"{where}: its first half ({half} observations)"
    else:
        if env is None:
            raise UsageError("no env to visit states in: pass --env-id or --env (or --recording)")
        from msrl_consistency.precision.lowering import Fp16Lowering

        fp32 = Fp16Lowering(bundle, []).reference()
        try:
            rows, played = _visited(bundle, fp32, env, CALIBRATION_SIZE, args.seed + CALIBRATION_SEED)
            calibration = _spread(rows, CALIBRATION_SIZE)
            rows, evaluated = _visited(bundle, fp32, env, args.states, args.seed + EVALUATION_SEED)
            evaluation = _spread(rows, args.states)
        finally:
            close(fp32)
        visits = f"states the float32 policy visits in seeded episodes of {env.label}"
        source = f"{visits} ({evaluated} episodes, seeds {args.seed + EVALUATION_SEED}..)"
        calibrated = f"{visits} ({played} other episodes, seeds {args.seed + CALIBRATION_SEED}..)"
    noise = {g: bundle.sample_noise(g, rng, len(evaluation)) for g in bundle.graphs
             if bundle.contract(g).stochastic_noise_kind is not None}  # fmt: skip
    states = States(evaluation, noise, source, env, args.episodes if env is not None else 0, args.seed)
    return states, calibration, calibrated


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


def plan_tolerance(final: Evaluation) -> dict[str, float]:
    """The element-wise tolerance verify applies to the plan's lowered runtime: twice the largest error the plan
    gave on the evaluation states, relative to each output's magnitude (``Tolerance.scale``), at least fp16's."""
    worst = max(final.errors.values(), default=0.0)
    return {"atol": 1e-3, "rtol": 1e-2, "scale": float(max(1e-2, 2 * worst))}


def make_plan(args: argparse.Namespace, work: Path, say: Callable[[str], None]) -> tuple[Bundle, SearchResult, dict]:
    from inference.compare.inputs import resolve_inputs

    bundle = source_bundle(args.bundle, args.lower)
    cells = policy_cells(bundle, args.ckpt, args.cell)
    env = None
    if bundle.env_id or args.env_id or args.env:
        env = resolve_inputs(bundle, env_id=args.env_id, env=args.env).env
    say(f"layers of {bundle.root} ...")
    layers = policy_layers(bundle, cells)
    kept_given = _given(args.keep, layers)
    states, calibration, calibrated = collect_states(bundle, args, env)
    say(f"{len(states.obs)} evaluation states: {states.source}")
    lowering = _lowering(args, bundle, layers, work, calibration)
    bounds = PLAN_BOUNDS
    reference = lowering.reference()
    try:
        reference_episodes(bundle, reference, states)
        ref_outputs: dict[str, dict[str, np.ndarray]] = {}

        def judge(kept: frozenset[str]) -> Evaluation:
            try:
                lowered = lowering.lowered(kept)
            except (LiteRunnerError, ConversionError) as exc:  # a lowering this Lite cannot convert or load
                why = f"Lite cannot {'load' if isinstance(exc, LiteRunnerError) else 'convert'} it: {first_line(exc)}"
                return Evaluation(kept, {}, {}, {}, [why], float("inf"))
            try:
                return evaluate(bundle, reference, lowered, states, bounds, kept, ref_outputs)
            finally:
                close(lowered)

        if kept_given is None:
            result = search(layers, judge, args.max_evaluations, say)
        else:
            every = frozenset(layer.scope for layer in layers)
            sens = {layer.scope: judge(every - {layer.scope}) for layer in layers}
            result = SearchResult(kept_given, judge(kept_given), judge(frozenset()), sens, "given (--keep)",
                                  len(layers) + 2)  # fmt: skip
    finally:
        close(reference)
    unusable = [b for b in result.final.broken if b.startswith("Lite cannot")]
    if unusable:
        raise RuntimeUnavailable(f"the plan keeping {', '.join(sorted(result.final.kept)) or 'no layer'} cannot run "
                                 f"here: {unusable[0]}")  # fmt: skip
    plan = plan_record(args, bundle, layers, result, states, bounds, lowering, calibration, calibrated)
    written = write_plan_bundle(bundle, args.out, layers, result, plan, lowering, args.force)
    return written, result, plan


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


def plan_record(args: argparse.Namespace, bundle: Bundle, layers: list[Layer], result: SearchResult, states: States,
                bounds: PolicyBounds, lowering: Any, calibration: np.ndarray, calibrated: str) \
        -> dict[str, Any]:  # fmt: skip
    """The manifest's ``plan`` section."""
    lowered = args.lower
    record: dict[str, Any] = {
        "lower": lowered,
        "quantization": args.quantization if lowered == "int8" else None,
        "kept": sorted(result.kept),
        "layers": [{"scope": layer.scope, "kind": layer.kind, "cost": layer.cost, "nodes": layer.nodes,
                    "precision": "fp32" if layer.scope in result.kept else lowered,
                    "sensitivity": result.sensitivity[layer.scope].summary()} for layer in layers],  # fmt: skip
        "bounds": bounds.to_dict(),
        "tolerance": plan_tolerance(result.final),
        "evaluation": {"runtime": lowering.runtime, "states": int(len(states.obs)), "source": states.source,
                       "episodes": states.episodes, "seed": args.seed},  # fmt: skip
        "search": {"method": result.method, "evaluations": result.evaluations, "tried": result.tried[:64]},
        "final": result.final.summary(),
        "all_lowered": result.all_lowered.summary(),
        "calibration": None,
        "bundle": str(args.out),
        "source_bundle": str(bundle.root),
    }
    if lowered == "int8" and args.quantization == "full":
        digest = hashlib.sha256(np.ascontiguousarray(calibration).tobytes()).hexdigest()
        record["calibration"] = {"source": calibrated, "count": int(len(calibration)), "sha256": digest}
    return record
