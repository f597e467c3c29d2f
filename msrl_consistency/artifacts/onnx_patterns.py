"""Rewrite op patterns of MindSpore's ONNX export that a runtime cannot run into ops that compute the same values.

* MindSpore 2.10 exports ``nn.LeakyReLU(a)`` as ``Max(x, Mul(x, a))``. Lite 2.0.0's converter fuses that pair into a
  PReLU kernel, which fails at predict time on a 2-D ``[batch, features]`` tensor (``prelu_fp32.cc: ReSize: get
  channel failed``, reported as "Common error code"). ONNX has the op itself, ``LeakyRelu(alpha=a)``, which ONNX
  Runtime and Lite's converter both run; it computes the same values (``max(x, a*x)`` for ``0 <= a <= 1``).
* A camera frame scaled before its layout change, ``Transpose(Div(Cast(frame), 255))``, in a graph with more than
  one input: Lite 2.0.0's converter then fails ("InferShape failed, name: ...Conv, Unexpected input format 0"). The
  same ops with the ``Transpose`` first convert; elementwise ops with scalar operands commute with it exactly.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper


def fuse_leaky_relu(model: onnx.ModelProto) -> int:
    """Replace every ``Max(x, Mul(x, a))`` (either operand order, ``a`` a scalar constant in [0, 1], the ``Mul``
    used only there) by ``LeakyRelu(x, alpha=a)``, in place; returns how many were replaced."""
    graph = model.graph
    constants = {i.name: numpy_helper.to_array(i) for i in graph.initializer}
    for node in graph.node:
        if node.op_type == "Constant" and node.attribute and node.attribute[0].name == "value":
            constants[node.output[0]] = numpy_helper.to_array(node.attribute[0].t)
    producers = {out: k for k, node in enumerate(graph.node) for out in node.output}
    uses: dict[str, int] = {}
    for node in graph.node:
        for name in node.input:
            uses[name] = uses.get(name, 0) + 1
    for out in graph.output:
        uses[out.name] = uses.get(out.name, 0) + 1
    replaced, dropped = 0, set()
    for index, node in enumerate(graph.node):
        if node.op_type != "Max" or len(node.input) != 2:
            continue
        for x, scaled in (node.input, node.input[::-1]):
            at = producers.get(scaled)
            mul = graph.node[at] if at is not None else None
            if mul is None or mul.op_type != "Mul" or uses.get(scaled) != 1 or x not in mul.input:
                continue
            alpha = _scalar(constants.get(next((i for i in mul.input if i != x), x)))
            if alpha is None or not 0.0 <= alpha <= 1.0:
                continue
            graph.node[index].CopyFrom(helper.make_node("LeakyRelu", [x], list(node.output), alpha=alpha,
                                                        name=f"{node.name or 'Max'}/LeakyRelu"))  # fmt: skip
            dropped.add(at)
            replaced += 1
            break
    if dropped:
        keep = [n for k, n in enumerate(graph.node) if k not in dropped]
        del graph.node[:]
        graph.node.extend(keep)
    return replaced


def _scalar(value: np.ndarray | None) -> float | None:
    if value is None or value.size != 1 or value.dtype.kind != "f":
        return None
    return float(value.reshape(()))


ELEMENTWISE = {"Cast", "Relu", "Neg", "Abs", "Sqrt", "Exp", "Log", "Tanh", "Sigmoid", "Div", "Mul", "Add", "Sub"}


def hoist_input_transposes(model: onnx.ModelProto) -> int:
    """Move each ``Transpose`` that follows a chain of elementwise ops (each with one tensor operand, any other a
    scalar constant, each result used once) from a graph input to right after that input, in place; returns how
    many moved. The values are the same: an elementwise op with scalar operands commutes with a transpose."""
    moved = 0
    while (found := _movable_transpose(model.graph)) is not None:
        t_index, chain, source = found
        nodes = list(model.graph.node)
        transpose, first = nodes[t_index], nodes[chain[-1]]
        t_out, last_out = transpose.output[0], nodes[chain[0]].output[0]
        for k, node in enumerate(nodes):  # the transpose's consumers now read the chain's last result
            if k not in (t_index, chain[-1]):
                node.input[:] = [last_out if i == t_out else i for i in node.input]
        first.input[:] = [t_out if i == source else i for i in first.input]
        transpose.input[0] = source
        nodes.insert(chain[-1], nodes.pop(t_index))  # before the chain: the graph stays topologically sorted
        del model.graph.node[:]
        model.graph.node.extend(nodes)
        moved += 1
    return moved


def _movable_transpose(graph: onnx.GraphProto) -> tuple[int, list[int], str] | None:
    """The first ``Transpose`` reached from a graph input through an elementwise chain: (its index, the chain's node
    indices from the transpose back to the input, the input's name)."""
    inputs = {i.name for i in graph.input}
    scalars = {i.name for i in graph.initializer if int(np.prod(i.dims)) == 1}
    scalars |= {n.output[0] for n in graph.node if n.op_type == "Constant" and n.attribute
                and int(np.prod(n.attribute[0].t.dims)) == 1}  # fmt: skip
    producers = {out: k for k, node in enumerate(graph.node) for out in node.output}
    uses: dict[str, int] = {}
    for node in graph.node:
        for name in node.input:
            uses[name] = uses.get(name, 0) + 1
    for t_index, transpose in enumerate(graph.node):
        if transpose.op_type != "Transpose":
            continue
        chain, tensor = [], transpose.input[0]
        while tensor not in inputs:
            at = producers.get(tensor)
            node = graph.node[at] if at is not None else None
            operands = [] if node is None else [i for i in node.input if i not in scalars]
            if node is None or node.op_type not in ELEMENTWISE or len(operands) != 1 or uses.get(tensor) != 1:
                chain = []
                break
            chain.append(at)
            tensor = operands[0]
        if chain:
            return t_index, chain, tensor
    return None
