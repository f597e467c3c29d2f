"""Layer localisation, the training side: every layer's output in the reference Cell, the layers mapped onto the
exported graph, and ``localize(cell, runtime, observations)`` (the library entry point; verify calls the same).

* ``capture_layers`` (``layer_capture``): every layer's output in the reference Cell, in call order.
* ``plan_layers``: each layer's output tensor in the exported ONNX graph. A layer with Parameters is anchored by
  them (MindSpore exports them as initializers under their names): its output is that of the last node reading
  one, followed through shape-only nodes to the layer's shape. A layer without Parameters is the next node of a
  matching op type; one of a kind no op type names (a team's unit norm: ``x / sqrt(sum x^2)``) is matched by what
  its ops compute: the first node after the previous layer whose output on the same inputs is the layer's (given
  ``inputs``). A recurrent cell's output is its first tensor that leaves it (the carried state, not a gate:
  the exporter leaves its final gate arithmetic unnamed). Anything else stays unmatched, with the reason.
* The MindIR (``ms-mindir``): MindSpore gives no per-layer outputs of a loaded MindIR on CPU (its kernels lose the
  Cell scope), so its Parameters are compared with the Cell's instead: the first layer whose weights differ.
"""

from __future__ import annotations

import contextlib
import re
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from mindspore import nn

from inference.bundle import Bundle
from inference.bundle.tensors import TensorMeta
from inference.compare.judge.localize import (
    IDENTITY_IN_EVAL_NOTE,
    LayerComparison,
    LayerPlan,
    Localization,
    PlannedLayer,
    conclude,
    localize_runtime,
)
from inference.compare.judge.stats import Tolerance, compare_arrays
from msrl_consistency.layer_capture import CapturedLayer, capture_layers, outside_parameters

# Cell type → the ONNX op types that compute it (layers without Parameters are matched by these, in order).
OP_TYPES = {
    "ReLU": {"Relu"}, "Tanh": {"Tanh"}, "Sigmoid": {"Sigmoid"}, "LeakyReLU": {"LeakyRelu", "Max"},
    "Softmax": {"Softmax"}, "LogSoftmax": {"LogSoftmax"}, "Softplus": {"Softplus"}, "ELU": {"Elu"},
    "ReLU6": {"Clip"}, "Flatten": {"Flatten", "Reshape"}, "GELU": {"Gelu", "Mul"},
}  # fmt: skip
IDENTITY_IN_EVAL = {"Dropout", "Dropout1d", "Dropout2d", "Identity"}
# Cells the exporter writes as several parameter-reading ops plus gate arithmetic it leaves unnamed (a GRUCell: two
# Gemms, Split, Sigmoid/Tanh, and the final ``h + z * (n - h)`` as anonymous Sub/Mul/Add; an LSTMCell: the same
# gates, then ``c = f * c + i * g`` and ``h = o * tanh(c)``, both leaving it).
RECURRENT = {"GRUCell", "RNNCell", "LSTMCell"}
SHAPE_ONLY = {"Reshape", "Squeeze", "Unsqueeze", "Flatten", "Identity"}


def plan_layers(layers: Sequence[CapturedLayer], onnx_path: Path, inputs: Sequence[np.ndarray] | None = None) \
        -> LayerPlan:  # fmt: skip
    """Each captured layer's output tensor in the ONNX graph (see the module docstring). ``inputs``: those the layers
    were captured on, to match a parameter-free layer of an unknown kind by its output's values."""
    import onnx

    model = onnx.load(str(onnx_path))
    inferred = onnx.shape_inference.infer_shapes(model)
    ranks = {v.name: len(v.type.tensor_type.shape.dim) for v in [*inferred.graph.value_info, *inferred.graph.output]}
    nodes = [(n.name, n.op_type, tuple(n.input), tuple(n.output), _scalars(n)) for n in model.graph.node]
    graph_inputs = {i.name for i in model.graph.input}
    params = {p for layer in layers for p in layer.params}
    constants = {i.name for i in model.graph.initializer} - params
    planned, last_pos = [], -1
    values: dict[str, np.ndarray] | None = None
    for layer in layers:
        pos, why = _anchor(layer, nodes, last_pos, params - set(layer.params))
        if pos is None and inputs is not None and not layer.params and layer.kind not in IDENTITY_IN_EVAL:
            values = _node_values(inferred, inputs) if values is None else values
            pos = _by_value(layer.output, nodes, values, last_pos)
            why = why if pos is None else ""
        if pos is not None and layer.kind in RECURRENT:
            own_inputs = graph_inputs | constants | set(layer.params)
            pos = _recurrent_output(nodes, layer.params, pos, own_inputs, {o.name for o in model.graph.output})
        tensor = None
        if pos is not None:
            pos = _follow_tail(nodes, pos, layer.tail)
            pos = _follow_shape_ops(nodes, pos, ranks, layer.output.ndim)
            tensor, last_pos = nodes[pos][3][0], pos
        planned.append(PlannedLayer(layer.scope, layer.kind, tensor, why if tensor is None else "", layer.role))
    return LayerPlan(planned, nodes)


