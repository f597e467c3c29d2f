"""A precision plan recorded in a manifest is a claim about the bundle's files, checked before verify judges them.

The plan is information: it never sets the bar the bundle is judged by (``compare.device_precision``), but what it
says must be true of the files, or the report would state it about files that do not compute it:

* its shape: ``lower`` is a precision a plan lowers to, every layer says ``fp32`` or that precision, ``kept`` names
  exactly the layers kept in fp32;
* it belongs to this bundle: the sha256 of each graph's float32 ONNX file the plan was made from is the bundle's;
* its layers exist: every node a layer names is a node of that graph's ONNX file;
* int8: each ``.ms`` stores the lowered layers' weights in int8 and the kept layers' in float (``ms_file``);
* fp16: each ``.ms``'s runtime configuration keeps in float32 exactly the kept layers' nodes.

A claim that does not hold is a usage error (exit 2) naming it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from inference.bundle.ms_file import MsFileError, ms_tensors
from inference.bundle.precision_mode import LOWERED
from inference.errors import UsageError


class PlanClaimError(UsageError):
    """A precision plan says something about the bundle's files that is not true of them."""


def check_plan(bundle: Any) -> None:
    """Every claim of ``bundle.plan`` against the bundle's files (``PlanClaimError`` naming the first that fails)."""
    plan = bundle.plan
    if plan is None:
        return
    where = f"{bundle.root}: its precision plan"
    layers = _layers(plan, where)
    lower = plan["lower"]
    _belongs(bundle, plan, where)
    nodes_of = {graph: onnx_nodes(bundle, graph) for graph in bundle.graphs}
    for layer in layers:
        for graph, nodes in layer["nodes"].items():
            if graph not in nodes_of:
                raise PlanClaimError(f"{where} names layer {layer['scope']!r} in graph {graph!r}, which the bundle "
                                     "does not have")  # fmt: skip
            missing = [n for n in nodes if n not in nodes_of[graph][0]]
            if missing:
                raise PlanClaimError(f"{where} names layer {layer['scope']!r} with node(s) {', '.join(missing[:3])} "
                                     f"that {bundle.file(graph, 'onnx').name} does not have")  # fmt: skip
    for graph in bundle.graphs:
        if not bundle.has_file(graph, "ms"):
            continue
        if lower == "int8":
            _int8_weights(bundle, graph, layers, nodes_of[graph][1], where)
        else:
            _fp16_execution_plan(bundle, graph, layers, where)


def _layers(plan: Mapping[str, Any], where: str) -> list[dict[str, Any]]:
    lower = plan.get("lower")
    if lower not in LOWERED:
        raise PlanClaimError(f"{where} lowers to {lower!r}; a plan lowers to one of {', '.join(LOWERED)}")
    layers = plan.get("layers")
    if not isinstance(layers, list) or not layers:
        raise PlanClaimError(f"{where} lists no layers")
    for layer in layers:
        ok = isinstance(layer, dict) and isinstance(layer.get("scope"), str) and isinstance(layer.get("nodes"), dict)
        ok = (
            ok
            and layer.get("precision") in ("fp32", lower)
            and all(isinstance(v, list) and all(isinstance(n, str) for n in v) for v in layer["nodes"].values())
        )
        if not ok:
            raise PlanClaimError(f"{where} has a malformed layer entry ({str(layer)[:80]}): each names its scope, its "
                                 f"nodes per graph and its precision (fp32 or {lower})")  # fmt: skip
    kept = sorted(layer["scope"] for layer in layers if layer["precision"] == "fp32")
    claimed = plan.get("kept")
    if not isinstance(claimed, list) or sorted(map(str, claimed)) != kept:
        unknown = sorted(set(map(str, claimed or [])) - {layer["scope"] for layer in layers})
        what = f"layer(s) it does not have: {', '.join(unknown)}" if unknown else "other layers than its layer list"
        raise PlanClaimError(f"{where} keeps {what} (its layers kept in fp32: {', '.join(kept) or 'none'})")
    return layers


