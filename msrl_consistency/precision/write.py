"""The plan's bundle: the source bundle's files with a ``.ms`` that follows the plan, its Lite configurations, the
plan in the manifest (each layer's precision and sensitivity, the calibration source, the acceptance bounds and the
measured element-wise tolerance) and ``plan.md``. Written into a temporary directory and renamed into place.

* int8: each graph's ``.ms`` quantized with the kept layers' nodes in ``skip_quant_node``, and the converter
  configuration it was converted with (``lite_converter.<graph>.cfg``);
* fp16: the float32 ``.ms`` and, per graph, Lite's runtime configuration for mixed precision
  (``lite_runtime.<graph>.cfg``: ``[execution_plan]``, the kept layers' kernels in float32, the rest in float16),
  which Lite applies with its fp16 CPU kernels (ARM builds) or an Ascend target's fp16 mode. This host's verify
  judges the plan on ``emulated-fp16``, which follows the same kept layers.
"""

from __future__ import annotations

import datetime as dt
import json
import shutil
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from inference.bundle import MANIFEST, Bundle, load_bundle
from inference.bundle.files import replace_dir, sha256_file, write_json_atomic
from inference.bundle.precision import runtime_config
from inference.errors import UsageError
from msrl_consistency.precision.layers import Layer, kept_nodes
from msrl_consistency.precision.search import SearchResult