def _node_values(inferred: Any, inputs: Sequence[np.ndarray]) -> dict[str, np.ndarray]:
    """Every node output of the (shape-inferred) ONNX graph on ``inputs``, by tensor name (ONNX Runtime, every
    intermediate tensor exposed as an output); empty when ONNX Runtime cannot run it."""
    import onnx

    model = onnx.ModelProto()
    model.CopyFrom(inferred)
    known = {o.name for o in model.graph.output}
    model.graph.output.extend(v for v in inferred.graph.value_info if v.name not in known)
    try:
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL  # every node as written
        session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
        names = [o.name for o in session.get_outputs()]
        feeds = {i.name: np.asarray(x) for i, x in zip(session.get_inputs(), inputs, strict=False)}
        return dict(zip(names, session.run(names, feeds), strict=True))
    except Exception:  # noqa: BLE001 - no values, no match by value: the layer stays unmatched, with its reason
        return {}


def _by_value(output: np.ndarray, nodes: Sequence[tuple], values: Mapping[str, np.ndarray], after: int) -> int | None:
    """The first node after ``after`` whose output equals ``output`` (the layer's, captured on the same inputs) within
    float32 rounding of the two runtimes (1e-4 of its largest magnitude)."""
    want = np.asarray(output, np.float64)
    scale = float(np.abs(want[np.isfinite(want)]).max(initial=0.0)) or 1.0
    for k in range(after + 1, len(nodes)):
        got = values.get(nodes[k][3][0]) if nodes[k][3] else None
        if got is not None and got.shape == want.shape and got.dtype.kind == "f" and \
                np.allclose(np.asarray(got, np.float64), want, rtol=0, atol=1e-4 * scale, equal_nan=True):  # fmt: skip
            return k
    return None


def _scalars(node: Any) -> dict[str, float]:
    """A node's float and int attributes (LeakyRelu's alpha...)."""
    import onnx

    kinds = (onnx.AttributeProto.FLOAT, onnx.AttributeProto.INT)
    return {a.name: float(onnx.helper.get_attribute_value(a)) for a in node.attribute if a.type in kinds}


def _anchor(layer: CapturedLayer, nodes: Sequence[tuple], after: int, foreign: set[str]) -> tuple[int | None, str]:
    """The node whose output is the layer's: the last one that reads its Parameters or carries its scope in its
    name (the exporter names a sub-Cell's own operations ``Default/<cell>-<Type>/...``), before any node that reads
    another layer's Parameters (MindSpore's exporter names the action clip after the normaliser's clamp, one op
    later); for a layer with neither, the next node of a matching op type."""
    scope = re.compile("Default/" + "/".join(rf"{re.escape(part)}-[^/]+" for part in layer.path.split(".")) + "/")
    if layer.params:
        readers = [k for k, n in enumerate(nodes) if set(n[2]) & set(layer.params)]
        if not readers:
            return None, f"its parameters ({', '.join(layer.params)}) are not initializers of the ONNX graph"
        stop = next((k for k in range(min(readers), len(nodes)) if set(nodes[k][2]) & foreign), len(nodes))
        scoped = [k for k in _downstream(nodes, min(readers)) if k < stop and layer.path and scope.search(nodes[k][0])]
        return max(readers + scoped), ""
    scoped = [k for k in _downstream(nodes, after) if layer.path and scope.search(nodes[k][0])] if after >= 0 else []
    if scoped:
        return max(scoped), ""
    if layer.kind in IDENTITY_IN_EVAL:
        return None, IDENTITY_IN_EVAL_NOTE
    ops = OP_TYPES.get(layer.kind)
    if ops is None:
        return None, f"no ONNX op is known to compute a {layer.kind} layer"
    pos = next((k for k in range(after + 1, len(nodes)) if nodes[k][1] in ops), None)
    return pos, "" if pos is not None else f"no {'/'.join(sorted(ops))} node after the previous layer"


