"""Emulate a device that computes in fp16 on the CPU: the bundle's float32 ONNX graph rewritten so that every
operator's float inputs, weights and outputs are rounded to fp16, run in ONNX Runtime.

Why an ONNX rewrite run in ONNX Runtime (rather than evaluating the graph node by node in NumPy): the emulation
then runs the very kernels the ``onnxruntime`` runtime runs, so the only difference between the two is the rounding,
and each rounded tensor keeps its ONNX name, so the per-layer localisation of ``onnxruntime`` (intermediate tensors
as extra outputs) names the first diverging layer of the emulation unchanged. NumPy would need its own kernel for
every ONNX op (and its own bugs).

What is emulated, operator by operator (``Cast`` to float16 and back, graph optimisations off so that ONNX Runtime
cannot fold a rounding away):

* weights (float initializers and ``Constant`` nodes) are stored rounded to fp16;
* every float input of an operator is rounded, and its float outputs are rounded, so every tensor that leaves an
  operator holds an fp16 value (an overflow is ±inf, as on the device);
* matrix products (``MatMul``, ``Gemm``, ``Conv``) multiply the rounded inputs and accumulate in fp32 before their
  output is rounded, as Ascend's Cube unit does; elementwise operators compute in fp32 on fp16 inputs and round
  once (within one fp16 ulp of a native fp16 kernel);
* a fused ``LayerNormalization`` is first written out as its steps (mean, centred square, mean, sqrt, divide,
  scale, shift), so a square that overflows fp16 overflows here too.

Reductions (``ReduceMean``, ``ReduceSumSquare``, ``Softmax``) accumulate in fp32 inside the operator and round the
result: a device that accumulates in fp16 would lose more. Nodes named in ``keep`` (a precision plan's layers kept
in fp32) are left unrounded: they compute in fp32 on whatever their producers give them.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np

FLOAT, FLOAT16 = 1, 10  # onnx.TensorProto.FLOAT, FLOAT16
SUFFIX = "__fp16"


def emulate_fp16(model: Any, keep: Iterable[str] = ()) -> Any:
    """A copy of ``model`` (an ``onnx.ModelProto``, float32) that computes as described in the module docstring;
    ``keep``: node names left in fp32. Graph inputs and outputs keep their names and float32 dtype."""
    import onnx
    from onnx import numpy_helper

    model = onnx.ModelProto.FromString(model.SerializeToString())
    keep = set(keep)
    keep |= _decompose_layer_norms(model, keep)
    graph = model.graph
    types = _elem_types(model)
    inits = {i.name: i for i in graph.initializer}
    rounded: dict[str, str] = {}  # tensor -> its fp16-rounded twin
    prologue: list[Any] = []

    def rounded_name(tensor: str) -> str:
        if tensor in rounded:
            return rounded[tensor]
        twin = f"{tensor}{SUFFIX}"
        if tensor in inits:  # a weight: stored rounded
            values = numpy_helper.to_array(inits[tensor]).astype(np.float16).astype(np.float32)
            graph.initializer.append(numpy_helper.from_array(values, twin))
        else:
            prologue.extend(_round(tensor, twin))
        rounded[tensor] = twin
        return twin

    nodes: list[Any] = []
    for node in graph.node:
        lowered = node.name not in keep
        if node.op_type == "Constant" and lowered:
            _round_constant(node)
            nodes.append(node)
            continue
        if lowered:
            for k, tensor in enumerate(node.input):
                if tensor and types.get(tensor) == FLOAT:
                    node.input[k] = rounded_name(tensor)
            nodes.extend(prologue)
            prologue.clear()
        outputs = []
        for k, tensor in enumerate(node.output):
            if lowered and tensor and types.get(tensor) == FLOAT:
                node.output[k] = f"{tensor}__raw"
                outputs += _round(node.output[k], tensor)
                rounded[tensor] = tensor  # already an fp16 value: consumers take it as it is
        nodes.append(node)
        nodes.extend(outputs)
    del graph.node[:]
    graph.node.extend(nodes)
    del graph.value_info[:]
    model.producer_name = f"{model.producer_name} (fp16 emulation)"
    onnx.checker.check_model(model)
    return model


def _round(source: str, target: str) -> list[Any]:
    from onnx import helper

    half = f"{target}__half"
    return [helper.make_node("Cast", [source], [half], to=FLOAT16, name=f"{half}/cast"),
            helper.make_node("Cast", [half], [target], to=FLOAT, name=f"{target}/round")]  # fmt: skip


def _round_constant(node: Any) -> None:
    from onnx import numpy_helper

    for attr in node.attribute:
        if attr.name == "value" and attr.t.data_type == FLOAT:
            values = numpy_helper.to_array(attr.t).astype(np.float16).astype(np.float32)
            attr.t.CopyFrom(numpy_helper.from_array(values, attr.t.name))
        elif attr.name in ("value_float", "value_floats"):
            attr.f = float(np.float16(attr.f))
            attr.floats[:] = [float(np.float16(v)) for v in attr.floats]


def _elem_types(model: Any) -> dict[str, int]:
    """Every tensor's element type (graph inputs, initializers, inferred intermediates)."""
    import onnx

    inferred = onnx.shape_inference.infer_shapes(model)
    types = {v.name: v.type.tensor_type.elem_type
             for v in [*inferred.graph.input, *inferred.graph.value_info, *inferred.graph.output]}  # fmt: skip
    types.update({i.name: i.data_type for i in model.graph.initializer})
    for node in model.graph.node:  # Constant outputs the inference may leave untyped
        if node.op_type == "Constant":
            for attr in node.attribute:
                if attr.name == "value":
                    types.setdefault(node.output[0], attr.t.data_type)
    return types


