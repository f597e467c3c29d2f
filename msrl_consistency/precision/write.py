"""The plan's bundle: the source bundle's files with a ``.ms`` that follows the plan, its Lite configurations, the
plan in the manifest (each layer's precision and sensitivity, the calibration source, the verifier's bounds it was
judged with, the fingerprint of the float32 graphs it was made from) and ``plan.md``. Written into a temporary
directory and renamed into place.

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
from inference.bundle.precision_mode import runtime_config
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
    self_check = {
        "passed": result.final.ok, "samples": int(plan["judge"]["observations"]),
        "results": [{"runtime": plan["judge"]["runtime"], "graph": g, "max_abs": 0.0, "passed": result.final.ok}
                    for g in source.graphs],
        "failures": [], "note": "the plan search's own verdict on this bundle (plan.final): verify's checks of its "
        "lowered runtime; verify judges the bundle in full",
    }  # fmt: skip
    return write_bundle(source, out, layers, result.kept, plan, lowering, self_check,
                        plan_markdown(source, layers, result, plan))  # fmt: skip


def write_bundle(
    source: Bundle, out: Path, layers: Sequence[Layer], kept: frozenset[str], plan: dict[str, Any], lowering: Any,
    self_check: dict[str, Any] | None = None, markdown: str | None = None,
) -> Bundle:  # fmt: skip
    """The bundle of ``source`` with ``kept`` in fp32 and the rest lowered as ``plan`` says, written to a temporary
    directory and renamed to ``out`` (replacing it): a plan's bundle, or a candidate the search judges."""
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        for item in source.root.iterdir():
            if item.is_file() and item.name not in ("plan.md",):
                shutil.copyfile(item, tmp / item.name)
        manifest = json.loads((source.root / MANIFEST).read_text())
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
        if self_check is not None:
            manifest["self_check"] = self_check
        write_json_atomic(tmp / MANIFEST, manifest)
        if markdown is not None:
            (tmp / "plan.md").write_text(markdown)
        load_bundle(tmp)  # the plan's bundle reads back: schema, hashes, configurations
        replace_dir(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return load_bundle(out)


def _num(value: Any, fmt: str) -> str:
    return format(value, fmt) if isinstance(value, int | float) else "–"


def plan_markdown(source: Bundle, layers: Sequence[Layer], result: SearchResult, plan: Mapping[str, Any]) -> str:
    graph = source.mode_graph("deterministic") or source.graphs[0]
    ev = plan["judge"]
    lines = [
        f"# Precision plan: {plan['lower']} for {source.env_id or source.root.name}", "",
        f"Kept in fp32: **{', '.join(plan['kept']) or 'none'}**; every other layer in {plan['lower']}"
        f"{' (' + plan['quantization'] + ' quantization)' if plan['lower'] == 'int8' else ''}.", "",
        f"- judged by verify's own checks of `{ev['runtime']}` (preset {ev['preset']}) against verify's reference: "
        f"{ev['observations']} observations and {ev['episodes']} seeded episodes per mode from seed {ev['seed']} "
        f"({ev['inputs']}); a candidate is within the bounds exactly when verify passes that runtime",
        f"- calibration: {(plan.get('calibration') or {}).get('source', 'none (fp16 needs none)')}",
        f"- search: {plan['search']['method']}; {plan['search']['evaluations']} candidates evaluated",
        f"- the verifier's {ev['preset']} bounds: "
        f"{', '.join(f'{k} {v}' for k, v in plan['bounds'].items() if v is not None)}",
        f"- element-wise tolerance: {ev['tolerance']}", "",
        f"## Each layer lowered alone (graph `{graph}`)", "",
        "| layer | type | cost | precision | mean exp\\|Δ log π\\| | ESS | k3 KL | flip rate (95% UCB) | "
        "p99 \\|Δμ\\|/σ | p99 \\|Δa\\|/range | return Δ | badness | alone |",
        "|---|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---|",
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
                     f"{_num(g.get('action_error_p99'), '.2e')} | "
                     f"{_num(ret, '.1%')} | "
                     f"{_num(s.get('badness'), '.3g')} | {'within' if s.get('ok') else 'beyond'} |")  # fmt: skip
    lines += [
        "",
        "## The plan, and every layer lowered",
        "",
        "| candidate | kept in fp32 | within the bounds | badness | what breaks |",
        "|---|---|---|---:|---|",
    ]
    for name, ev in (("plan", plan["final"]), ("every layer lowered", plan["all_lowered"])):
        kept = ", ".join(plan["kept"]) if name == "plan" else "none"
        lines.append(f"| {name} | {kept or 'none'} | {'yes' if ev['ok'] else 'no'} | {_num(ev['badness'], '.3g')} | "
                     f"{'; '.join(ev.get('broken', [])) or '–'} |")  # fmt: skip
    lines += [
        "",
        "Verify the plan's bundle (the same judge: exit 0 when the plan is within the bounds):",
        "",
        f"    python -m msrl_consistency.verify --bundle {plan.get('bundle', 'PLAN')} --ckpt CKPT",
        "",
    ]
    return "\n".join(lines)
