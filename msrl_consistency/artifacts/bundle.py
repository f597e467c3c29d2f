"""Turn a training run into a deployable bundle: graphs in every format, a manifest, a self-check.

The bundle is assembled in a temporary directory and renamed into place only after every written
graph has been run against the Cell it came from; a bundle that fails its self-check never appears.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from mindspore import Tensor

from inference.bundle import MANIFEST, SCHEMA, SCHEMA_VERSION, Bundle, load_bundle
from msrl_consistency import __version__, compat
from msrl_consistency.agent import ActorCritic, PolicySpec
from msrl_consistency.artifacts import graphs as G
from msrl_consistency.artifacts import run_dir as rd
from msrl_consistency.artifacts.checkpoint import load_policy
from msrl_consistency.artifacts.files import sha256_file, write_json_atomic
from msrl_consistency.artifacts.mindir import mindir_version
from msrl_consistency.artifacts.provenance import git_commit, versions
from msrl_consistency.compare.feeds import seeded_feeds
from msrl_consistency.compare.stats import TOLERANCE_PRESETS, compare_arrays, tolerance_for
from msrl_consistency.errors import MsrlError, UsageError, first_line

FORMATS = ("mindir", "onnx", "ms")
SELF_CHECK_RUNTIMES = {"mindir": "ms-mindir", "onnx": "onnxruntime", "ms": "lite"}


class ExportCheckFailed(MsrlError):
    """A written graph disagrees with its Cell: the bundle is discarded (exit 1)."""

    exit_code = 1


@dataclass
class ExportOptions:
    precision: str = "fp32"
    formats: tuple[str, ...] = FORMATS
    check_samples: int = 256
    check_seed: int = 0
    require_lite: bool = False
    notes: dict[str, Any] = field(default_factory=dict)


def normalization_hash(policy: ActorCritic) -> str:
    """SHA-256 of the frozen float32 mean and variance that the graphs carry."""
    digest = hashlib.sha256()
    digest.update(policy.normalizer.mean.asnumpy().astype(np.float32).tobytes())
    digest.update(policy.normalizer.var.asnumpy().astype(np.float32).tobytes())
    digest.update(np.float32(policy.normalizer.clip).tobytes() + bytes([policy.normalizer.enabled]))
    return digest.hexdigest()


def load_run(ckpt: Path) -> tuple[dict[str, Any], PolicySpec, ActorCritic]:
    run = rd.read_run_json(ckpt.parent)
    spec = PolicySpec.from_dict(run["policy_spec"])
    return run, spec, load_policy(ckpt, spec)


def export_bundle(
    ckpt: Path, out: Path, options: ExportOptions, policy: ActorCritic | None = None, force: bool = False
) -> Bundle:
    """Export ``ckpt`` (with its run.json beside it) to ``out``. ``policy`` overrides the loaded Cell,
    which is how tests build deliberately broken bundles."""
    if options.precision not in TOLERANCE_PRESETS:
        raise UsageError(f"--precision must be fp32 or fp16, got {options.precision!r}")
    unknown = sorted(set(options.formats) - set(FORMATS))
    if unknown:
        raise UsageError(f"unknown format(s) {unknown}; choose from {', '.join(FORMATS)}")
    if out.exists() and any(out.iterdir()) and not force:
        raise UsageError(f"{out} already exists; pass --force to replace it")
    compat.set_device("cpu")
    run, spec, loaded = load_run(ckpt)
    reference = policy if policy is not None else loaded
    if options.precision == "fp16":
        exported = ActorCritic(spec)
        for (_, dst), (_, src) in zip(exported.parameters_and_names(), reference.parameters_and_names(), strict=True):
            dst.set_data(src.value())
    else:
        exported = reference
    heads = G.export_heads(exported, options.precision)
    contract = G.graph_specs(spec)

    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        graphs: dict[str, Any] = {}
        for name, cell in heads.items():
            graphs[name] = {**contract[name].to_dict(), "files": _write_graph(cell, contract[name], tmp, options)}
        manifest = _manifest(run, ckpt, spec, reference, graphs, options)
        write_json_atomic(tmp / MANIFEST, manifest)
        check = _self_check(load_bundle(tmp), heads, options)
        manifest["self_check"] = check
        manifest["exporter"]["lite_sdk"] = check.pop("lite_version", None)
        write_json_atomic(tmp / MANIFEST, manifest)
        if not check["passed"]:
            raise ExportCheckFailed(f"export self-check failed, bundle discarded: {check['failures'][0]}")
        _replace_dir(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return load_bundle(out)


def _write_graph(cell: Any, contract: G.GraphSpec, tmp: Path, options: ExportOptions) -> dict[str, Any]:
    files: dict[str, Any] = {}
    base = tmp / contract.name
    if "mindir" in options.formats:
        files["mindir"] = _entry(G.write_mindir(cell, contract, base.with_suffix(".mindir")))
    if options.precision == "fp16" and ("onnx" in options.formats or "ms" in options.formats):
        # MindSpore 2.10 writes the fp16 graph's Clip bounds as fp32, which ONNX Runtime and the converter reject.
        reason = "fp16 ONNX from MindSpore 2.10 is invalid (fp32 Clip bounds in an fp16 graph); use the fp16 MindIR"
        return {**files, **{fmt: {"skipped": reason} for fmt in ("onnx", "ms") if fmt in options.formats}}
    if "onnx" in options.formats or "ms" in options.formats:
        try:
            onnx_path = G.write_onnx(cell, contract, base.with_suffix(".onnx"))
            files["onnx"] = _entry(onnx_path)
        except Exception as exc:  # noqa: BLE001 - MindSpore's ONNX exporter raises assorted types
            files["onnx"] = {"skipped": f"ONNX export failed: {first_line(exc)}"}
            onnx_path = None
    if "ms" in options.formats:
        if onnx_path is None:
            files["ms"] = {"skipped": "needs the ONNX graph, which failed to export"}
        else:
            try:
                files["ms"] = _entry(G.write_lite(onnx_path, base.with_suffix(".ms")))
            except G.ConversionError as exc:
                if options.require_lite:
                    raise UsageError(str(exc)) from None
                files["ms"] = {"skipped": str(exc)}
    if "onnx" not in options.formats and "onnx" in files and "file" in files["onnx"]:
        (tmp / files.pop("onnx")["file"]).unlink()
    return files


def _entry(path: Path) -> dict[str, Any]:
    fmt = path.suffix.lstrip(".")
    entry: dict[str, Any] = {
        "file": path.name,
        "format": fmt,
        "sha256": sha256_file(path),
        "bytes": path.stat().st_size,
    }
    if fmt == "mindir":
        entry["mind_ir_version"] = mindir_version(path)
    return entry


def _manifest(
    run: dict[str, Any],
    ckpt: Path,
    spec: PolicySpec,
    policy: ActorCritic,
    graphs: dict[str, Any],
    options: ExportOptions,
) -> dict[str, Any]:
    mindir_versions = {g["files"]["mindir"]["mind_ir_version"] for g in graphs.values() if "mindir" in g["files"]}
    post = None
    if not spec.discrete:
        post = {"mode": spec.action_postprocess, "low": spec.action_low, "high": spec.action_high}
    return {
        "schema": SCHEMA,
        "schema_version": SCHEMA_VERSION,
        "created": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "env_id": run["env_id"],
        "env": run["env"],
        "policy_spec": spec.to_dict(),
        "precision": options.precision,
        "action_postprocess": post,
        # State-independent std of the Gaussian head: lets a verifier compute KL from the exported mean alone.
        "gaussian_log_std": None if spec.discrete else policy.log_std.asnumpy().tolist(),
        "normalization": {
            "enabled": spec.normalize_obs,
            "clip": spec.clip_obs,
            "mean": policy.normalizer.mean.asnumpy().tolist(),
            "var": policy.normalizer.var.asnumpy().tolist(),
            "sha256": normalization_hash(policy),
        },
        "noise": {
            "kind": spec.noise_kind,
            "dim": spec.noise_dim,
            "generator": "numpy.random.Generator(PCG64): random() for uniform, standard_normal() for normal, float32",
            "training_stream": run["seeds"]["noise"],
        },
        "source": {
            "checkpoint": str(ckpt.resolve()),
            "checkpoint_sha256": sha256_file(ckpt),
            "run_json_sha256": sha256_file(ckpt.parent / rd.RUN_JSON),
            "global_step": run["global_step"],
            "train_versions": run["versions"],
            "git_commit": run.get("git_commit"),
        },
        "seeds": {"train": run["seeds"], "self_check": options.check_seed},
        "exporter": {
            **versions("mindspore", "numpy", "onnx"),
            "msrl_consistency": __version__,
            "git_commit": git_commit(),
            "mind_ir_version": max(mindir_versions) if mindir_versions else None,
        },
        "graphs": graphs,
        **({"notes": options.notes} if options.notes else {}),
    }


def _self_check(bundle: Bundle, heads: dict[str, Any], options: ExportOptions) -> dict[str, Any]:
    """Run every written graph on ``check_samples`` seeded observations against the Cell it came from."""
    from msrl_consistency.runtimes.base import RuntimeSource
    from msrl_consistency.runtimes.registry import create

    feeds = seeded_feeds(bundle, options.check_samples, options.check_seed)
    source = RuntimeSource(bundle)
    results: list[dict[str, Any]] = []
    failures: list[str] = []
    lite_version = None
    for graph, cell in heads.items():
        inputs = [feeds.obs] if graph == "policy" else [feeds.obs, feeds.noise]
        with compat.execution_mode(graph=True):
            expected = [o.asnumpy() for o in cell(*[Tensor(x) for x in inputs])]
        names = [o["name"] for o in bundle.graph(graph)["outputs"]]
        for fmt, entry in bundle.graph(graph)["files"].items():
            if "file" not in entry:
                continue
            runtime = create(SELF_CHECK_RUNTIMES[fmt], source, graph)
            reason = runtime.unavailable_reason(source)
            if reason:
                results.append({"graph": graph, "format": fmt, "skipped": reason})
                continue
            tol = tolerance_for(options.precision, runtime.name)
            try:
                with runtime:
                    got = runtime.infer(*inputs)
                    lite_version = runtime.versions().get("mindspore_lite", lite_version)
            except Exception as exc:  # noqa: BLE001 - any runtime failure means the written graph is unusable
                failures.append(f"{graph}.{fmt} does not run in {runtime.name}: {first_line(exc)}")
                continue
            worst = 0.0
            for name, ref in zip(names, expected, strict=True):
                cmp = compare_arrays(name, ref, got[name], tol)
                worst = max(worst, cmp.max_abs)
                if not cmp.passed:
                    failures.append(
                        f"{graph}.{fmt} output {name}: {cmp.mismatches}/{cmp.count} elements off "
                        f"(max abs {cmp.max_abs:.3g})"
                    )
            results.append(
                {"graph": graph, "format": fmt, "runtime": runtime.name, "max_abs": worst, "tolerance": tol.to_dict()}
            )
    return {
        "passed": not failures,
        "samples": options.check_samples,
        "seed": options.check_seed,
        "tolerance": options.precision,
        "results": results,
        "failures": failures,
        "lite_version": lite_version,
    }


def _replace_dir(tmp: Path, out: Path) -> None:
    """Swap the finished bundle into place; an existing one is moved aside first and removed after."""
    old = None
    if out.exists():
        old = out.with_name(f".{out.name}.old")
        shutil.rmtree(old, ignore_errors=True)
        out.rename(old)
    tmp.rename(out)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def describe(bundle: Bundle) -> str:
    lines = [f"bundle {bundle.root} ({bundle.env_id}, {bundle.manifest['precision']})"]
    for name, graph in bundle.manifest["graphs"].items():
        files = ", ".join(e.get("file", f"{fmt}: skipped") for fmt, e in graph["files"].items())
        lines.append(f"  {name}: {files}")
    check = bundle.manifest["self_check"]
    worst = max((r.get("max_abs", 0.0) for r in check["results"]), default=0.0)
    lines.append(f"  self-check: {check['samples']} observations, worst max |diff| {worst:.2e}")
    return "\n".join(lines)