def _belongs(bundle: Any, plan: Mapping[str, Any], where: str) -> None:
    """The plan was made from this bundle's float32 graphs: their ONNX files' sha256, as the manifest records them."""
    made_from = plan.get("source_graphs")
    if not isinstance(made_from, dict):
        raise PlanClaimError(f"{where} does not say which float32 graphs it was made from (no source_graphs): make "
                             "the plan again")  # fmt: skip
    for graph in bundle.graphs:
        mine = ((bundle.graph(graph).get("files") or {}).get("onnx") or {}).get("sha256")
        if made_from.get(graph) != mine or mine is None:
            raise PlanClaimError(f"{where} was made for another bundle: graph {graph!r} of the plan's source has "
                                 f"ONNX sha256 {str(made_from.get(graph))[:12]}…, this bundle's "
                                 f"{str(mine)[:12]}…")  # fmt: skip


QUANTIZED_OPS = ("Gemm", "MatMul", "Conv", "ConvTranspose")  # whose weights Lite's full quantization stores in int8


def onnx_nodes(bundle: Any, graph: str) -> tuple[set[str], dict[str, list[str]]]:
    """The graph's ONNX node names, and per node of ``QUANTIZED_OPS`` the initializers (weights) it reads."""
    if not bundle.has_file(graph, "onnx"):
        raise PlanClaimError(f"{bundle.root}: its precision plan cannot be checked: graph {graph!r} has no .onnx file")
    try:
        import onnx
    except ImportError:
        raise PlanClaimError("a precision plan is checked against the bundle's ONNX graphs: install onnx") from None
    model = onnx.load(str(bundle.file(graph, "onnx")))
    weights = {i.name for i in model.graph.initializer}
    return ({n.name for n in model.graph.node},
            {n.name: [i for i in n.input[1:2] if i in weights] for n in model.graph.node
             if n.op_type in QUANTIZED_OPS})  # fmt: skip


def _int8_weights(bundle: Any, graph: str, layers: Sequence[Mapping[str, Any]], reads: Mapping[str, list[str]],
                  where: str) -> None:  # fmt: skip
    """The ``.ms`` stores each lowered layer's weight matrices in int8 and each kept layer's in float."""
    path = bundle.file(graph, "ms")
    try:
        stored = {t.name: t.dtype for t in ms_tensors(path) if t.data_bytes}
    except MsFileError as exc:
        raise PlanClaimError(f"{where} claims int8 for {path.name}, which cannot be read: {exc}") from None
    lowered_int8 = 0
    for layer in layers:
        names = [w for node in layer["nodes"].get(graph, []) for w in reads.get(node, []) if w in stored]
        int8 = [w for w in names if stored[w] == "int8"]
        if layer["precision"] == "fp32" and int8:
            raise PlanClaimError(f"{where} keeps {layer['scope']!r} in fp32, but {path.name} stores its weight "
                                 f"{int8[0]!r} in int8")  # fmt: skip
        if layer["precision"] == "int8" and names and not int8:
            raise PlanClaimError(f"{where} claims int8 for layer {layer['scope']!r}, but {path.name} stores its "
                                 f"weights in {stored[names[0]]}: this file was not quantized by the plan")  # fmt: skip
        lowered_int8 += len(int8) if layer["precision"] == "int8" else 0
    if not lowered_int8 and any(layer["precision"] == "int8" for layer in layers):
        kinds = sorted(set(stored.values()))
        raise PlanClaimError(f"{where} claims int8, but {path.name} stores no lowered layer's weight in int8 (its "
                             f"weights: {', '.join(kinds) or 'none'})")  # fmt: skip


def _fp16_execution_plan(bundle: Any, graph: str, layers: Sequence[Mapping[str, Any]], where: str) -> None:
    """The runtime configuration of an fp16 plan's ``.ms`` keeps exactly the kept layers' nodes in float32."""
    entry = (bundle.graph(graph).get("files") or {}).get("ms") or {}
    config = entry.get("runtime_config")
    if not isinstance(config, dict):
        raise PlanClaimError(f"{where} lowers to fp16, but {entry.get('file', graph)} has no runtime configuration "
                             "(Lite's execution plan) to apply it")  # fmt: skip
    text = (Path(bundle.root) / config["file"]).read_text()
    float32 = {line.split("=", 1)[0].strip() for line in text.splitlines()
               if "=" in line and line.split("=", 1)[1].strip() == "data_type:float32"}  # fmt: skip
    kept = {n for layer in layers if layer["precision"] == "fp32" for n in layer["nodes"].get(graph, [])}
    if float32 != kept:
        odd = sorted(float32 ^ kept)
        raise PlanClaimError(f"{where} keeps other nodes in fp32 than {config['file']} does ({', '.join(odd[:3])})")
