"""The bundle of a run trained in the device's numerics (``train --lower int8|fp16``): a precision plan that nobody
searched, because the policy was trained for it.

Export writes the float bundle first (the actor frozen with its int8-grid weights, ``agent.lowered.freeze``), then
this plan's bundle from it with ``precision.write.write_bundle``, the plan search's own writer:

* every actor layer is lowered except the run's ``--keep``; what is not the actor trunk (observation normalisation,
  the critic, the distribution's sampling and log-probabilities, the action squash) stays fp32, as in training;
* int8: the converter calibrates on the very observations the checkpoint's ranges come from (the rows are a Parameter
  of the checkpoint), with MAX_MIN and no bias correction, so Lite's scales are the trained ones; export reads the
  ``.ms`` back and refuses a file whose activation ranges differ from the trained ones (``check_ranges``);
* fp16: Lite's runtime configuration runs the actor in fp16, the rest in fp32 (the emulation follows the same plan).

Verify then judges the lowered runtime against the run's own lowered Cell (``TrainerCells.lowered``), and the float
runtimes against the frozen float Cell.
"""

from __future__ import annotations

import hashlib
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from inference.bundle import Bundle
from inference.bundle.plan_claims import check_plan
from inference.compare.judge.policy_bounds import POLICY_BOUNDS
from inference.errors import RuntimeUnavailable, UsageError
from msrl_consistency.agent.lowered import act_qparams, lowered_numerics
from msrl_consistency.agent.policy import ActorCritic
from msrl_consistency.agent.spec import PolicySpec
from msrl_consistency.artifacts.bundle import ExportCheckFailed
from msrl_consistency.precision.layers import Layer, needs_files, policy_layers
from msrl_consistency.precision.plan import calibration_inputs, layer_records, source_graphs

ACTOR = "actor.layers."
RANGE_RTOL = 1e-5  # the calibration forward's float32 rounding moves a scale by an ulp or two
CALIBRATION_NOISE_SEED = 0  # the sampling noise a stochastic graph is calibrated with (its nodes stay fp32)


def kept_layers(layers: list[Layer], spec: PolicySpec) -> frozenset[str]:
    """Everything but the actor trunk's layers, and the ones the run kept in fp32."""
    return frozenset(layer.scope for layer in layers if not layer.scope.startswith(ACTOR) or layer.scope in spec.keep)


def export_trained(
    ckpt: Path, policy: ActorCritic, out: Path, force: bool, write_float: Callable[[Path], Bundle]
) -> Bundle:
    """Write the float bundle with ``write_float`` into a scratch directory, then the trained plan's bundle to
    ``out``; ``policy``: the run's policy as loaded (its int8 calibration rows and ranges)."""
    from msrl_consistency.artifacts.cells import TrainerCells
    from msrl_consistency.precision.write import write_bundle

    spec = policy.spec
    if out.exists() and (not out.is_dir() or (any(out.iterdir()) and not force)):
        raise UsageError(f"{out} already exists; pass --force to replace it")
    out.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        source = write_float(work / "fp32")
        needs_files(source, spec.lower, f"a run trained in {spec.lower}")
        layers = policy_layers(source, TrainerCells(ckpt, spec.to_dict()))
        kept = kept_layers(layers, spec)
        lowering, calibration = _lowering(source, layers, work, policy)
        record = plan_record(source, layers, kept, policy, out, calibration)
        if spec.lower == "int8":
            record["trained"]["ranges_check"] = {
                g: check_ranges(lowering.convert(g, kept), source.file(g, "onnx"), policy) for g in source.graphs
            }
        bundle = write_bundle(source, out, layers, kept, record, lowering)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    check_plan(bundle)
    return bundle


def _lowering(bundle: Bundle, layers: list[Layer], work: Path, policy: ActorCritic) -> tuple[Any, np.ndarray | None]:
    from msrl_consistency.artifacts.graphs import ConverterUnavailable
    from msrl_consistency.precision.lowering import Fp16Lowering, Int8Lowering

    if policy.spec.lower == "fp16":
        return Fp16Lowering(bundle, layers), None
    rows = policy.calibration.asnumpy()
    try:
        lowering = Int8Lowering(bundle, layers, work, calibration_inputs(bundle, rows, CALIBRATION_NOISE_SEED),
                                bias_correction=False)  # fmt: skip
    except ConverterUnavailable as exc:
        raise RuntimeUnavailable(f"a run trained in int8 exports an int8 .ms: {exc}") from None
    return lowering, rows


