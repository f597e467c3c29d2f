"""The precision a device computes a bundle in: its target, the Lite precision mode, and the plan, from the manifest.

On Ascend, MindSpore Lite runs a float32 graph in float16 unless told otherwise: the converter's ``[ascend_context]
precision_mode`` and the runtime's ``AscendDeviceInfo::SetPrecisionMode`` both default to ``enforce_fp16``. A
bundle exported for an Ascend target therefore names its mode explicitly (``export --target ascend310
--precision-mode ...``): the converter configuration it used is a file of the bundle, the manifest's ``target``
records the mode and what the device computes in, and Lite is handed that mode instead of its default. An Ascend
run whose mode would be left to Lite's default is refused (``PrecisionModeMissing``), naming the default.

On the CPU, Lite's fp16 kernels exist only in its ARM builds (ARMv8.2 fp16 arithmetic); the x86_64 build computes
every kernel in float32 even with ``CPUDeviceInfo::SetEnableFP16(true)`` (measured on Lite 2.0.0: every kernel's
output stays float32 and the answers are bitwise those of fp16 off). ``cpu_fp16_honoured`` says so per architecture.

A manifest without ``target`` is a CPU bundle (the schema's default, which the report's defaults list).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

TARGETS = ("cpu", "ascend310", "ascend310p", "ascend910b")
ASCEND_TARGETS = TARGETS[1:]
# Lite's Ascend precision modes (converter ``[ascend_context] precision_mode`` and AscendDeviceInfo::SetPrecisionMode
# take the same names in Lite 2.x) and what each computes a float32 graph in. ``origin``: the graph's own dtype.
ASCEND_MODES: dict[str, str] = {
    "enforce_fp32": "fp32",
    "enforce_origin": "origin",
    "preferred_fp32": "fp32 where the operator has an fp32 kernel, else fp16",
    "preferred_optimal": "mixed: fp16 where Ascend's mix list allows it",
    "enforce_fp16": "fp16",
}
LITE_DEFAULT_MODE = "enforce_fp16"
LOWERED = ("fp16", "int8")  # what a precision plan lowers its layers to
CONVERTER_CONFIG = "lite_converter.cfg"
# On the CPU the same argument asks Lite for its fp16 kernels (CPUDeviceInfo::SetEnableFP16).
CPU_MODES = ("enforce_fp32", "enforce_fp16")


class PrecisionModeMissing(ValueError):
    """An Ascend run of a bundle that names no precision mode: Lite would pick its default (fp16)."""


def how_to_choose(target: str = "ascend310") -> str:
    return (f"choose one at export: --target {target} --precision-mode MODE (MODE one of {', '.join(ASCEND_MODES)}; "
            "enforce_origin keeps the graph's float32)")  # fmt: skip


def refusal(where: str, target: str = "ascend310") -> str:
    """The one line that refuses an Ascend run whose mode would be left to Lite's default."""
    return (f"{where} names no Ascend precision mode: Lite would use its default, {LITE_DEFAULT_MODE} (a float32 "
            f"graph computed in fp16); {how_to_choose(target)}")  # fmt: skip


def check_mode(mode: str, device: str = "ascend") -> None:
    modes = ASCEND_MODES if device == "ascend" else CPU_MODES
    if mode not in modes:
        raise ValueError(f"precision mode {mode!r} is not one of {', '.join(modes)} ({device})")


def computes_in(mode: str | None, graph_precision: str) -> str:
    """What a precision mode computes a graph of ``graph_precision`` in, as a tolerance preset: ``fp32`` or ``fp16``
    (the mixed modes compute some operators in fp16: they are judged as fp16)."""
    if mode is None or mode == "enforce_origin":
        return graph_precision
    return "fp32" if mode == "enforce_fp32" else "fp16"


def target_of(manifest: Mapping[str, Any]) -> dict[str, Any]:
    """The manifest's ``target``; without one, the CPU target (the schema's default)."""
    target = manifest.get("target")
    if isinstance(target, dict):
        return target
    return {"device": "cpu", "precision_mode": None, "computes_in": manifest.get("precision", "fp32")}


def plan_of(manifest: Mapping[str, Any]) -> dict[str, Any] | None:
    plan = manifest.get("plan")
    return plan if isinstance(plan, dict) else None


