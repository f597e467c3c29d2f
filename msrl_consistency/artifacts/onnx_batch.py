"""Make the batch dimension of an exported ONNX graph symbolic, including shapes the exporter froze.

MindSpore 2.10's ONNX exporter only takes fixed shapes, and it folds every shape it can into a constant: a
``zeros_like(mean)`` becomes a zero tensor with the export's batch of rows, ``reshape(x, (x.shape[0], -1))``
and BatchNorm1d's internal reshape become shape constants that start with the export's batch. Renaming the
batch dimension of the inputs and outputs leaves those constants behind, and the graph fails or returns
batch-1 shapes at any other batch.

So the graph is exported at two batch sizes and the exports are compared constant by constant (the exporter
is deterministic: same nodes, same names, only shapes differ). Where nothing differs (most MLPs), the first export
is kept as it is. Otherwise a third export checks the rule each changing constant is rewritten with, as a function
of the runtime batch ``b = Shape(input)[0]``:

* an integer tensor whose entries are ``fixed + k * b`` (checked on all three exports): ``fixed + k * b``;
* a tensor with ``b`` identical rows: its first row expanded to ``[b, ...]``.

The first two batches, 2 and 5, tell apart the constants a policy plausibly derives from its batch (``b // 2``,
``b // 4``, ``b % 2`` differ between them); the bundle's self-check then runs every format at yet another batch.

Anything else that changes with the batch cannot be made symbolic from the outside; ``BatchDependent`` names the
constant, and the bundle marks the ONNX (and the ``.ms`` converted from it) as not produced, with that reason.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import onnx
from onnx import helper, numpy_helper

# Not 1: the exporter and runtimes treat a batch of 1 specially (squeezes, broadcasts). The third only where the
# exports at the first two differ (``batch_dependent``).
EXPORT_BATCHES = (2, 5, 3)
_PREFIX = "msrl_batch"


class BatchDependent(ValueError):
    """A constant of the exported graph depends on the batch in a way that cannot be made symbolic."""


def batch_dependent(models: Sequence[onnx.ModelProto]) -> bool:
    """Whether any constant or node differs between exports at different batch sizes (inputs and outputs aside)."""
    first, *others = (m.graph for m in models)
    for graph in others:
        if len(graph.node) != len(first.node) or list(graph.initializer) != list(first.initializer):
            return True
        if any(a != b for a, b in zip(graph.node, first.node, strict=True)):
            return True
    return False


def symbolic_batch(models: Sequence[onnx.ModelProto], batches: Sequence[int] = EXPORT_BATCHES) -> onnx.ModelProto:
    """The first model with every batch-dependent constant replaced by its symbolic form (see the module
    docstring). ``models[i]`` was exported at ``batches[i]``; the first graph input carries the batch."""
    first, *others = models
    graphs = [m.graph for m in models]
    if any(len(g.node) != len(first.graph.node) or len(g.initializer) != len(first.graph.initializer) for g in graphs):
        raise BatchDependent("the exports at different batch sizes have different graphs")
    model = onnx.ModelProto()
    model.CopyFrom(first)
    graph = model.graph
    new_nodes: list[onnx.NodeProto] = []
    new_inits: list[onnx.TensorProto] = []
    batch = _batch_nodes(graph.input[0].name, new_nodes, new_inits)
    keep_inits = []
    rewritten = 0
    for index, init in enumerate(graph.initializer):
        values = [numpy_helper.to_array(g.initializer[index]) for g in graphs]
        if _same(values):
            keep_inits.append(init)
            continue
        new_nodes += _symbolic(init.name, values, batches, batch, new_inits)
        rewritten += 1
    keep_nodes = []
    for index, node in enumerate(graph.node):
        variants = [g.node[index] for g in graphs]
        if all(v == node for v in variants[1:]):
            keep_nodes.append(node)
            continue
        if node.op_type != "Constant" or any(v.op_type != node.op_type for v in variants):
            raise BatchDependent(f"node {node.name or node.op_type} ({node.op_type}) changes with the batch")
        values = [numpy_helper.to_array(_constant_value(v)) for v in variants]
        new_nodes += _symbolic(node.output[0], values, batches, batch, new_inits)
        rewritten += 1
    if not rewritten:
        return model  # nothing depended on the batch: leave the graph as it was exported
    del graph.initializer[:]
    graph.initializer.extend([*keep_inits, *new_inits])
    del graph.node[:]
    graph.node.extend([*new_nodes, *keep_nodes])
    return model


def _batch_nodes(input_name: str, nodes: list[onnx.NodeProto], inits: list[onnx.TensorProto]) -> str:
    """``b = Shape(input)[0:1]`` (int64 ``[1]``) at the front of the graph; returns its name."""
    shape, batch = f"{_PREFIX}/shape", f"{_PREFIX}/batch"
    inits += [_int64(f"{_PREFIX}/zero", [0]), _int64(f"{_PREFIX}/one", [1])]
    nodes.append(helper.make_node("Shape", [input_name], [shape], name=f"{_PREFIX}/Shape"))
    nodes.append(helper.make_node("Slice", [shape, f"{_PREFIX}/zero", f"{_PREFIX}/one", f"{_PREFIX}/zero"], [batch],
                                  name=f"{_PREFIX}/Slice"))  # fmt: skip
    return batch


def _symbolic(
    name: str, values: list[np.ndarray], batches: Sequence[int], batch: str, inits: list[onnx.TensorProto]
) -> list[onnx.NodeProto]:
    """Nodes that compute ``name`` from the runtime batch, given its value at each export batch."""
    first = values[0]
    if all(v.shape == first.shape for v in values) and first.dtype.kind == "i" and first.ndim == 1:
        k = values[1].astype(np.int64) - first.astype(np.int64)
        step = batches[1] - batches[0]
        if np.all(k % step == 0):
            k //= step
            fixed = first.astype(np.int64) - batches[0] * k
            if all(np.array_equal(v, fixed + b * k) for v, b in zip(values, batches, strict=True)):
                return _affine(name, fixed, k, batch, first.dtype, inits)
        raise BatchDependent(f"shape constant {name} {first.tolist()} changes with the batch, not as a multiple of it")
    rest = first.shape[1:]
    rows_follow = all(v.ndim == first.ndim and v.shape == (b, *rest) for v, b in zip(values, batches, strict=True))
    if rows_follow and all(np.array_equal(v, np.broadcast_to(v[:1], v.shape)) for v in values):
        row = numpy_helper.from_array(np.ascontiguousarray(first[:1]), f"{name}/row")
        dims = _int64(f"{name}/dims", list(rest))
        target = f"{name}/target"
        inits += [row, dims]
        return [
            helper.make_node("Concat", [batch, dims.name], [target], axis=0, name=f"{name}/Concat"),
            helper.make_node("Expand", [row.name, target], [name], name=f"{name}/Expand"),
        ]
    shapes = ", ".join(str(list(v.shape)) for v in values)
    raise BatchDependent(f"constant {name} changes with the batch (shapes {shapes} at batches {list(batches)}) and its "
                         "rows are not copies of one row")  # fmt: skip


def _affine(
    name: str, fixed: np.ndarray, k: np.ndarray, batch: str, dtype: np.dtype, inits: list[onnx.TensorProto]
) -> list[onnx.NodeProto]:
    scaled, summed = f"{name}/kb", f"{name}/sum"
    inits += [_int64(f"{name}/k", k.tolist()), _int64(f"{name}/fixed", fixed.tolist())]
    nodes = [
        helper.make_node("Mul", [batch, f"{name}/k"], [scaled], name=f"{name}/Mul"),
        helper.make_node("Add", [scaled, f"{name}/fixed"], [summed if dtype != np.int64 else name], name=f"{name}/Add"),
    ]
    if dtype != np.int64:
        to = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
        nodes.append(helper.make_node("Cast", [summed], [name], to=to, name=f"{name}/Cast"))
    return nodes


def _constant_value(node: onnx.NodeProto) -> onnx.TensorProto:
    for attr in node.attribute:
        if attr.name == "value":
            return attr.t
    raise BatchDependent(f"Constant node {node.name} has no tensor value")


def _int64(name: str, values: list[int]) -> onnx.TensorProto:
    return numpy_helper.from_array(np.asarray(values, np.int64), name)


def _same(values: list[np.ndarray]) -> bool:
    return all(v.shape == values[0].shape and np.array_equal(v, values[0]) for v in values[1:])
