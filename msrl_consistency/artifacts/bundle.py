"""Write a deployable bundle: each graph in every format, a manifest, and a self-check before it appears.

The bundle is assembled in a temporary directory and renamed into place only after the caller's self-check
(``compare.selfcheck``, passed in so that writing artefacts does not depend on comparing them) has run every
written graph against the Cell it came from; a bundle that fails never appears. The same writer serves our
trainer's runs and any team's own Cell: only the graphs, their contracts and the manifest's source differ.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mindspore import nn

from inference.bundle import MANIFEST, SCHEMA, SCHEMA_VERSION, Bundle, load_bundle
from inference.bundle.contract import PolicyContract
from inference.bundle.files import replace_dir, sha256_file, write_json_atomic
from inference.bundle.mindir import mindir_version
from inference.bundle.precision_mode import (
    ASCEND_TARGETS,
    CONVERTER_CONFIG,
    TARGETS,
    check_mode,
    computes_in,
    converter_config,
    how_to_choose,
    refusal,
)
from inference.errors import INTERRUPTS, MsrlError, UsageError, first_line
from msrl_consistency import __version__, compat
from msrl_consistency.agent import ActorCritic
from msrl_consistency.artifacts import graphs as G
from msrl_consistency.artifacts.provenance import git_commit, versions

FORMATS = ("mindir", "onnx", "ms")
PRECISIONS = ("fp32", "fp16")


class ExportCheckFailed(MsrlError):
    """A format could not be produced or disagrees with its Cell (export's verdict: exit 1). When another format of
    every graph passed, the bundle is written with the failed ones marked (``bundle`` is set); else nothing is."""

    bundle: Bundle | None = None


@dataclass
class ExportOptions:
    precision: str = "fp32"
    formats: tuple[str, ...] = FORMATS
    check_samples: int = 256
    check_seed: int = 0
    require_lite: bool = False
    notes: dict[str, Any] = field(default_factory=dict)
    target: str = "cpu"  # the device the bundle is for (precision.TARGETS)
    precision_mode: str | None = None  # Lite's Ascend precision mode: required for an Ascend target

    def validate(self) -> None:
        if self.precision not in PRECISIONS:
            raise UsageError(f"--precision must be fp32 or fp16, got {self.precision!r}")
        if self.target not in TARGETS:
            raise UsageError(f"--target must be one of {', '.join(TARGETS)}, got {self.target!r}")
        if self.target in ASCEND_TARGETS and not self.precision_mode:
            raise UsageError(refusal(f"--target {self.target}", self.target))
        if self.target not in ASCEND_TARGETS and self.precision_mode:
            raise UsageError(f"--precision-mode is Lite's Ascend precision mode; --target {self.target} takes none "
                             f"({how_to_choose()})")  # fmt: skip
        if self.precision_mode:
            try:
                check_mode(self.precision_mode)
            except ValueError as exc:
                raise UsageError(f"--{exc}") from None
        unknown = sorted(set(self.formats) - set(FORMATS))
        if unknown or not self.formats:
            raise UsageError(f"--formats must be a subset of {', '.join(FORMATS)}, got {list(self.formats)}")
        if self.check_samples < 16:
            raise UsageError(f"--check-samples must be >= 16, got {self.check_samples}")


@dataclass
class GraphExport:
    """One graph to write: its I/O, the Cell that computes it, and the contract that says how it acts.

    ``fp32_cell`` (fp16 exports): the same graph in float32, the source of the ``.ms``, whose weights the Lite
    converter stores as float16 (MindSpore cannot export a valid fp16 ONNX to convert from).
    """

    io: G.GraphIO
    cell: nn.Cell
    contract: PolicyContract
    fp32_cell: nn.Cell | None = None


SelfCheck = Callable[[Bundle, dict[str, nn.Cell]], dict[str, Any]]


def half_precision(cell: nn.Cell, contract: PolicyContract, own_parameters: bool = False) -> nn.Cell:
    """An fp16 graph behind the float32 I/O contract (the Cell's layers are converted in place: pass a copy).

    The layers compute in fp16; the Cell's own ``construct`` is not converted (``to_float`` on it would cast its
    noise input to fp16 too), so the noise transform written there meets fp16 layer outputs in float32.
    ``own_parameters``: see ``compat.layers_to_float16``.
    """
    return G.Float16Policy(compat.layers_to_float16(cell, own_parameters), G.half_inputs(contract))


def write_bundle(
    out: Path, graphs: dict[str, GraphExport], manifest: dict[str, Any], options: ExportOptions, check: SelfCheck,
    force: bool = False,
) -> Bundle:  # fmt: skip
    """Write ``graphs`` and a manifest (``manifest`` holds the source-specific fields) to ``out``, atomically."""
    options.validate()
    if out.exists() and not out.is_dir():
        raise UsageError(f"--out {out} is a file, not a bundle directory")
    if out.exists() and any(out.iterdir()) and not force:
        raise UsageError(f"{out} already exists; pass --force to replace it")
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    except OSError as exc:
        raise UsageError(f"cannot write the bundle to {out.parent}: {exc.strerror or exc}") from None
    try:
        entries: dict[str, Any] = {}
        config = tmp / CONVERTER_CONFIG  # the converter configuration every .ms is converted with, kept in the bundle
        config.write_text(converter_config(options.target, options.precision_mode))
        for name, graph in graphs.items():
            files = _write_graph(graph, tmp, options, config)
            entries[name] = {**graph.io.to_dict(), "contract": graph.contract.to_dict(), "files": files}
        full = _manifest(manifest, entries, options)
        full["target"] = target_record(options.target, options.precision_mode, options.precision, config)
        write_json_atomic(tmp / MANIFEST, full)
        result = check(load_bundle(tmp), {name: g.cell for name, g in graphs.items()})
        full["exporter"]["lite_sdk"] = result.pop("lite_version", None)
        full["self_check"] = result
        for failure in result["failures"]:
            where = f"{failure['runtime']}: {failure['reason']}"
            entries[failure["graph"]]["files"][failure["format"]]["failed"] = where
        write_json_atomic(tmp / MANIFEST, full)
        failed = _failed_formats(entries)
        if failed and not _every_graph_has_a_format(entries):
            raise ExportCheckFailed(f"export failed, nothing written: {failed[0]}")
        INTERRUPTS.check()  # the last moment an interrupt keeps the bundle from appearing
        replace_dir(tmp, out)
    except OSError as exc:
        raise UsageError(f"cannot write the bundle to {out}: {exc.strerror or exc}") from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    bundle = load_bundle(out)
    if failed:
        kept = sorted({fmt for e in entries.values() for fmt, f in e["files"].items() if _usable(f)})
        error = ExportCheckFailed(f"{failed[0]}; the bundle keeps {', '.join(kept)} (the failed format is marked in "
                                  "its manifest)")  # fmt: skip
        error.bundle = bundle
        raise error
    return bundle


def _usable(entry: dict[str, Any]) -> bool:
    return "file" in entry and "failed" not in entry


def _failed_formats(entries: dict[str, Any]) -> list[str]:
    """One line per format that was asked for and could not be produced or failed its check."""
    return [f"{graph}.{fmt} failed: {f['failed']}" for graph, e in entries.items() for fmt, f in e["files"].items()
            if "failed" in f]  # fmt: skip


def _every_graph_has_a_format(entries: dict[str, Any]) -> bool:
    return all(any(_usable(f) for f in e["files"].values()) for e in entries.values())


def target_record(target: str, mode: str | None, precision: str, config: Path,
                  computes: str | None = None) -> dict[str, Any]:  # fmt: skip
    """The manifest's ``target``: the device, the Lite precision mode, what it computes in, the converter config."""
    return {"device": target, "precision_mode": mode, "computes_in": computes or computes_in(mode, precision),
            "converter_config": {"file": config.name, "sha256": sha256_file(config)}}  # fmt: skip


def _write_graph(graph: GraphExport, tmp: Path, options: ExportOptions, config: Path | None = None) -> dict[str, Any]:
    files: dict[str, Any] = {}
    base = tmp / graph.io.name
    if "mindir" in options.formats:
        substitutes: list[str] = []
        files["mindir"] = _entry(G.write_mindir(graph.cell, graph.io, base.with_suffix(".mindir"), substitutes))
        if substitutes:
            files["mindir"]["substitutes"] = substitutes
    fp16 = options.precision == "fp16"
    onnx_source = graph.fp32_cell if fp16 else graph.cell
    onnx_path = None
    if fp16 and "onnx" in options.formats:
        # MindSpore 2.10 writes an fp16 graph's Clip bounds as fp32, which ONNX Runtime and the converter reject.
        files["onnx"] = {"skipped": "fp16 ONNX from MindSpore 2.10 is invalid (fp32 Clip bounds in an fp16 graph); "
                         "the fp16 MindIR and the .ms (fp16 weights) are the fp16 artefacts"}  # fmt: skip
    onnx_failure = None
    if ("onnx" in options.formats and not fp16) or "ms" in options.formats:
        try:
            if onnx_source is None:
                raise G.ConversionError("an fp16 .ms needs the float32 graph to convert from")
            substitutes = []
            onnx_path = G.write_onnx(onnx_source, graph.io, base.with_suffix(".onnx"), substitutes)
            if not fp16:
                files["onnx"] = _entry(onnx_path)
                if substitutes:
                    files["onnx"]["substitutes"] = substitutes
        except G.ConversionError as exc:
            onnx_failure = str(exc)
        except Exception as exc:  # noqa: BLE001 - MindSpore's ONNX exporter raises assorted types
            hint = compat.onnx_export_hint(str(exc))
            onnx_failure = f"ONNX export: {first_line(exc)}{f' ({hint})' if hint else ''}"
        if onnx_failure is not None and "onnx" in options.formats:
            files.setdefault("onnx", {"failed": onnx_failure})
    if "ms" in options.formats:
        try:
            if onnx_path is None:
                raise G.ConversionError(f"the .ms is converted from the ONNX graph, which failed: {onnx_failure}")
            files["ms"] = _entry(G.write_lite(onnx_path, base.with_suffix(".ms"), fp16_weights=fp16, config=config))
            if config is not None:
                files["ms"]["converter_config"] = {"file": config.name, "sha256": sha256_file(config)}
            if fp16:
                files["ms"]["weights"] = "float16"
        except G.ConverterUnavailable as exc:
            if options.require_lite:
                raise UsageError(f"--require-lite: {exc}") from None
            files["ms"] = {"skipped": str(exc)}
        except G.ConversionError as exc:
            files["ms"] = {"failed": str(exc)}
    if onnx_path is not None and "file" not in files.get("onnx", {}):
        onnx_path.unlink()  # only the converter's input
    return files


def _entry(path: Path) -> dict[str, Any]:
    fmt = path.suffix.lstrip(".")
    entry: dict[str, Any] = {"file": path.name, "format": fmt, "sha256": sha256_file(path)}
    entry["bytes"] = path.stat().st_size
    if fmt == "mindir":
        entry["mind_ir_version"] = mindir_version(path)
    return entry


def _manifest(fields: dict[str, Any], graphs: dict[str, Any], options: ExportOptions) -> dict[str, Any]:
    mindir_versions = {g["files"]["mindir"]["mind_ir_version"] for g in graphs.values() if "mindir" in g["files"]}
    return {
        "schema": SCHEMA,
        "schema_version": SCHEMA_VERSION,
        "created": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "precision": options.precision,
        **fields,
        "seeds": {**fields.get("seeds", {}), "self_check": options.check_seed},
        "exporter": {
            **versions("mindspore", "numpy", "onnx"),
            "msrl_consistency": __version__,
            "git_commit": git_commit(),
            "mind_ir_version": max(mindir_versions) if mindir_versions else None,
        },
        "graphs": graphs,
        **({"notes": options.notes} if options.notes else {}),
    }


def normalization_hash(policy: ActorCritic) -> str:
    """SHA-256 of the frozen float32 mean and variance that the graphs carry."""
    import numpy as np

    digest = hashlib.sha256()
    digest.update(policy.normalizer.mean.asnumpy().astype(np.float32).tobytes())
    digest.update(policy.normalizer.var.asnumpy().astype(np.float32).tobytes())
    digest.update(np.float32(policy.normalizer.clip).tobytes() + bytes([policy.normalizer.enabled]))
    return digest.hexdigest()


def describe(bundle: Bundle) -> str:
    target = bundle.target
    mode = f", Lite precision mode {target['precision_mode']}" if target.get("precision_mode") else ""
    lines = [
        f"bundle {bundle.root} ({bundle.env_id or 'no env id'}, {bundle.precision}; target {target['device']}"
        f"{mode}, computes in {target['computes_in']})"
    ]
    for name, graph in bundle.manifest["graphs"].items():
        files = ", ".join(f"{fmt}: FAILED" if "failed" in e else e.get("file", f"{fmt}: skipped")
                          for fmt, e in graph["files"].items())  # fmt: skip
        lines.append(f"  {name}: {files}")
    ignored = (bundle.manifest.get("source") or {}).get("checkpoint_ignored")
    if ignored:
        from msrl_consistency.artifacts.checkpoint import describe_ignored

        lines.append(f"  checkpoint: not loaded: {describe_ignored(ignored)}")
    check = bundle.manifest["self_check"]
    worst = max((r.get("max_abs", 0.0) for r in check["results"]), default=0.0)
    lines.append(f"  self-check: {check['samples']} observations, worst max |diff| {worst:.2e}")
    if check.get("fp16_emulation"):
        lines.append(f"  fp16 on the target: {check['fp16_emulation']['reason']}")
    return "\n".join(lines)