def _recurrent_output(
    nodes: Sequence[tuple], params: Sequence[str], pos: int, own_inputs: set[str], graph_outputs: set[str]
) -> int:  # fmt: skip
    """A recurrent cell's output node. Its nodes are those reading its Parameters and what they feed up to its last
    named op (``pos``); from there they go on while they read only the cell's tensors, the graph's inputs and
    constants (another layer's Parameters end them). Its output is the first of its tensors that leaves the cell:
    a graph output (the carried state) or read by a node outside it."""
    readers = [k for k, n in enumerate(nodes) if set(n[2]) & set(params)]
    own_nodes = sorted({*readers, *(k for r in readers for k in _downstream(nodes, r) if k <= pos)})
    own = {t for k in own_nodes for t in nodes[k][3]}
    for k in range(pos + 1, len(nodes)):
        inputs = set(nodes[k][2])
        if not inputs & own:
            continue  # another branch of the graph
        if not inputs <= own | own_inputs:
            break  # the cell's tensors with another layer's Parameters: the next layer
        own |= set(nodes[k][3])
        own_nodes.append(k)
    members = set(own_nodes)
    leaving = [k for k in own_nodes if (out := nodes[k][3][0]) in graph_outputs
               or any(out in nodes[j][2] for j in range(k + 1, len(nodes)) if j not in members)]  # fmt: skip
    # A cell carrying several states (an LSTMCell's c, then h = o * tanh(c)): its output is the one computed from the
    # others, never an ancestor of another tensor that leaves it.
    for k in leaving:
        reached = set(nodes[k][3])
        for j in sorted(members):
            if j > k and reached & set(nodes[j][2]):
                reached |= set(nodes[j][3])
        if not any(nodes[j][3][0] in reached for j in leaving if j != k):
            return k
    return leaving[0] if leaving else own_nodes[-1]


def _follow_tail(nodes: Sequence[tuple], pos: int, tail: Sequence[str]) -> int:
    """From a layer's last Parameter-reading node through the ops of its sub-Cells without Parameters (the
    activation of an ``nn.Dense(..., activation=...)``), each the next node reading the output so far, when the
    exporter left them unnamed: the layer's output is after its activation, as the Cell returns it."""
    for kind in tail:
        ops = OP_TYPES.get(kind)
        if kind in IDENTITY_IN_EVAL or ops is None:
            continue
        following = next((k for k in range(pos + 1, len(nodes)) if nodes[pos][3][0] in nodes[k][2]), None)
        if following is None or nodes[following][1] not in ops:
            break
        pos = following
    return pos


def _downstream(nodes: Sequence[tuple], start: int) -> list[int]:
    """The nodes that consume, directly or not, the output of node ``start`` (the exporter's scope names are not
    always right: an op of another Cell can carry a layer's scope, but it does not read that layer's result)."""
    reached, found = set(nodes[start][3]), []
    for k in range(start + 1, len(nodes)):
        if reached & set(nodes[k][2]):
            reached |= set(nodes[k][3])
            found.append(k)
    return found


def _follow_shape_ops(nodes: Sequence[tuple], pos: int, ranks: Mapping[str, int], rank: int) -> int:
    """From the anchored node, through reshapes that bring its output to the layer's rank (BatchNorm1d's)."""
    while ranks.get(nodes[pos][3][0], rank) != rank and pos + 1 < len(nodes):
        following = nodes[pos + 1]
        reshapes = following[1] in SHAPE_ONLY or following[1] == "BatchNormalization"
        if not reshapes or nodes[pos][3][0] not in following[2]:
            break
        pos += 1
    return pos


@contextlib.contextmanager
def onnx_of(bundle: Bundle, graph: str, cell: nn.Cell) -> Iterator[Path]:
    """The ONNX graph a bundle's ``.ms`` was converted from: the bundle's own, or (an fp16 bundle keeps none) the
    float32 Cell exported again the same way (MindSpore's exporter is deterministic: the same node names)."""
    if bundle.has_file(graph, "onnx"):
        yield bundle.file(graph, "onnx")
        return
    from msrl_consistency.artifacts.graphs import GraphIO, write_onnx

    meta = bundle.graph(graph)
    io = GraphIO(graph, meta.get("kind", "deterministic"), tuple(TensorMeta.from_manifest(t) for t in meta["inputs"]),
                 tuple(TensorMeta.from_manifest(t) for t in meta["outputs"]))  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="msrl-localize-") as tmp:
        yield write_onnx(cell, io, Path(tmp) / f"{graph}.onnx")