def plan_record(bundle: Bundle, layers: list[Layer], kept: frozenset[str], policy: ActorCritic, out: Path,
                calibration: np.ndarray | None) -> dict[str, Any]:  # fmt: skip
    """The manifest's ``plan``: a plan's fields, with ``trained`` saying where its numerics come from."""
    spec = policy.spec
    lower = spec.lower
    record: dict[str, Any] = {
        "lower": lower,
        "quantization": "full" if lower == "int8" else None,
        "kept": sorted(kept),
        "layers": layer_records(layers, kept, lower),
        "bounds": POLICY_BOUNDS[lower].to_dict(),
        "source_graphs": source_graphs(bundle),
        "calibration": None,
        "bundle": str(out),
        "search": {"method": "none: the policy was trained in these numerics (train --lower)", "evaluations": 0},
        "trained": {
            **lowered_numerics(lower, spec.keep),
            "reference": "the run's Cell computing in these numerics (the training path)",
        },  # fmt: skip
    }
    if calibration is not None:
        digest = hashlib.sha256(np.ascontiguousarray(calibration).tobytes()).hexdigest()
        record["calibration"] = {
            "source": "the observations the checkpoint's int8 ranges were calibrated on "
            "(the last rollout it trained on)",
            "count": int(len(calibration)),
            "sha256": digest,
        }
        record["trained"]["ranges"] = policy.actor.ranges.asnumpy().tolist()
    return record


def trunk_tensors(onnx_path: Path, policy: ActorCritic) -> list[str]:
    """The trunk's tensors in ``activation_ranges``' order, by the names Lite's converter gives them (the ONNX node
    that produces each, or the graph input): the first Dense's input, then each Dense's and each activation's output."""
    import onnx

    nodes = list(onnx.load(str(onnx_path)).graph.node)
    producer = {out: n.name for n in nodes for out in n.output}
    names: list[str] = []
    actor = policy.actor
    for k, i in enumerate(actor.dense_index):
        weight = f"actor.layers.{i}.weight"
        gemm = next((n for n in nodes if any(x.endswith(weight) for x in n.input)), None)
        if gemm is None:
            raise ExportCheckFailed(f"{onnx_path.name} has no node reading {weight}")
        names += [producer.get(gemm.input[0], gemm.input[0]), gemm.name] if k == 0 else [gemm.name]
        if k < len(actor.dense_index) - 1:
            names.append(next(n.name for n in nodes if gemm.output[0] in n.input))
    return names


def check_ranges(ms_path: Path, onnx_path: Path, policy: ActorCritic) -> dict[str, Any]:
    """The scales and zero points Lite's converter gave the trunk's tensors, read back from the ``.ms``, against the
    ones its trained ranges give: equal up to float32 rounding of the calibration forward, or export fails."""
    from inference.bundle.ms_file import ms_tensors

    found = {t.name: t for t in ms_tensors(ms_path) if t.quantized}
    scale, zero = act_qparams(policy.actor.ranges.asnumpy()).T
    actor = policy.actor
    lowered = [k for k in range(len(actor.dense_index)) if k not in actor.kept_dense]
    names = trunk_tensors(onnx_path, policy)
    worst, zeros = 0.0, 0
    checked = sorted({t for d in lowered for t in (2 * d, 2 * d + 1)})  # each lowered Dense's input and output
    for k in checked:
        name = names[k]
        tensor = found.get(name)
        if tensor is None or len(tensor.scales) != 1:
            raise ExportCheckFailed(f"{ms_path.name}: the trunk tensor {name!r} is not quantized per tensor")
        worst = max(worst, abs(tensor.scales[0] / float(scale[k]) - 1))
        zeros += tensor.zero_points[0] != int(zero[k])
    if worst > RANGE_RTOL or zeros:
        raise ExportCheckFailed(f"{ms_path.name}: Lite's converter did not calibrate the trained ranges (scale off by "
                                f"{worst:.2e} relative, {zeros} zero point(s) off)")  # fmt: skip
    return {"tensors": len(checked), "max_scale_rel_diff": worst, "zero_points_equal": True}
