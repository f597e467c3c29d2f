"""Where a run came from, for ``report.json``'s ``provenance`` section: the command that reproduces it, the hashes
of what was compared, the versions on both sides, the seeds, and the precision each runtime computes in.

Recorded when the run is written, so a report read later (the page, ``inference.report diff``) needs nothing but
the report itself.
"""

from __future__ import annotations

import os
import platform
import shlex
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from inference.compare.checks import VerifyResult

# Environment variables that change what a run does (which Lite path, which device): part of the command.
_ENV_PREFIXES = ("MSRL_", "ASCEND_")
_ENV_SECRETS = ("TOKEN", "KEY", "SECRET", "PASS")


def invocation(module: str, argv: Sequence[str] | None) -> list[str]:
    """The command line of ``python -m module`` as it ran: this interpreter, the module and its arguments."""
    return [sys.executable, "-m", module, *(sys.argv[1:] if argv is None else argv)]


def command(argv: Sequence[str] | None) -> dict[str, Any] | None:
    """The command to reproduce the run: its arguments, the directory it ran in, the environment variables that
    steer it, and the whole as one shell line. None when the run did not come from a command line."""
    if not argv:
        return None
    env = {k: v for k, v in sorted(os.environ.items())
           if k.startswith(_ENV_PREFIXES) and not any(s in k for s in _ENV_SECRETS)}  # fmt: skip
    cwd = os.getcwd()
    line = " ".join([f"cd {shlex.quote(cwd)} &&", *(f"{k}={shlex.quote(v)}" for k, v in env.items()),
                     shlex.join(argv)])  # fmt: skip
    return {"argv": list(argv), "cwd": cwd, "env": env, "shell": line}


def runtime_precision(name: str, precision: str, manifest: dict[str, Any], device: str) -> str:
    """What a runtime computes in on this bundle: the training Cell in fp32, the graph formats as exported (an fp16
    bundle's MindIR computes its layers in fp16; its ``.ms`` stores fp16 weights that Lite's CPU kernels compute
    with in fp32, since the runner leaves Lite's fp16 mode off)."""
    own = name.split(":", 1)[1] if name.startswith("field:") else name
    if own in ("ms-cell", "ms-graph"):
        text = "fp32 (the training Cell)"
    elif own in ("ms-mindir", "lite-mindir"):
        text = "fp16 layers, fp32 inputs and outputs (fp16 MindIR)" if precision == "fp16" else "fp32 (MindIR)"
    elif own in ("lite", "lite-python", "lite-isolated", "lite-inprocess"):
        weights = {(g.get("files") or {}).get("ms", {}).get("weights") for g in (manifest.get("graphs") or {}).values()
                   if isinstance(g, dict)}  # fmt: skip
        text = "fp32 math on fp16 weights (.ms)" if "float16" in weights else "fp32 (.ms)"
    elif own == "onnxruntime":
        text = "fp32 (ONNX)"
    else:
        text = f"as exported ({precision})"
    if device == "ascend" and own not in ("ms-cell", "ms-graph", "onnxruntime"):
        mode = (manifest.get("target") or {}).get("precision_mode")
        text += f"; on Ascend with the bundle's precision mode {mode}" if mode else "; on Ascend: no precision mode"
    return f"{text}, as recorded on the device" if name.startswith("field:") else text


def host() -> dict[str, Any]:
    """This box: Python, NumPy, the OS and CPU architecture, and CANN where an Ascend toolkit is installed."""
    import numpy as np

    info: dict[str, Any] = {"python": platform.python_version(), "numpy": np.__version__,
                            "platform": platform.platform(terse=True), "machine": platform.machine()}  # fmt: skip
    try:
        from inference.machine.facts import cann_info

        cann = cann_info()
    except Exception:  # noqa: BLE001 - a version probe never stops a report from being written
        cann = None
    if cann:
        info["cann"] = cann["version"]
    return info


def provenance(result: VerifyResult) -> dict[str, Any]:
    """The ``provenance`` section of ``report.json``."""
    bundle = result.bundle
    manifest = bundle.manifest
    source = manifest.get("source") or {}
    files = {f"{graph}.{fmt}": entry["sha256"] for graph, g in (manifest.get("graphs") or {}).items()
             if isinstance(g, dict) for fmt, entry in (g.get("files") or {}).items()
             if isinstance(entry, dict) and entry.get("sha256")}  # fmt: skip
    check = next((c for c in result.checks if c.runtime == "bundle" and c.name == "provenance"), None)
    checkpoint = {"exported_from_sha256": source.get("checkpoint_sha256"), "exported_from": source.get("checkpoint")}
    if check is not None:
        checkpoint |= {"path": check.metrics.get("checkpoint"), "sha256": check.metrics.get("checkpoint_sha256")}
    device = result.options.device
    return {
        "command": command(result.command),
        "host": host(),
        "device": device if device == "cpu" else f"{device}:{result.options.device_id}",
        "bundle_files": files,
        "checkpoint": checkpoint,
        "versions": {
            "exporter": manifest.get("exporter") or {},
            "training": source.get("train_versions") or {},
            "runtimes": {n: i.get("versions") for n, i in result.runtimes.items() if i.get("versions")},
        },
        "seeds": {"verify": result.reference.seed, "bundle": manifest.get("seeds") or {}},
        "precision": {
            name: (info.get("precision") or {}).get("why")
            or runtime_precision(name, bundle.precision, manifest, device)
            for name, info in result.runtimes.items()
        },  # fmt: skip
        "target": bundle.target,
        "plan": {k: v for k, v in (bundle.plan or {}).items() if k in ("lower", "kept", "bounds", "calibration")}
        or None,
    }