def config_files(manifest: Mapping[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """The Lite configuration files the manifest names (the target's, and each ``.ms`` file's), as (field, entry)."""
    target = manifest.get("target")
    found = [("target.converter_config", target["converter_config"])] if isinstance(target, dict) and \
        isinstance(target.get("converter_config"), dict) else []  # fmt: skip
    for name, graph in (manifest.get("graphs") or {}).items():
        entry = ((graph.get("files") or {}).get("ms") or {}) if isinstance(graph, dict) else {}
        found += [(f"graphs.{name}.files.ms.{key}", entry[key]) for key in ("converter_config", "runtime_config")
                  if isinstance(entry.get(key), dict)]  # fmt: skip
    return found


def file_entry(manifest: Mapping[str, Any], file_name: str) -> dict[str, Any]:
    """The manifest's entry of one graph file (``{}`` when it names none)."""
    for graph in (manifest.get("graphs") or {}).values():
        for entry in (graph.get("files") or {}).values() if isinstance(graph, dict) else ():
            if isinstance(entry, dict) and entry.get("file") == file_name:
                return entry
    return {}


def cpu_fp16_honoured(arch: str | None) -> bool:
    """Whether Lite's CPU kernels compute in fp16 when asked: only its ARM builds have fp16 kernels."""
    return arch in ("aarch64", "arm64")


@dataclass(frozen=True)
class DevicePrecision:
    """What one runtime computes a bundle in on a device: the Lite precision mode handed over (None: none applies),
    the tolerance preset it is judged with, and why, in words for the report."""

    precision_mode: str | None
    preset: str
    why: str
    computes_in: str | None = None  # when it is not the preset's name (a plan's int8 or fp16)

    def to_dict(self) -> dict[str, Any]:
        return {"precision_mode": self.precision_mode, "computes_in": self.computes_in or self.preset, "why": self.why}


def lite_precision(manifest: Mapping[str, Any], device: str, arch: str | None, where: str = "the bundle") -> \
        DevicePrecision:  # fmt: skip
    """The mode Lite is given for this bundle on ``device`` and what it then computes in (``PrecisionModeMissing``
    for an Ascend run of a bundle without a mode). ``arch``: this Lite build's CPU architecture."""
    target = target_of(manifest)
    graph_precision = manifest.get("precision", "fp32")
    mode = target.get("precision_mode")
    plan = plan_of(manifest)
    if device == "ascend":
        if target.get("device") not in ASCEND_TARGETS or not mode:
            raise PrecisionModeMissing(refusal(f"{where} (target {target.get('device', 'cpu')})"))
        preset = plan["lower"] if plan and plan.get("lower") in LOWERED else computes_in(mode, graph_precision)
        return DevicePrecision(mode, preset, f"Ascend precision mode {mode} ({ASCEND_MODES[mode]}), from the "
                               f"bundle's target {target['device']}", plan.get("lower") if plan else None)  # fmt: skip
    if plan and plan.get("lower") == "int8":
        kept = ", ".join(plan.get("kept") or []) or "none"
        return DevicePrecision(None, "int8", f"int8 plan: Lite's quantized kernels, kept in fp32: {kept}", "int8")
    if plan and plan.get("lower") == "fp16":
        if cpu_fp16_honoured(arch):
            return DevicePrecision("enforce_fp16", "fp16", "fp16 plan: Lite's fp16 CPU kernels, the kept layers "
                                   "in fp32 (its runtime configuration's execution plan)", "fp16")  # fmt: skip
        return DevicePrecision(None, "fp32", f"fp32: this Lite build ({arch or 'unknown'} CPU) has no fp16 kernels, "
                               "so the fp16 plan computes in fp32 here; emulated-fp16 judges the plan")  # fmt: skip
    weights = {(g.get("files") or {}).get("ms", {}).get("weights") for g in (manifest.get("graphs") or {}).values()
               if isinstance(g, dict)}  # fmt: skip
    how = "fp32 math on fp16 weights" if "float16" in weights else graph_precision
    return DevicePrecision(None, graph_precision, f"{how} on Lite's CPU kernels")


def bundle_of_model(model_path: str | Path) -> Mapping[str, Any] | None:
    """The manifest of the bundle a model file sits in (None for a file outside a bundle, or one that is not the
    manifest's), read without checks: only to find the precision mode the bundle names for the file."""
    import json

    path = Path(model_path)
    manifest = path.parent / "manifest.json"
    try:
        data = json.loads(manifest.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) and file_entry(data, path.name) else None


def converter_config(target: str, mode: str | None, sections: Mapping[str, Mapping[str, Any]] | None = None) -> str:
    """The Lite converter configuration (INI) an export used: ``[ascend_context] precision_mode`` for an Ascend
    target (always explicit), then ``sections`` (quantization, calibration)."""
    lines = [f"# MindSpore Lite converter configuration written by export for target {target}."]
    if target in ASCEND_TARGETS:
        if not mode:
            raise PrecisionModeMissing(refusal(f"--target {target}", target))
        lines += ["", "[ascend_context]", f"precision_mode={mode}"]
    elif not sections:
        lines.append("# cpu: no section applies (Lite's CPU kernels compute the graph in its own precision).")
    for name, values in (sections or {}).items():
        lines += ["", f"[{name}]", *(f"{k}={v}" for k, v in values.items())]
    return "\n".join(lines) + "\n"


def runtime_config(kernels: Mapping[str, str]) -> str:
    """Lite's runtime configuration for mixed precision (``Model::LoadConfig``): each kernel's data type."""
    lines = ["# MindSpore Lite runtime configuration: mixed-precision execution plan (kept layers in float32).",
             "[execution_plan]", *(f"{name}=data_type:{dtype}" for name, dtype in kernels.items())]  # fmt: skip
    return "\n".join(lines) + "\n"
