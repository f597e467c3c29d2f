"""Rewrite op patterns of MindSpore's ONNX export that a runtime cannot run into the ONNX op that says the same.

MindSpore 2.10 exports ``nn.LeakyReLU(a)`` as ``Max(x, Mul(x, a))``. Lite 2.0.0's converter fuses that pair into
a PReLU kernel, which fails at predict time on a 2-D ``[batch, features]`` tensor (``prelu_fp32.cc: ReSize: get
channel failed``, reported as "Common error code"). ONNX has the op itself, ``LeakyRelu(alpha=a)``, which ONNX
Runtime and Lite's converter both run; it computes the same values (``max(x, a*x)`` for ``0 <= a <= 1``).
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
