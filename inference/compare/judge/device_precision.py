"""What each runtime computes a bundle in here, and so what it is judged with: its tolerance preset, element-wise
tolerance and policy-level bounds, with the reason in words for the report.

* ``lite``: what the bundle's target makes Lite compute in on this device (``bundle.precision.lite_precision``: an
  Ascend precision mode, an int8 plan's quantized kernels, an fp16 plan where this Lite build has fp16 kernels);
* ``emulated-fp16``: fp16 (an fp16 plan's kept layers in fp32), an emulation on this CPU;
* the MindSpore and ONNX Runtime paths: the graphs' own precision.

``--tolerance`` overrides the preset of every runtime. The verifier owns every bar: a runtime that computes a precision
plan's lowered layers is judged with the preset of the precision it computes in (``int8`` or ``fp16``), never with
numbers the bundle carries; a plan's recorded bounds may only tighten them (``PolicyBounds.tightened``), and the plan
itself is checked against the files it describes before anything runs (``inference.bundle.plan_claims``).
"""

from __future__ import annotations

import platform
from dataclasses import dataclass
from typing import Any

from inference.bundle import Bundle
from inference.bundle.precision_mode import DevicePrecision, lite_precision
from inference.compare.judge.policy_bounds import POLICY_BOUNDS, TRAINED_BOUNDS, PolicyBounds
from inference.compare.judge.stats import PRESETS, Preset, Tolerance, tolerance_for

LITE_RUNTIMES = ("lite", "lite-mindir", "lite-python")


@dataclass(frozen=True)
class Judgement:
    preset: Preset
    tolerance: Tolerance  # every output's default (``--tol`` overrides per output)
    policy: PolicyBounds
    info: dict[str, Any]  # for the report: precision_mode, computes_in, why, judged_as


def runtime_precision(bundle: Bundle, name: str, device: str) -> DevicePrecision:
    """What ``name`` computes ``bundle`` in on ``device`` here (``PrecisionModeMissing`` for Lite on Ascend without
    a mode)."""
    plan = bundle.plan or {}
    if name == "emulated-fp16":
        from inference.runtimes.emulated import EMULATION_NOTE

        kept = ", ".join(plan.get("kept") or []) if plan.get("lower") == "fp16" else ""
        why = f"fp16: {EMULATION_NOTE}" + (f"; the plan's kept layers in fp32 ({kept})" if kept else "")
        return DevicePrecision(None, "fp16", why, "fp16")
    if name in LITE_RUNTIMES:
        return lite_precision(bundle.manifest, device, platform.machine(), f"bundle {bundle.root}")
    own = "the training Cell" if name in ("ms-cell", "ms-graph") else "the exported graph"
    return DevicePrecision(None, bundle.precision, f"{bundle.precision}: {own} in its own precision")


def judgement(bundle: Bundle, name: str, device: str, tolerance: str | None) -> Judgement:
    """The preset, tolerance and policy bounds ``name`` is judged with, and why (``tolerance``: ``--tolerance``)."""
    precision = runtime_precision(bundle, name, device)
    preset_name = tolerance or precision.preset
    preset_name = preset_name if preset_name in PRESETS else bundle.precision
    preset, tol, bounds = PRESETS[preset_name], tolerance_for(preset_name, name), POLICY_BOUNDS[preset_name]
    plan = bundle.plan or {}
    trained = plan.get("lower") == preset_name and bool(plan.get("trained")) and preset_name in TRAINED_BOUNDS
    if trained:  # against the Cell trained in these numerics (``verifier.TrainedReference``)
        bounds = TRAINED_BOUNDS[preset_name]
    elif plan.get("lower") == preset_name:  # the plan's own numbers, where stricter than the verifier's
        bounds = bounds.tightened(plan.get("bounds"))
    info = {**precision.to_dict(), "judged_as": preset_name,
            "tolerance": {**tol.to_dict(), "rule": tol.describe()}, "bounds": bounds.to_dict()}  # fmt: skip
    if trained:
        info["why"] += f"; against the Cell trained in {preset_name}: the verifier's bounds for a policy trained so"
    if tolerance:
        info["why"] += f" (judged as {tolerance}: --tolerance)"
    return Judgement(preset, tol, bounds, info)


def emulation_wanted(bundle: Bundle, emulate: str | None, device: str) -> bool:
    """Whether verify adds ``emulated-fp16``: asked for, or the bundle's device computes in fp16 and this is not it
    (an Ascend target in an fp16 mode, an fp16 plan)."""
    if emulate == "fp16":
        return True
    plan = bundle.plan or {}
    return device == "cpu" and (bundle.target.get("computes_in") == "fp16" or plan.get("lower") == "fp16") and \
        bundle.precision == "fp32"  # fmt: skip