def _decompose_layer_norms(model: Any, keep: set[str]) -> set[str]:
    """Each ``LayerNormalization`` (opset 17) as its steps, keeping the node's name on its last step (its output).
    Returns the steps' names of the kept ones (a kept LayerNorm stays whole in fp32)."""
    from onnx import helper

    out: list[Any] = []
    kept: set[str] = set()
    for node in model.graph.node:
        if node.op_type != "LayerNormalization":
            out.append(node)
            continue
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        axis, eps = int(attrs.get("axis", -1)), float(attrs.get("epsilon", 1e-5))
        x, scale = node.input[0], node.input[1]
        bias = node.input[2] if len(node.input) > 2 and node.input[2] else None
        p = f"{node.name}/ln"
        steps = [
            helper.make_node(
                "Constant", [], [f"{p}/eps"], value=helper.make_tensor(f"{p}/eps", FLOAT, [], [eps]), name=f"{p}/eps"
            ),  # fmt: skip
            helper.make_node("ReduceMean", [x], [f"{p}/mean"], axes=[axis], keepdims=1, name=f"{p}/mean"),
            helper.make_node("Sub", [x, f"{p}/mean"], [f"{p}/centred"], name=f"{p}/centred"),
            helper.make_node("Mul", [f"{p}/centred", f"{p}/centred"], [f"{p}/square"], name=f"{p}/square"),
            helper.make_node("ReduceMean", [f"{p}/square"], [f"{p}/var"], axes=[axis], keepdims=1, name=f"{p}/var"),
            helper.make_node("Add", [f"{p}/var", f"{p}/eps"], [f"{p}/var_eps"], name=f"{p}/var_eps"),
            helper.make_node("Sqrt", [f"{p}/var_eps"], [f"{p}/std"], name=f"{p}/std"),
            helper.make_node("Div", [f"{p}/centred", f"{p}/std"], [f"{p}/normed"], name=f"{p}/normed"),
        ]
        last = f"{p}/scaled" if bias else node.output[0]
        steps.append(helper.make_node("Mul", [f"{p}/normed", scale], [last], name=node.name if not bias else last))
        if bias:
            steps.append(helper.make_node("Add", [last, bias], [node.output[0]], name=node.name))
        out.extend(steps)
        if node.name in keep:
            kept |= {step.name for step in steps}
    if len(out) != len(model.graph.node):
        del model.graph.node[:]
        model.graph.node.extend(out)
        opset = next((o for o in model.opset_import if o.domain in ("", "ai.onnx")), None)
        if opset is not None and opset.version >= 18:  # ReduceMean takes its axes as an input from opset 18
            raise ValueError("a LayerNormalization in an opset >= 18 graph is not emulated yet")
    return kept


def session(model: Any, threads: int = 1) -> Any:
    """ONNX Runtime on ``model`` with graph optimisations off (a Cast pair must not be folded away)."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.log_severity_level = 3
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
