"""The layers a precision plan chooses between, and the ONNX nodes (per graph) that compute each.

A layer is a leaf sub-Cell of the policy (``layer_capture.capture_layers``: the scope verify's localisation names),
mapped onto each exported graph by ``localization.plan_layers`` (its output tensor). Every ONNX node belongs to the
first layer whose output comes at or after it in the graph, so a layer owns the operations between the previous
layer's output and its own (the ``* 400`` before a LayerNorm belongs to the LayerNorm); the nodes after the last
layer (argmax, sampling from the noise, the action squash) form the ``post-processing`` layer. A layer kept in fp32
keeps all its nodes, in every graph it appears in.

Its cost (what keeping it in fp32 gives up, to first order): the weights its nodes read plus the values it outputs
per observation.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from inference.bundle import Bundle
from inference.compare.judge.localize import LayerPlan
from inference.errors import UsageError
from msrl_consistency.artifacts.graphs import example
from msrl_consistency.layer_capture import capture_layers
from msrl_consistency.localization import plan_layers

POST = "post-processing"


@dataclass
class Layer:
    scope: str
    kind: str
    nodes: dict[str, list[str]] = field(default_factory=dict)  # graph -> its ONNX node names
    cost: int = 0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def node_groups(plan: LayerPlan) -> list[tuple[str, str, list[str], int]]:
    """(scope, kind, node names, index of its output node) per matched layer in graph order, then the
    post-processing nodes (see the module docstring)."""
    position = {node[3][0]: k for k, node in enumerate(plan.nodes) if node[3]}
    anchors = sorted((position[layer.tensor], layer.scope, layer.kind) for layer in plan.layers
                     if layer.tensor is not None and layer.tensor in position)  # fmt: skip
    groups, start = [], 0
    for at, scope, kind in anchors:
        if at < start:  # a layer whose output an earlier layer already produced (an identity): no nodes of its own
            continue
        groups.append((scope, kind, [n[0] for n in plan.nodes[start : at + 1]], at))
        start = at + 1
    if start < len(plan.nodes):
        groups.append((POST, POST, [n[0] for n in plan.nodes[start:]], len(plan.nodes) - 1))
    return groups


def policy_layers(bundle: Bundle, cells: Callable[[str], Any]) -> list[Layer]:
    """The layers of the bundle's policy, each with its nodes in every graph and its cost."""
    import onnx

    layers: dict[str, Layer] = {}
    for graph in bundle.graphs:
        cell = cells(graph)
        cell.set_train(False)
        rng = np.random.default_rng(0)
        from inference.bundle.tensors import TensorMeta

        metas = [TensorMeta.from_manifest(t) for t in bundle.graph(graph)["inputs"]]
        examples = [example(m, 2, rng) for m in metas]
        captured, _ = capture_layers(cell, examples)
        onnx_path = Path(bundle.file(graph, "onnx"))
        plan = plan_layers(captured, onnx_path, examples)
        model = onnx.load(str(onnx_path))
        sizes = {i.name: int(np.prod(i.dims)) for i in model.graph.initializer}
        reads = {n.name: [i for i in n.input if i in sizes] for n in model.graph.node}
        out_size = {c.scope: int(np.prod(c.output.shape[1:])) if c.output.ndim else 1 for c in captured}
        for scope, kind, nodes, _ in node_groups(plan):
            layer = layers.setdefault(scope, Layer(scope, kind))
            layer.nodes[graph] = nodes
            weights = sum(sizes[i] for n in nodes for i in set(reads.get(n, ())))
            layer.cost = max(layer.cost, weights + out_size.get(scope, 0))
    return list(layers.values())


def needs_files(bundle: Bundle, lower: str, what: str) -> None:
    """The files lowering to ``lower`` starts from, in every graph: int8 is converted from the ONNX graph into a
    ``.ms``; fp16 is emulated on the ONNX graph (``UsageError`` naming ``what`` and the graph otherwise)."""
    for graph in bundle.graphs:
        if not bundle.has_file(graph, "onnx") or (lower == "int8" and not bundle.has_file(graph, "ms")):
            need = ".onnx and .ms" if lower == "int8" else ".onnx"
            raise UsageError(f"{what}: graph {graph!r} needs its {need} (export with --formats mindir,onnx,ms)")


def kept_nodes(layers: Sequence[Layer], kept: set[str] | frozenset[str], graph: str) -> list[str]:
    return [n for layer in layers if layer.scope in kept for n in layer.nodes.get(graph, [])]


def describe(layers: Sequence[Layer], kept: Mapping[str, Any] | set[str] | frozenset[str]) -> str:
    return ", ".join(layer.scope for layer in layers if layer.scope in kept) or "none"