def localize(
    cell: nn.Cell, runtime: str, observations: Sequence[np.ndarray], bundle: Bundle, graph: str = "policy",
    tolerance: Tolerance | None = None, device: str = "cpu",
) -> Localization:  # fmt: skip
    """The per-layer comparison of ``runtime`` (``onnxruntime``, ``lite`` or ``ms-mindir``) with ``cell`` on the
    graph's inputs ``observations`` (a few rows suffice), for ``bundle``'s ``graph``."""
    from inference.compare.judge.stats import tolerance_for

    tolerance = tolerance or tolerance_for(bundle.precision, runtime)
    cell.set_train(False)
    layers, _ = capture_layers(cell, observations)
    if runtime == "ms-mindir":
        return mindir_parameters(cell, bundle.file(graph, "mindir"), layers)
    with onnx_of(bundle, graph, cell) as onnx_path:
        plan = plan_layers(layers, onnx_path, observations)
    plan.outside = outside_parameters(cell)
    reference = [layer.output for layer in layers]
    return localize_runtime(runtime, bundle, graph, plan, reference, observations, tolerance, device)


class CellLocalizer:
    """Verify's localizer on the training side: the reference Cells of ``cells`` against the bundle's graphs."""

    def __init__(self, bundle: Bundle, cells: Any, device: str = "cpu") -> None:
        self.bundle, self.cells, self.device = bundle, cells, device

    def __call__(
        self, runtime: str, graph: str, rows: np.ndarray, inputs: Sequence[np.ndarray], tol: Tolerance
    ) -> Localization:
        if runtime in ("onnxruntime", "ms-mindir", "emulated-fp16") or runtime.startswith("lite"):
            return localize(self.cells(graph), runtime, inputs, self.bundle, graph, tol, self.device)
        why = {"ms-graph": "ms-graph runs the reference Cell itself (its own Parameters), compiled: a compiled Cell's "
               "per-layer outputs need MindSpore's dump (MINDSPORE_DUMP_CONFIG)"}.get(runtime, f"{runtime} gives "
               "no per-layer outputs")  # fmt: skip
        return Localization(runtime, None, None, [], f"not localized: {why}", method="none")

    def checkpoint_difference(self, graph: str, inputs: Sequence[np.ndarray]) -> Localization | None:
        """The reference Cell's Parameters (from the checkpoint given) against those the bundle carries (the
        checkpoint it was exported from: its MindIR's, else its ONNX graph's), layer by layer in call order on
        ``inputs``: the first layer whose weights differ. None when the bundle carries no readable weights."""
        cell = self.cells(graph)
        cell.set_train(False)
        layers, _ = capture_layers(cell, inputs)
        for fmt, read in (("mindir", mindir_arrays), ("onnx", onnx_arrays)):
            if self.bundle.has_file(graph, fmt):
                where = f"the bundle's {self.bundle.graph(graph)['files'][fmt]['file']}"
                loc = compare_parameters("checkpoint", cell, read(self.bundle.file(graph, fmt)), layers, where,
                                         f"every layer's parameters equal {where}'s")  # fmt: skip
                loc.method = f"parameters: the checkpoint given against {where} (what the bundle was exported with)"
                return loc
        return None

    def record(self, feeds: Any) -> dict[str, np.ndarray]:
        """The golden-file arrays that let a deploy box name the diverging layer (``record_layers``)."""
        graph = self.bundle.mode_graph("deterministic") or self.bundle.graphs[0]
        return record_layers(self.cells(graph), self.bundle, graph, feeds)


def mindir_parameters(cell: nn.Cell, mindir: Path, layers: Sequence[CapturedLayer]) -> Localization:
    """The MindIR's Parameters against the Cell's, layer by layer in call order: the first layer whose weights
    differ (MindSpore gives no per-layer outputs of a loaded MindIR on CPU)."""
    loc = compare_parameters("ms-mindir", cell, mindir_arrays(mindir), layers, "the MindIR",
                             "every layer's parameters equal the Cell's: the difference is in the graph's "
                             "operations, not its weights")  # fmt: skip
    loc.method = "parameters (a loaded MindIR gives no per-layer outputs on CPU)"
    return loc


def mindir_arrays(mindir: Path) -> dict[str, np.ndarray]:
    """A MindIR's Parameters by the Cell's names."""
    from mindspore.train import mind_ir_pb2

    model = mind_ir_pb2.ModelProto()
    model.ParseFromString(Path(mindir).read_bytes())
    return {p.name.rsplit(":", 1)[-1]: _tensor(p) for p in model.graph.parameter}