def write_plan_bundle(
    source: Bundle, out: Path, layers: Sequence[Layer], result: SearchResult, plan: dict[str, Any],
    lowering: Any, force: bool = False,
) -> Bundle:  # fmt: skip
    """Write the plan's bundle to ``out`` (see the module docstring); ``plan`` is the manifest's ``plan`` section."""
    if out.resolve() == source.root.resolve():
        raise UsageError(f"--out {out} is the source bundle: write the plan's bundle elsewhere")
    if out.exists() and (not out.is_dir() or (any(out.iterdir()) and not force)):
        raise UsageError(f"{out} already exists; pass --force to replace it")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        for item in source.root.iterdir():
            if item.is_file() and item.name not in ("plan.md",):
                shutil.copyfile(item, tmp / item.name)
        manifest = json.loads((source.root / MANIFEST).read_text())
        kept = result.kept
        for graph in source.graphs:
            entry = manifest["graphs"][graph]["files"].get("ms") or {}
            if plan["lower"] == "fp16" and "file" not in entry:
                continue  # no .ms to carry Lite's execution plan: the plan is judged on the emulation
            if plan["lower"] == "int8":
                ms, text = lowering.copy_out(graph, kept, tmp / entry["file"])
                config = tmp / f"lite_converter.{graph}.cfg"
                config.write_text(text)
                entry.update(sha256=sha256_file(ms), bytes=ms.stat().st_size,
                             converter_config={"file": config.name, "sha256": sha256_file(config)},
                             weights=f"int8 ({plan['quantization']} quantization), kept in fp32: "
                             f"{', '.join(sorted(kept)) or 'none'}")  # fmt: skip
            else:
                keep = set(kept_nodes(layers, kept, graph))
                nodes = [n for layer in layers for n in layer.nodes.get(graph, [])]
                config = tmp / f"lite_runtime.{graph}.cfg"
                config.write_text(runtime_config({n: "float32" if n in keep else "float16" for n in nodes}))
                entry["runtime_config"] = {"file": config.name, "sha256": sha256_file(config)}
        target = manifest.get("target") or {"device": "cpu", "precision_mode": None}
        target["computes_in"] = plan["lower"]
        if "converter_config" not in target:
            base = tmp / "lite_converter.cfg"
            base.write_text("# the source bundle named no converter configuration: Lite's defaults\n")
            target["converter_config"] = {"file": base.name, "sha256": sha256_file(base)}
        manifest["target"] = target
        manifest["plan"] = plan
        manifest["created"] = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
        manifest["self_check"] = {
            "passed": result.final.ok, "samples": int(plan["evaluation"]["states"]),
            "results": [{"runtime": "plan", "graph": g, "max_abs": 0.0, "passed": result.final.ok}
                        for g in source.graphs],
            "failures": [], "note": "the plan's own evaluation (plan.final); verify judges the bundle in full",
        }  # fmt: skip
        write_json_atomic(tmp / MANIFEST, manifest)
        (tmp / "plan.md").write_text(plan_markdown(source, layers, result, plan))
        load_bundle(tmp)  # the plan's bundle reads back: schema, hashes, configurations
        replace_dir(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return load_bundle(out)


def _num(value: Any, fmt: str) -> str:
    return format(value, fmt) if isinstance(value, int | float) else "–"


def plan_markdown(source: Bundle, layers: Sequence[Layer], result: SearchResult, plan: Mapping[str, Any]) -> str:
    graph = source.mode_graph("deterministic") or source.graphs[0]
    ev = plan["evaluation"]
    lines = [
        f"# Precision plan: {plan['lower']} for {source.env_id or source.root.name}", "",
        f"Kept in fp32: **{', '.join(plan['kept']) or 'none'}**; every other layer in {plan['lower']}"
        f"{' (' + plan['quantization'] + ' quantization)' if plan['lower'] == 'int8' else ''}.", "",
        f"- measured on: {ev['runtime']}, against the same graph unlowered; {ev['states']} states ({ev['source']}), "
        f"{ev['episodes']} paired seeded episodes per mode",
        f"- calibration: {(plan.get('calibration') or {}).get('source', 'none (fp16 needs none)')}",
        f"- search: {plan['search']['method']}; {plan['search']['evaluations']} candidates evaluated",
        f"- bounds: {', '.join(f'{k} {v}' for k, v in plan['bounds'].items() if v is not None)}",
        f"- element-wise tolerance verify applies to the lowered runtime: {plan['tolerance']}", "",
        f"## Each layer lowered alone (graph `{graph}`)", "",
        "| layer | type | cost | precision | mean exp\\|Δ log π\\| | ESS | k3 KL | flip rate (95% UCB) | "
        "p99 \\|Δμ\\|/σ | return Δ | badness | alone |", "|---|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---|",
    ]  # fmt: skip
    for layer in plan["layers"]:
        s = layer.get("sensitivity") or {}
        g = s.get(graph) or {}
        ret = max((r["difference"] for r in (s.get("returns") or {}).values()), default=None)
        flips = f"{_num(g.get('flip_rate'), '.2%')} ({_num(g.get('flip_rate_ucb'), '.2%')})" if "flip_rate" in g \
            else "–"  # fmt: skip
        lines.append(f"| {layer['scope']} | {layer['kind']} | {layer['cost']} | {layer['precision']} | "
                     f"{_num(g.get('mean_exp_abs'), '.5f')} | {_num(g.get('ess'), '.4f')} | "
                     f"{_num(g.get('k3_kl'), '.2e')} | {flips} | {_num(g.get('mean_shift_in_std_p99'), '.3f')} | "
                     f"{_num(ret, '.1%')} | "
                     f"{_num(s.get('badness'), '.3g')} | {'within' if s.get('ok') else 'beyond'} |")  # fmt: skip
    lines += ["", "## The plan, and every layer lowered", "",
              "| candidate | kept in fp32 | within the bounds | badness | what breaks |", "|---|---|---|---:|---|"]
    for name, ev in (("plan", plan["final"]), ("every layer lowered", plan["all_lowered"])):
        kept = ", ".join(plan["kept"]) if name == "plan" else "none"
        lines.append(f"| {name} | {kept or 'none'} | {'yes' if ev['ok'] else 'no'} | {_num(ev['badness'], '.3g')} | "
                     f"{'; '.join(ev.get('broken', [])) or '–'} |")  # fmt: skip
    lines += ["", "Verify the plan's bundle (exit 0 under the plan's bounds):", "",
              f"    python -m msrl_consistency.verify --bundle {plan.get('bundle', 'PLAN')} --ckpt CKPT", ""]
    return "\n".join(lines)
