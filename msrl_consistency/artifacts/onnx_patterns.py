"""Rewrite op patterns of MindSpore's ONNX export that a runtime cannot run into ops that compute the same values.

* MindSpore 2.10 exports ``nn.LeakyReLU(a)`` as ``Max(x, Mul(x, a))``. Lite 2.0.0's converter fuses that pair into a
  PReLU kernel, which fails at predict time on a 2-D ``[batch, features]`` tensor (``prelu_fp32.cc: ReSize: get
  channel failed``, reported as "Common error code"). ONNX has the op itself, ``LeakyRelu(alpha=a)``, which ONNX
  Runtime and Lite's converter both run; it computes the same values (``max(x, a*x)`` for ``0 <= a <= 1``).
* A camera frame scaled before its layout change, ``Transpose(Div(Cast(frame), 255))``, in a graph with more than
  one input: Lite 2.0.0's converter then fails ("InferShape failed, name: ...Conv, Unexpected input format 0"). The
  same ops with the ``Transpose`` first convert; elementwise ops with scalar operands commute with it exactly.
* ``ReduceSumSquare`` (LayerNorm's variance, ``x - mean`` summed squared): Lite 2.0.0's reduce kernel squares its
  *input tensor in place* before summing, so every other reader of ``x - mean`` (the normalising ``Div``) gets the
  squares: each LayerNorm's output was wrong in Lite, at any scale, while ONNX Runtime was right.
  ``ReduceSum(Mul(x, x))`` computes the same sum and leaves ``x`` alone.
* Indexing one position from the end (``x[:, -1]``, ``x[:, -2]``): the exporter writes ``Slice(starts=-1, ends=0)``
  then ``Squeeze``, an empty slice in ONNX (ONNX Runtime fails at the ``Squeeze``: "Dimension of input 1 must be 1
  instead of 0"). ``fix_shrink_slices`` gives such a slice the end ``start + 1`` it means.
* A slice that slices nothing (``x[..., :n]`` with ``n`` the full width) is written as ``Slice`` with empty starts and
  ends: ONNX Runtime passes its input through, Lite's kernel fails ("Common error code"). ``drop_noop_slices`` removes
  it.
* A reduction over every axis (``ReduceMean(keep_dims=True)`` without an axis) is written with ``axes = []``: ONNX
  Runtime reduces every axis, Lite 2.0.0 reduces none (or hangs). ``explicit_reduce_axes`` names the axes.
* An integer output cast to int64 (a Q-net returning ``argmax(q).astype(int64)``): the exporter writes the ``Cast``
  with ``to = int32`` and declares the output int64, a graph ONNX Runtime refuses to load. ``fix_output_casts``
  casts to the type the output declares (the Cell's), so the contract's action dtype is kept.
* A leading axis added and removed again (``x.expand_dims(0)`` into a one-step ``nn.GRU``, which squeezes it):
  ``Squeeze(axes=[0])`` of a ``Reshape`` to ``[1, *x.shape]``. After a batch change, Lite 2.0.0 keeps the first
  batch on the path behind such a pair after a ``Gemm`` and ``Relu``, and then crashes ("double free") adding it to a
  tensor of the new batch. ``drop_expand_squeeze`` leaves ``x`` itself, the same values.
* A ``Split`` with an output nothing reads (Dreamer's action decoder keeps the mean half of ``Split(-1, 2)`` when not
  training): Lite 2.0.0 crashes (SIGSEGV) at batches of 256 and more. ``slice_unread_splits`` writes the halves that
  are read as ``Slice`` ops, the same values.
* ``Erf`` and ``Elu``: MindSpore's exporter has neither; export writes each as a ``Clip`` with marker bounds
  (``compat.onnx_ops_marked``), and ``restore_marked`` puts the ONNX op back.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper


def _inferred_shapes(model: onnx.ModelProto) -> dict[str, list[int]]:
    """Every value's shape as ONNX's shape inference gives it (-1 for a dimension it leaves symbolic)."""
    inferred = onnx.shape_inference.infer_shapes(model)
    values = [*inferred.graph.input, *inferred.graph.value_info, *inferred.graph.output]
    return {v.name: [d.dim_value if d.HasField("dim_value") else -1 for d in v.type.tensor_type.shape.dim]
            for v in values if v.type.tensor_type.HasField("shape")}  # fmt: skip


def drop_expand_squeeze(model: onnx.ModelProto, static: onnx.ModelProto) -> int:
    """Replace each ``Squeeze(axes=[0])`` of a ``Reshape`` that only added that axis by an ``Identity`` of the
    Reshape's input, in place (the Reshape goes when nothing else reads it); returns how many. ``static``: an export of
    the same graph at a fixed batch, whose inferred shapes tell which Reshapes only add a leading 1."""
    shapes = _inferred_shapes(static)
    graph = model.graph
    producers = {out: node for node in graph.node for out in node.output}
    readers: dict[str, int] = {}
    for node in graph.node:
        for name in node.input:
            readers[name] = readers.get(name, 0) + 1
    outputs = {o.name for o in graph.output}
    dropped = 0
    for index, node in enumerate(graph.node):
        axes = next((list(a.ints) for a in node.attribute if a.name == "axes"), None)
        reshape = producers.get(node.input[0]) if node.op_type == "Squeeze" else None
        if axes != [0] or reshape is None or reshape.op_type != "Reshape" or reshape.output[0] in outputs:
            continue
        before, after = shapes.get(reshape.input[0]), shapes.get(reshape.output[0])
        if before is None or after != [1, *before] or -1 in before:
            continue
        graph.node[index].CopyFrom(helper.make_node("Identity", [reshape.input[0]], list(node.output),
                                                    name=f"{node.name or 'Squeeze'}/Identity"))  # fmt: skip
        readers[reshape.output[0]] -= 1
        dropped += 1
    unread = [n for n in graph.node if n.op_type == "Reshape" and readers.get(n.output[0], 0) == 0
              and n.output[0] not in outputs]  # fmt: skip
    for node in unread:
        graph.node.remove(node)
    return dropped


def slice_unread_splits(model: onnx.ModelProto) -> int:
    """Replace each ``Split`` (sizes as an attribute) with an output nothing reads by one ``Slice`` per output that is
    read, in place; returns how many Splits were replaced."""
    graph = model.graph
    read = {name for node in graph.node for name in node.input} | {o.name for o in graph.output}
    kept, replaced = [], 0
    for node in graph.node:
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        partly_read = not all(o in read for o in node.output)
        if node.op_type != "Split" or not partly_read or "split" not in attrs or len(node.input) > 1:
            kept.append(node)
            continue
        start = 0
        for out, size in zip(node.output, attrs["split"], strict=True):
            if out in read:
                names = [f"{out}/{part}" for part in ("starts", "ends", "axes")]
                for name, value in zip(names, ([start], [start + size], [attrs.get("axis", 0)]), strict=True):
                    graph.initializer.append(numpy_helper.from_array(np.asarray(value, np.int64), name))
                kept.append(helper.make_node("Slice", [node.input[0], *names], [out], name=f"{out}/Slice"))
            start += size
        replaced += 1
    if replaced:
        del graph.node[:]
        graph.node.extend(kept)
    return replaced


def fix_output_casts(model: onnx.ModelProto) -> int:
    """Make each ``Cast`` that produces a graph output cast to the type the output declares, in place; returns how
    many were changed."""
    declared = {o.name: o.type.tensor_type.elem_type for o in model.graph.output}
    changed = 0
    for node in model.graph.node:
        if node.op_type != "Cast" or node.output[0] not in declared:
            continue
        to = next(a for a in node.attribute if a.name == "to")
        if declared[node.output[0]] and to.i != declared[node.output[0]]:
            to.i = declared[node.output[0]]
            changed += 1
    return changed


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


def split_reduce_sum_square(model: onnx.ModelProto) -> int:
    """Replace every ``ReduceSumSquare(x)`` by ``ReduceSum(Mul(x, x))`` (same axes and keepdims), in place; returns
    how many were replaced (see the module docstring: Lite's kernel overwrites ``x``)."""
    nodes, replaced = [], 0
    for node in model.graph.node:
        if node.op_type != "ReduceSumSquare":
            nodes.append(node)
            continue
        name = node.name or f"ReduceSumSquare{replaced}"
        squared = f"{node.output[0]}/squared"
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        nodes.append(helper.make_node("Mul", [node.input[0], node.input[0]], [squared], name=f"{name}/Mul"))
        nodes.append(helper.make_node("ReduceSum", [squared, *node.input[1:]], list(node.output),
                                      name=f"{name}/ReduceSum", **attrs))  # fmt: skip
        replaced += 1
    if replaced:
        del model.graph.node[:]
        model.graph.node.extend(nodes)
    return replaced


# Attributes written although ONNX has them as defaults: Lite 2.0.0's converter reads an absent ``alpha`` of ``Elu``
# as 0 (a ReLU).
MARKED_ATTRS = {"Elu": {"alpha": 1.0}}


def restore_marked(model: onnx.ModelProto, markers: dict[str, tuple[float, float]]) -> int:
    """Replace every ``Clip(x, low, high)`` whose bounds are one op's marker pair (float32 scalars, bit for bit) by that
    op (``Erf``, ``Elu``), in place; returns how many were replaced. Bounds nothing else reads are dropped."""
    graph = model.graph
    constants = {i.name: numpy_helper.to_array(i) for i in graph.initializer}
    for node in graph.node:
        if node.op_type == "Constant" and node.attribute and node.attribute[0].name == "value":
            constants[node.output[0]] = numpy_helper.to_array(node.attribute[0].t)

    def bits(name: str) -> bytes | None:
        value = constants.get(name)
        return value.tobytes() if value is not None and value.size == 1 and value.dtype == np.float32 else None

    wanted = {(np.float32(lo).tobytes(), np.float32(hi).tobytes()): op for op, (lo, hi) in markers.items()}
    replaced, bounds = 0, set()
    for index, node in enumerate(graph.node):
        if node.op_type != "Clip" or len(node.input) != 3:
            continue
        op = wanted.get((bits(node.input[1]), bits(node.input[2])))
        if op is not None:
            bounds |= {node.input[1], node.input[2]}
            graph.node[index].CopyFrom(
                helper.make_node(
                    op,
                    [node.input[0]],
                    list(node.output),
                    name=f"{node.name or 'Clip'}/{op}",
                    **MARKED_ATTRS.get(op, {}),
                )
            )
            replaced += 1
    unused = bounds - {i for node in graph.node for i in node.input}
    if unused:
        keep = [i for i in graph.initializer if i.name not in unused]
        del graph.initializer[:]
        graph.initializer.extend(keep)
        keep_nodes = [n for n in graph.node if not (n.op_type == "Constant" and n.output[0] in unused)]
        del graph.node[:]
        graph.node.extend(keep_nodes)
    return replaced


INT64_MAX = np.iinfo(np.int64).max


def _int_constants(graph: onnx.GraphProto) -> dict[str, np.ndarray]:
    values = {i.name: numpy_helper.to_array(i) for i in graph.initializer}
    for node in graph.node:
        if node.op_type == "Constant" and node.attribute and node.attribute[0].name == "value":
            values[node.output[0]] = numpy_helper.to_array(node.attribute[0].t)
    return {k: v for k, v in values.items() if v.dtype.kind == "i" and v.ndim == 1}


def fix_shrink_slices(model: onnx.ModelProto) -> int:
    """Give each ``Slice`` that picks one position counted from the end and whose result a ``Squeeze`` drops on that
    axis (``starts=[-k]``, ``ends=[0]``: empty in ONNX) the end ``-k + 1`` (the last position: to the end), in place;
    returns how many slices were fixed. The new ends are initializers of their own."""
    graph = model.graph
    consts = _int_constants(graph)
    squeezed: dict[str, set[int]] = {}
    for node in graph.node:
        if node.op_type == "Squeeze":
            axes = next((list(helper.get_attribute_value(a)) for a in node.attribute if a.name == "axes"), None)
            if axes is None and len(node.input) > 1 and node.input[1] in consts:
                axes = consts[node.input[1]].tolist()
            squeezed.setdefault(node.input[0], set()).update(axes or [])
    fixed = 0
    for node in graph.node:
        if node.op_type != "Slice" or len(node.input) < 4 or node.output[0] not in squeezed:
            continue
        starts, ends, axes = (consts.get(node.input[k]) for k in (1, 2, 3))
        steps = consts.get(node.input[4]) if len(node.input) > 4 else None
        if starts is None or ends is None or axes is None or len(starts) != len(ends) or len(axes) != len(starts):
            continue
        new_ends = ends.astype(np.int64).copy()
        for k, (start, end, axis) in enumerate(zip(starts, ends, axes, strict=True)):
            step = 1 if steps is None else int(steps[k])
            if start < 0 and end == 0 and step == 1 and int(axis) in squeezed[node.output[0]]:
                new_ends[k] = INT64_MAX if start == -1 else start + 1
        if np.array_equal(new_ends, ends):
            continue
        name = f"{node.name or node.output[0]}/ends"
        graph.initializer.append(numpy_helper.from_array(new_ends.astype(ends.dtype), name))
        node.input[2] = name
        fixed += 1
    return fixed


def drop_noop_slices(model: onnx.ModelProto) -> int:
    """Remove every ``Slice`` whose starts and ends are empty (it slices nothing), in place: its readers read its
    input. A no-op slice that is a graph output stays (as an ``Identity``). Returns how many were removed."""
    graph = model.graph
    consts = _int_constants(graph)
    outputs = {o.name for o in graph.output}
    keep, dropped = [], 0
    for node in graph.node:
        empty = (
            node.op_type == "Slice"
            and len(node.input) >= 3
            and all(node.input[k] in consts and consts[node.input[k]].size == 0 for k in (1, 2))
        )
        if not empty:
            keep.append(node)
            continue
        source, result = node.input[0], node.output[0]
        if result in outputs:
            keep.append(helper.make_node("Identity", [source], [result], name=f"{node.name or 'Slice'}/Identity"))
        else:
            for other in graph.node:
                other.input[:] = [source if i == result else i for i in other.input]
        dropped += 1
    if dropped:
        del graph.node[:]
        graph.node.extend(keep)
    return dropped


REDUCE_OPS = {"ReduceMean", "ReduceSum", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1", "ReduceL2",
              "ReduceLogSum", "ReduceLogSumExp", "ReduceSumSquare"}  # fmt: skip


def explicit_reduce_axes(model: onnx.ModelProto) -> int:
    """Give each reduction with an empty or absent ``axes`` attribute (every axis, in ONNX) the list of its input's
    axes, in place; returns how many were changed. A reduction whose axes come as an input, or whose input's rank is
    unknown, is left alone."""
    ranks = {name: len(dims) for name, dims in _inferred_shapes(model).items()}
    ranks.update({i.name: len(i.dims) for i in model.graph.initializer})
    changed = 0
    for node in model.graph.node:
        if node.op_type not in REDUCE_OPS or len(node.input) > 1 or node.input[0] not in ranks:
            continue
        axes = next((a for a in node.attribute if a.name == "axes"), None)
        if axes is not None and len(axes.ints):
            continue
        if axes is not None:
            node.attribute.remove(axes)
        node.attribute.append(helper.make_attribute("axes", list(range(ranks[node.input[0]]))))
        changed += 1
    return changed
