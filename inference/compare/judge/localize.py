"""Point at the layer: the first layer of the policy whose output differs in a runtime, by the Cell's scope name.

The training side captures every layer's output in the reference Cell (forward hooks, in call order) and maps each
layer onto the exported ONNX graph (``LayerPlan``: the tensor that is that layer's output, anchored by the layer's
own Parameter names, which the exporter keeps as initializer names, then by graph order and op type for layers
without parameters). A runtime's own intermediate outputs are then read where it can give them:

* ONNX Runtime: every mapped tensor added as a graph output, run with graph optimisations off (one to one);
* Lite (``lite``, and ``lite-aarch64``'s ARM kernels): its kernels' outputs from the runner's tap request
  (``LiteRunner.infer_taps``). Kernels keep the ONNX node names; a kernel the converter fused carries the fused ops'
  last output, compared there and reported as the span of layers it covers; convolution outputs in Lite's NHWC
  layout are compared in the Cell's NCHW.

Each mapped layer is compared (cosine, max abs, max relative error) with the runtime's tolerance; the first that
fails is the first diverging layer. A layer that cannot be matched is said so, never guessed. Nothing here imports
MindSpore: the deploy side localises against the plan and layer outputs a golden file records.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from inference.compare.judge.stats import Tolerance, compare_arrays

AFTER_FIRST = 3  # layers reported after the first diverging one


@dataclass
class PlannedLayer:
    """One layer of the reference Cell: its scope name (``actor.layers.2``; ``#2`` for a second call), its Cell
    type, and the ONNX tensor that is its output (None, with ``why``, when it cannot be matched)."""

    scope: str
    kind: str
    tensor: str | None = None
    why: str = ""
    role: str = ""  # "preprocessing": the observation normaliser


Node = tuple[str, str, tuple[str, ...], tuple[str, ...], dict[str, float]]  # name, op, inputs, outputs, attributes


@dataclass
class LayerPlan:
    """The layers in call order and the ONNX graph's nodes ``(name, op_type, inputs, outputs, scalar attributes)``
    in order."""

    layers: list[PlannedLayer]
    nodes: list[Node] = field(default_factory=list)
    outside: list[str] = field(default_factory=list)  # the Cell's Parameters in no layer: not compared, but named

    def to_dict(self) -> dict[str, Any]:
        return {"layers": [asdict(layer) for layer in self.layers], "nodes": [list(n) for n in self.nodes],
                "outside": list(self.outside)}  # fmt: skip

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> LayerPlan:
        nodes = [(n[0], n[1], tuple(n[2]), tuple(n[3]), dict(n[4])) for n in data.get("nodes", [])]
        return cls([PlannedLayer(**layer) for layer in data["layers"]], nodes, list(data.get("outside", [])))


@dataclass(frozen=True)
class Fused:
    """A tensor a Lite kernel fused away: the kernel, the tensor it does output, and the elementwise ops between."""

    kernel: str
    output: str
    tail: tuple[tuple[str, tuple[tuple[str, float], ...]], ...]  # (op type, its scalar attributes)


# NumPy mirrors of the activations Lite fuses into a preceding kernel: the reference of a fused layer's output is
# carried through them to the kernel's output.
ACTIVATIONS: dict[str, Callable[[np.ndarray, Mapping[str, float]], np.ndarray]] = {
    "Relu": lambda x, a: np.maximum(x, 0),
    "Tanh": lambda x, a: np.tanh(x),
    "Sigmoid": lambda x, a: 1 / (1 + np.exp(-x)),
    "LeakyRelu": lambda x, a: np.where(x >= 0, x, a.get("alpha", 0.01) * x),
    "Identity": lambda x, a: x,
}


# Why a layer has no tensor of its own when it computes nothing in eval mode (Dropout): its input, the previous
# layer's output, is compared, so it hides no divergence.
IDENTITY_IN_EVAL_NOTE = "an identity in eval mode: the graph has no op of its own for it (its input is compared)"


@dataclass
class LayerComparison:
    scope: str
    kind: str
    status: str  # pass | fail | unmatched | fused
    cosine: float | None = None
    max_abs: float | None = None
    max_rel: float | None = None
    note: str = ""
    role: str = ""  # "preprocessing": the observation normaliser


@dataclass
class Localization:
    """One runtime's localisation: the first diverging layer (None: none found, ``message`` says why)."""

    runtime: str
    first: str | None
    first_kind: str | None
    layers: list[LayerComparison]
    message: str
    method: str = "layer outputs"

    @property
    def first_role(self) -> str:
        """The role of the first diverging layer ("preprocessing" for the observation normaliser; "" otherwise)."""
        return next((c.role for c in self.layers if c.scope == self.first), "") if self.first else ""

    def line(self) -> str:
        if self.first is None:
            return f"{self.runtime}: {self.message}"
        head = next(c for c in self.layers if c.scope == self.first)
        return (
            f"{self.runtime}: first diverging layer: {self.first} ({self.first_kind}), cosine {head.cosine:.6f}, "
            f"max abs {head.max_abs:.2e}, max rel {head.max_rel:.2e}{'; ' + self.message if self.message else ''}"
        )

    def to_dict(self) -> dict[str, Any]:
        return {"runtime": self.runtime, "method": self.method, "first_diverging_layer": self.first,
                "first_diverging_kind": self.first_kind, "message": self.message,
                "layers": [asdict(c) for c in self.layers]}  # fmt: skip


def compare_layers(
    runtime: str, plan: LayerPlan, reference: Sequence[np.ndarray], got: Mapping[str, np.ndarray],
    tol: Tolerance, fused: Mapping[str, str] | None = None,
) -> Localization:  # fmt: skip
    """Compare each planned layer's reference output (``reference``, in plan order) with the runtime's value of its
    tensor (``got``); ``fused``: tensor → the kernel that fused it away (no value of its own in this runtime)."""
    rows: list[LayerComparison] = []
    first = None
    reshaped = {out for _, op, _, outs, _ in plan.nodes if op in REINTERPRETING for out in outs}
    for layer, want in zip(plan.layers, reference, strict=True):
        row = _compare_layer(layer, want, got, tol, fused or {}, reshaped)
        rows.append(row)
        if row.status == "fail" and first is None:
            first = row
    return conclude(runtime, rows, first, outside=plan.outside)


def _compare_layer(
    layer: PlannedLayer, want: np.ndarray, got: Mapping[str, np.ndarray], tol: Tolerance, fused: Mapping[str, Fused],
    reshaped: set[str] = frozenset(),  # type: ignore[assignment]
) -> LayerComparison:  # fmt: skip
    """One planned layer against the runtime's value of its tensor (or of the kernel that fused it away)."""
    unmatched = lambda note: LayerComparison(layer.scope, layer.kind, "unmatched", note=note, role=layer.role)  # noqa: E731
    if layer.tensor is None:
        return unmatched(layer.why)
    note, tensor = "", layer.tensor
    if tensor not in got and tensor in fused:
        f = fused[tensor]
        if not all(op in ACTIVATIONS for op, _ in f.tail) or f.output not in got:
            return LayerComparison(layer.scope, layer.kind, "fused", note=f"fused into kernel {f.kernel}",
                                   role=layer.role)  # fmt: skip
        for op, attrs in f.tail:  # the reference carried to the fused kernel's output
            want = ACTIVATIONS[op](np.asarray(want, np.float64), dict(attrs)).astype(np.float32)
        note = f"fused with {'+'.join(op for op, _ in f.tail)} in kernel {f.kernel}: compared at its output"
        tensor = f.output
    if tensor not in got:
        return unmatched(f"no output {tensor!r} here")
    value = to_layout(np.asarray(got[tensor]), np.asarray(want), tensor in reshaped)
    if value is None:
        where = f" (kernel output {tensor!r})" if tensor != layer.tensor else ""
        return unmatched(f"shape {list(np.shape(got[tensor]))}{where} vs {list(np.shape(want))}: no exact layout "
                         "mapping")  # fmt: skip
    with np.errstate(all="ignore"):
        cmp = compare_arrays(layer.scope, want, value, tol)
    return LayerComparison(layer.scope, layer.kind, "pass" if cmp.passed else "fail", cmp.cosine, cmp.max_abs,
                           cmp.max_rel, note, layer.role)  # fmt: skip


def conclude(
    runtime: str, rows: list[LayerComparison], first: LayerComparison | None, agreed: str | None = None,
    outside: Sequence[str] = (),
) -> Localization:  # fmt: skip
    """The localisation from the per-layer rows: the first diverging layer (the rows up to it and ``AFTER_FIRST``
    after it), naming the layers before it that could not be compared; or, when none diverges, ``agreed`` (default:
    how many matched layers agree and where an error within tolerance grows). Either way, the layers that could not
    be compared and the Cell's Parameters outside every layer (``outside``) are named: a claim never covers them."""
    skipped = [r.scope for r in rows if r.status not in ("pass", "fail") and r.note != IDENTITY_IN_EVAL_NOTE]
    loose = [f"Parameter {name} (outside every layer)" for name in outside]
    if first is None:
        compared = sum(r.status in ("pass", "fail") for r in rows)
        if not compared:
            why = "no layer could be matched in this runtime"
        elif skipped or loose:
            why = (f"the {compared} layers compared agree within tolerance{_growth(rows)}; not compared: "
                   f"{', '.join(skipped + loose)}, so the difference may be there")  # fmt: skip
        else:
            why = agreed or f"every one of the {compared} matched layers agrees within tolerance{_growth(rows)}"
        return Localization(runtime, None, None, rows, why)
    at = rows.index(first)
    blind = [r.scope for r in rows[:at] if r.status not in ("pass", "fail") and r.note != IDENTITY_IN_EVAL_NOTE]
    caveat = (f"{', '.join(blind)} before it could not be compared here, so the divergence may start there"
              if blind else "")  # fmt: skip
    also = f"not compared: {', '.join(loose)}" if loose else ""
    message = "; ".join(m for m in (first.note, caveat, also) if m)
    return Localization(runtime, first.scope, first.kind, rows[: at + 1 + AFTER_FIRST], message)


def _growth(rows: Sequence[LayerComparison]) -> str:
    """Where an error within tolerance appears and where it peaks along the network (an fp16 graph's rounding)."""
    compared = [r for r in rows if r.max_abs]
    if not compared:
        return ""
    first, peak = compared[0], max(compared, key=lambda r: r.max_abs or 0.0)
    if peak is first:
        return f"; the error appears at {first.scope} (max abs {first.max_abs:.1e}) and does not grow after it"
    return (
        f"; the error appears at {first.scope} (max abs {first.max_abs:.1e}) and peaks at {peak.scope} "
        f"({peak.max_abs:.1e})"
    )


# runtime, graph, the feed rows to run on, the graph's inputs on them, the runtime's tolerance → the comparison
Localizer = Callable[[str, str, np.ndarray, Sequence[np.ndarray], Tolerance], Localization]


@dataclass
class RecordedLayers:
    """A golden file's layers (``verify --save-golden --golden-layers``): the plan of the deciding graph, the feed
    rows recorded with the graph's inputs on them, and every layer's reference output there. The deploy side's
    localizer, without MindSpore: it runs on the recorded rows among those asked for (all of them if none is)."""

    graph: str
    plan: LayerPlan
    rows: np.ndarray
    inputs: list[np.ndarray]
    outputs: list[np.ndarray]
    bundle: Any  # inference.bundle.Bundle
    device: str = "cpu"

    def __call__(
        self, runtime: str, graph: str, rows: np.ndarray, inputs: Sequence[np.ndarray], tol: Tolerance
    ) -> Localization:
        if graph != self.graph:
            return Localization(runtime, None, None, [], f"not localized: the golden file records layers of "
                                f"{self.graph!r}, not {graph!r}", method="none")  # fmt: skip
        keep = np.isin(self.rows, rows)
        picked = np.flatnonzero(keep) if keep.any() else np.arange(len(self.rows))
        feeds = [x[picked] for x in self.inputs]
        reference = [out[picked] for out in self.outputs]
        return localize_runtime(runtime, self.bundle, graph, self.plan, reference, feeds, tol, self.device)


def localize_runtime(
    runtime: str, bundle: Any, graph: str, plan: LayerPlan, reference: Sequence[np.ndarray],
    feeds: Sequence[np.ndarray], tol: Tolerance, device: str = "cpu",
) -> Localization:  # fmt: skip
    """The one runtime dispatch of both sides (the training side's Cell, a golden file's recorded layers): run
    ``graph`` on ``feeds`` in ``runtime`` with every planned tensor exposed (Lite, x86 or ARM: the runner's kernel taps
    on the ``.ms``; ONNX Runtime: the ``.onnx`` with its intermediate tensors as outputs) and compare them with
    ``reference``, the plan's layers' outputs."""
    runner = _tap_runner(runtime, bundle, graph, device)
    if runner is not None:  # a Lite runner on the .ms (x86, or the ARM kernels of lite-aarch64)
        with runner:
            values, fused = lite_tensors(plan, runner.infer_taps(*feeds))
        return compare_layers(runtime, plan, reference, values, tol, fused)
    if runtime == "onnxruntime":
        try:
            import onnx  # noqa: F401 - the ONNX graph is edited to expose its intermediate tensors
        except ImportError:
            return Localization(runtime, None, None, [], "not localized: needs the onnx package", method="none")
        names = [layer.tensor for layer in plan.layers if layer.tensor]
        got = onnx_tensors(str(bundle.file(graph, "onnx")), names, feeds)
        return compare_layers(runtime, plan, reference, got, tol)
    if runtime == "emulated-fp16":  # the rewritten graph keeps every tensor's name: the same search as onnxruntime's
        import tempfile
        from pathlib import Path

        from inference.runtimes.emulated import emulated_model

        names = [layer.tensor for layer in plan.layers if layer.tensor]
        with tempfile.TemporaryDirectory(prefix="msrl-emulated-") as tmp:
            path = Path(tmp) / f"{graph}.onnx"
            path.write_bytes(emulated_model(bundle, graph).SerializeToString())
            got = onnx_tensors(str(path), names, feeds)
        return compare_layers(runtime, plan, reference, got, tol)
    return Localization(runtime, None, None, [], f"not localized: {runtime} gives no per-layer outputs here",
                        method="none")  # fmt: skip


def _tap_runner(runtime: str, bundle: Any, graph: str, device: str) -> Any:
    """The Lite runner ``runtime`` runs ``graph``'s ``.ms`` in, for a tap request; None if it is not a Lite runtime."""
    from inference.runtimes.base import RuntimeSource
    from inference.runtimes.lite import tap_runner

    return tap_runner(runtime, RuntimeSource(bundle, device=device), graph)


# Ops whose output holds their input's elements in the same order (a multi-head attention's projection reshaped to
# heads: the exporter merges the Dense's own reshape with the policy's into one, and no tensor has the layer's shape)
REINTERPRETING = {"Reshape", "Flatten", "Squeeze", "Unsqueeze"}


def to_layout(value: np.ndarray, like: np.ndarray, reshaped: bool = False) -> np.ndarray | None:
    """``value`` in ``like``'s layout, only where the mapping is exact: as it is; an NHWC tensor (Lite's
    convolutions) as NCHW; a reshape that only adds or drops axes of size 1 (the elements keep their order); or, for
    a tensor ``reshaped`` from the layer's output (``REINTERPRETING``), any shape with its batch and element count.
    None otherwise: reshaping a tensor whose axes are ordered otherwise would compare unrelated elements."""
    if value.shape == like.shape:
        return value
    if reshaped and value.size == like.size and value.shape[:1] == like.shape[:1]:
        return value.reshape(like.shape)
    if value.ndim == 4 and like.ndim == 4 and value.shape == (like.shape[0], *like.shape[2:], like.shape[1]):
        return np.transpose(value, (0, 3, 1, 2))
    if [d for d in value.shape if d != 1] == [d for d in like.shape if d != 1]:
        return value.reshape(like.shape)
    return None


def lite_tensors(plan: LayerPlan, kernels: Sequence[Any]) -> tuple[dict[str, np.ndarray], dict[str, Fused]]:
    """ONNX tensor name → value from Lite's kernel taps, and the tensors fused away (``Fused``).

    A kernel carries an ONNX node's name; its output is that node's output, or, when the converter fused the
    node's successors into it, the output of the last one fused (the ONNX nodes after it with no kernel of their
    own, consuming its result). A ``<node>_post`` transpose kernel carries ``<node>``'s output in NCHW.
    """
    by_name = {k.name: k for k in kernels}
    values: dict[str, np.ndarray] = {}
    fused: dict[str, Fused] = {}
    nodes = plan.nodes
    k = 0
    while k < len(nodes):
        kernel = by_name.get(nodes[k][0])
        if kernel is None or not kernel.outputs:
            k += 1
            continue
        chain, last = [nodes[k][3][0]], k
        while last + 1 < len(nodes) and nodes[last + 1][0] not in by_name and chain[-1] in nodes[last + 1][2]:
            last += 1
            chain.append(nodes[last][3][0])
        values[chain[-1]] = next(iter(kernel.outputs.values()))
        for at, inner in enumerate(chain[:-1]):
            tail = tuple((n[1], tuple(sorted(n[4].items()))) for n in nodes[k + at + 1 : last + 1])
            fused[inner] = Fused(kernel.name, chain[-1], tail)
        k = last + 1
    for kernel in kernels:
        if kernel.name.endswith("_post") and kernel.outputs:  # Lite's layout change back to NCHW after a kernel
            node = next((n for n in nodes if n[0] == kernel.name[: -len("_post")]), None)
            if node is not None:
                values[node[3][0]] = next(iter(kernel.outputs.values()))
                fused.pop(node[3][0], None)
    return values, fused


def onnx_tensors(model_path: str, names: Sequence[str], inputs: Sequence[np.ndarray]) -> dict[str, np.ndarray]:
    """The named intermediate tensors of an ONNX graph on ``inputs``, from ONNX Runtime with graph optimisations off
    (so nodes stay one to one). Needs the ``onnx`` package to add them as outputs."""
    import onnx
    import onnxruntime as ort

    model = onnx.load(model_path)
    inferred = onnx.shape_inference.infer_shapes(model)
    types = {v.name: v.type.tensor_type.elem_type for v in [*inferred.graph.value_info, *inferred.graph.output]}
    present = {o.name for o in model.graph.output}
    for name in names:
        if name not in present and name in types:
            model.graph.output.append(onnx.helper.make_tensor_value_info(name, types[name], None))
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.log_severity_level = 3  # errors only: unused initializers are no news here
    options.intra_op_num_threads = 1
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    feed = {i.name: a for i, a in zip(session.get_inputs(), inputs, strict=True)}
    wanted = [n for n in names if n in {o.name for o in session.get_outputs()}]
    return dict(zip(wanted, session.run(wanted, feed), strict=True))