def onnx_arrays(onnx_path: Path) -> dict[str, np.ndarray]:
    """An ONNX graph's initializers by name (the exporter keeps the Cell's Parameter names)."""
    import onnx
    from onnx import numpy_helper

    return {i.name: numpy_helper.to_array(i) for i in onnx.load(str(onnx_path)).graph.initializer}


def compare_parameters(
    label: str, cell: nn.Cell, stored: Mapping[str, np.ndarray], layers: Sequence[CapturedLayer], where: str,
    agreed: str,
) -> Localization:  # fmt: skip
    """The Cell's Parameters against ``stored`` (name → values, e.g. a MindIR's), exactly, layer by layer in call
    order, then the Parameters outside every layer one by one: the first layer whose weights differ. A Parameter
    ``stored`` lacks is listed as not compared, never passed. Values stored in float16 are compared with the Cell's
    rounded to float16 (an fp16 export of the same weights is no difference)."""
    own = {p.name: p.asnumpy() for p in cell.get_parameters()}
    groups = [(layer.scope, layer.kind, layer.params, layer.role) for layer in layers if layer.params]
    groups += [(name, "Parameter", (name,), "") for name in outside_parameters(cell)]
    rows, first = [], None
    for scope, kind, params, role in groups:
        missing = [name for name in params if name not in stored]
        if missing:
            rows.append(LayerComparison(scope, kind, "unmatched", note=f"{missing[0]} not in {where}", role=role))
            continue
        worst = None
        for name in params:
            mine, theirs = own[name], np.asarray(stored[name])
            if theirs.size != mine.size:
                worst = compare_arrays(name, mine, theirs, Tolerance(0.0, 0.0))  # a shape mismatch, said as such
                break
            if theirs.dtype == np.float16 and mine.dtype != np.float16:
                mine = mine.astype(np.float16)
            cmp = compare_arrays(name, mine.astype(np.float32), theirs.reshape(mine.shape).astype(np.float32),
                                 Tolerance(0.0, 0.0))  # fmt: skip
            if worst is None or not cmp.passed and (worst.passed or cmp.max_abs > worst.max_abs):
                worst = cmp
        assert worst is not None
        note = "parameters" if worst.passed else f"parameters: {worst.name} {worst.mismatches}/{worst.count} differ"
        row = LayerComparison(
            scope,
            kind,
            "pass" if worst.passed else "fail",
            worst.cosine,
            worst.max_abs,
            worst.max_rel,
            note=note if not worst.shape_mismatch else worst.describe(),
            role=role,
        )
        rows.append(row)
        if not worst.passed and first is None:
            first = row
    loc = conclude(label, rows, first, agreed=agreed)
    if first is not None:
        loc.message = "; ".join(m for m in (f"its parameters differ from {where}'s", loc.message) if m)
    return loc


def _tensor(proto: Any) -> np.ndarray:
    """A MindIR parameter's values (float32 raw data as MindSpore writes it)."""
    dtype = {1: np.float32, 2: np.uint8, 3: np.int8, 6: np.int32, 7: np.int64, 10: np.float16, 11: np.float64}.get(
        proto.data_type, np.float32)  # fmt: skip
    return np.frombuffer(proto.raw_data, dtype).reshape(tuple(proto.dims)) if proto.raw_data else np.zeros(0, dtype)


GOLDEN_LAYER_ROWS = 64


def record_layers(cell: nn.Cell, bundle: Bundle, graph: str, feeds: Any) -> dict[str, np.ndarray]:
    """Golden-file arrays for the deploy side's localizer (``compare.localize.RecordedLayers``): the deciding
    graph's layer plan, the first ordinary rows of the feeds with the graph's inputs, every layer's output there."""
    import json

    rows = np.flatnonzero(feeds.finite & feeds.ordinary)[:GOLDEN_LAYER_ROWS]
    inputs = feeds.graph_inputs(bundle, graph, rows)
    cell.set_train(False)
    layers, _ = capture_layers(cell, inputs)
    with onnx_of(bundle, graph, cell) as onnx_path:
        plan = plan_layers(layers, onnx_path, inputs)
    plan.outside = outside_parameters(cell)
    arrays = {"layers/graph": np.array(graph), "layers/plan": np.array(json.dumps(plan.to_dict())),
              "layers/rows": rows}  # fmt: skip
    arrays.update({f"layers/input/{k}": x for k, x in enumerate(inputs)})
    arrays.update({f"layers/output/{k}": layer.output for k, layer in enumerate(layers)})
    return arrays
