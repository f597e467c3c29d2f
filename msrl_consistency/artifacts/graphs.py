"""Describe and write policy graphs as MindIR, ONNX and MindSpore Lite ``.ms``.

A graph's I/O comes from our trainer's spec (``trainer_graphs``) or from probing a user's Cell against its
contract (``probe_graph``). Then:

* MindIR keeps a dynamic batch dimension directly (``Tensor(shape=[None, d])``).
* ONNX export in MindSpore 2.10 refuses dynamic shapes, so the graph is exported at three batch sizes and the
  constants the exporter froze are made functions of the runtime batch (``onnx_batch``); the batch dimension of
  its inputs and batched outputs is the symbol ``batch`` (the export self-check runs it at batch 256); inputs and
  outputs get the contract's names (MindSpore names outputs by node number).
* ``.ms`` comes from the Lite converter (``export/lite_converter.cc``) run on the ONNX file, the route
  that works with Lite 2.0.0, which cannot read MindIR v3.
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import mindspore as ms
import numpy as np
import onnx
from mindspore import Tensor, nn

from inference.bundle.contract import NOISE, OBS, ActionSpec, ContractError, Field, PolicyContract
from inference.bundle.tensors import TensorMeta
from inference.errors import RuntimeUnavailable, first_line
from msrl_consistency import compat
from msrl_consistency.agent import ActorCritic, DeterministicPolicy, PolicySpec, StochasticPolicy
from msrl_consistency.artifacts.onnx_batch import EXPORT_BATCHES, BatchDependent, batch_dependent, symbolic_batch
from msrl_consistency.artifacts.onnx_patterns import (
    drop_expand_squeeze,
    drop_noop_slices,
    explicit_reduce_axes,
    fix_output_casts,
    fix_shrink_slices,
    fuse_leaky_relu,
    hoist_input_transposes,
    restore_marked,
    slice_unread_splits,
    split_reduce_sum_square,
)
from msrl_consistency.artifacts.substitutes import SubstituteError, substituted

REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_CONVERTER = REPO_ROOT / ".lite" / "bin" / "msrl-lite-convert"


@dataclass(frozen=True)
class GraphIO:
    """One exported graph's inputs and outputs (``-1`` marks the batch dim) and how it acts."""

    name: str
    kind: str  # "deterministic" | "stochastic" (takes sampling noise)
    inputs: tuple[TensorMeta, ...]
    outputs: tuple[TensorMeta, ...]

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "inputs": [t.to_dict() for t in self.inputs],
            "outputs": [t.to_dict() for t in self.outputs],
        }


def trainer_graphs(spec: PolicySpec) -> dict[str, GraphIO]:
    """The two graphs of our ``ActorCritic`` (their contracts: ``trainer_contracts``)."""
    f32 = np.dtype("float32")
    obs = TensorMeta("obs", f32, (-1, spec.obs_dim))
    if spec.discrete:
        action = TensorMeta("action", np.dtype("int32"), (-1,))
    else:
        action = TensorMeta("action", f32, (-1, spec.action_dim))
    param = TensorMeta("logits" if spec.discrete else "mean", f32, (-1, spec.action_dim))
    noise = TensorMeta("noise", f32, (-1, spec.noise_dim))
    return {
        "policy": GraphIO("policy", "deterministic", (obs,), (action, param)),
        "policy_sample": GraphIO(
            "policy_sample",
            "stochastic",
            (obs, noise),
            (action, TensorMeta("log_prob", f32, (-1,)), TensorMeta("value", f32, (-1,)), param),
        ),
    }


def trainer_contracts(spec: PolicySpec, log_std: list[float] | None, env_id: str | None) -> dict[str, PolicyContract]:
    """The contracts of ``trainer_graphs``, as instances of the general contract (what export records).

    ``policy``: obs → (env action, logits | mean), the action post-processed in the graph; ``policy_sample``:
    (obs, noise) → (env action, log-prob, value, logits | mean), sampling in the graph from the given noise
    (Gumbel-max of the logits, or the mean plus std times the noise, post-processed). ``log_std``: the Gaussian
    head's state-independent log-std (None for a discrete policy).
    """
    obs = (Field(OBS, (spec.obs_dim,)),)
    param = "logits" if spec.discrete else "mean"
    if spec.discrete:
        action = ActionSpec("categorical", logits=param, action="action")
    else:
        action = ActionSpec(
            "gaussian",
            mean=param,
            log_std=tuple(float(v) for v in (log_std or [])) or None,
            action="action",
            squash=spec.action_postprocess,
            rescale=spec.action_postprocess == "clip",
            low=tuple(spec.action_low),
            high=tuple(spec.action_high),
        )
    sample_outputs = ("action", "log_prob", "value", param)
    contracts = {
        "policy": PolicyContract(obs, ("action", param), action, env_id=env_id),
        "policy_sample": PolicyContract(
            obs,
            sample_outputs,
            action,
            noise_shape=(spec.noise_dim,),
            noise_kind=spec.noise_kind,
            env_id=env_id,
            value="value",
            log_prob="log_prob",
        ),  # fmt: skip
    }
    for contract in contracts.values():
        contract.validate()
    return contracts


def probe_graph(cell: nn.Cell, contract: PolicyContract, name: str = "policy") -> GraphIO:
    """A user's Cell's I/O, found by running it at two batch sizes: an output dim that follows the batch is
    the batch dim (``-1``); an output that ignores the batch (a state-independent ``std``) keeps its shape.

    Raises ``ContractError`` when the Cell and the contract disagree (output count, shapes, dtypes).
    """
    inputs = contract.input_metas()
    shapes: list[list[tuple[int, ...]]] = []
    dtypes: list[np.dtype] = []
    rng = np.random.default_rng(0)
    for batch in (2, 3):
        feeds = [Tensor(x) for x in examples(contract, batch, rng)]
        try:
            with compat.execution_mode(graph=False):
                outs = [o.asnumpy() for o in compat.as_tuple(cell(*feeds))]
        except Exception as exc:  # noqa: BLE001 - the user's Cell may raise anything on a wrong input shape
            op = compat.no_kernel_here(exc)
            if op is not None:  # not the contract's fault: the Cell cannot run on this device at all
                device = ms.get_context("device_target")
                raise RuntimeUnavailable(
                    f"the Cell fails on this device ({device}): MindSpore has no {op} kernel "
                    f"here ({first_line(exc, 160)})"
                ) from None
            raise ContractError(
                f"the Cell fails on inputs shaped by the contract ({', '.join(str(t.shape) for t in inputs)}): "
                f"{first_line(exc)}"
            ) from None
        shapes.append([o.shape for o in outs])
        dtypes = [o.dtype for o in outs]
    if len(shapes[0]) != len(contract.outputs):
        raise ContractError(
            f"the Cell returns {len(shapes[0])} output(s), the contract names {len(contract.outputs)}: "
            f"{list(contract.outputs)}"
        )
    outputs = []
    for out_name, a, b, dtype in zip(contract.outputs, shapes[0], shapes[1], dtypes, strict=True):
        batched = len(a) >= 1 and (a[0], b[0]) == (2, 3) and a[1:] == b[1:]
        if not batched and a != b:
            raise ContractError(f"output {out_name!r} changes shape with the batch in a way other than its first dim")
        outputs.append(TensorMeta(out_name, np.dtype(dtype), (-1, *a[1:]) if batched else tuple(a)))
    contract.check_io(outputs)
    kind = "stochastic" if contract.takes_noise else "deterministic"
    return GraphIO(name, kind, tuple(inputs), tuple(outputs))


class Float16Policy(nn.Cell):
    """Runs an fp16 copy of a head but keeps the float32 I/O contract, so runtimes need no special case.

    The float inputs marked in ``half`` (observations, carried state) enter in fp16; integer inputs (uint8 frames)
    go in as they are. The sampling noise stays float32, so its transform (Gumbel's ``-log(-log(u))``,
    ``mean + std * eps``) runs in float32 where fp16 layer outputs meet it: in fp16 the uniform clamp ``1 - 1e-6``
    rounds to 1.0 and every draw above ~0.99976 became an infinite Gumbel sample.
    """

    def __init__(self, head: nn.Cell, half: tuple[bool, ...]) -> None:
        super().__init__()
        self.head = head
        self.half = half

    def construct(self, *inputs: Tensor) -> tuple[Tensor, ...]:
        cast = tuple(x.astype(ms.float16) if h else x for x, h in zip(inputs, self.half))  # noqa: B905 - graph mode
        outs = self.head(*cast)
        outs = outs if isinstance(outs, tuple) else (outs,)  # a single-output Cell returns a bare Tensor
        return tuple(o if o.dtype == ms.int32 else o.astype(ms.float32) for o in outs)


def half_inputs(contract: PolicyContract) -> tuple[bool, ...]:
    """Which of a graph's inputs an fp16 export casts: every float32 input but the sampling noise."""
    return tuple(t.dtype == np.float32 and t.name != NOISE for t in contract.input_metas())


def export_heads(policy: ActorCritic, precision: str = "fp32") -> dict[str, nn.Cell]:
    """The Cells behind ``policy`` and ``policy_sample``; fp16 wraps a half-precision copy (its layers in fp16)."""
    if precision == "fp16":
        compat.layers_to_float16(policy)
        return {
            "policy": Float16Policy(DeterministicPolicy(policy), (True,)),  # (obs)
            "policy_sample": Float16Policy(StochasticPolicy(policy), (True, False)),  # (obs, noise)
        }
    return {"policy": DeterministicPolicy(policy), "policy_sample": StochasticPolicy(policy)}


def example(meta: TensorMeta, batch: int, rng: np.random.Generator | None = None, high: int = 256) -> np.ndarray:
    """An input of ``meta``'s dtype and shape at ``batch``: standard-normal floats (or 0.5 everywhere without
    ``rng``), integers in 0..high-1 (1 everywhere without ``rng``)."""
    shape = (batch, *meta.shape[1:])
    if meta.dtype.kind in "iu":
        return (rng.integers(0, high, shape) if rng is not None else np.full(shape, 1)).astype(meta.dtype)
    return (rng.standard_normal(shape) if rng is not None else np.full(shape, 0.5)).astype(meta.dtype)


def examples(contract: PolicyContract, batch: int, rng: np.random.Generator) -> list[np.ndarray]:
    """Random inputs of every graph input of ``contract`` (a ``Discrete(N)`` observation: indices below ``N``)."""
    highs = {f.name: f.discrete for f in contract.observations if f.discrete is not None}
    return [example(t, batch, rng, highs.get(t.name, 256)) for t in contract.input_metas()]


def write_mindir(cell: nn.Cell, graph: GraphIO, path: Path, substitutes: list[str] | None = None) -> Path:
    """MindIR with a dynamic batch; every input keeps its dtype (a uint8 frame stays uint8). Recurrent layers are
    written as their substitutes (``substitutes.py``: MindSpore's own loop keeps the first call's batch in a
    dynamic-batch MindIR), one line each appended to ``substitutes``."""
    dynamic = [Tensor(shape=[None, *t.shape[1:]], dtype=compat.ms_dtype(t.dtype)) for t in graph.inputs]
    cell = compat.exportable(cell, [Tensor(example(t, 2)) for t in graph.inputs])
    with substituted(cell, [], only=("recurrent",)) as used, compat.compile_log_captured():
        ms.export(cell, *dynamic, file_name=str(path.with_suffix("")), file_format="MINDIR")
    if substitutes is not None:
        substitutes += used
    return path


def write_onnx(
    cell: nn.Cell, graph: GraphIO, path: Path, substitutes: list[str] | None = None, fixed_batch: int | None = None
) -> Path:
    """Export at two of ``EXPORT_BATCHES`` (all three where they differ), make the batch symbolic (frozen constants,
    inputs, batched outputs), then give inputs and outputs the contract's names. Layers the exporter cannot write are
    written as their substitutes (``substitutes.py``; one line each appended to ``substitutes``).
    ``fixed_batch``: one export at that batch, which the graph keeps (a caller that only ever runs that batch: the
    training rollout). ``ConversionError`` when a constant cannot be made symbolic or a layer has no exact
    substitute."""
    cell = compat.exportable(cell, [Tensor(example(t, 2)) for t in graph.inputs])

    def export_at(batch: int) -> onnx.ModelProto:
        examples = [Tensor(example(t, batch)) for t in graph.inputs]
        with compat.onnx_ops_marked(), compat.compile_log_captured():
            ms.export(cell, *examples, file_name=str(path.with_suffix("")), file_format="ONNX")
        return onnx.load(str(path))

    try:
        with substituted(cell, [Tensor(example(t, 2)) for t in graph.inputs]) as used:
            batches = EXPORT_BATCHES[:2] if fixed_batch is None else (fixed_batch,)
            exports = [export_at(batch) for batch in batches]
            if fixed_batch is None and batch_dependent(exports):  # a compile each: the third only checks a rewrite
                batches = EXPORT_BATCHES
                exports.append(export_at(batches[2]))
    except SubstituteError as exc:
        raise ConversionError(f"ONNX export: {exc}") from None
    if substitutes is not None:
        substitutes += used
    try:
        model = exports[0] if fixed_batch is not None else symbolic_batch(exports, batches)
    except BatchDependent as exc:
        path.unlink()
        raise ConversionError(f"ONNX: {exc}") from None
    restore_marked(model, compat.ONNX_MARKERS)
    split_reduce_sum_square(model)
    fix_shrink_slices(model)
    drop_noop_slices(model)
    explicit_reduce_axes(model)
    drop_expand_squeeze(model, exports[0])
    slice_unread_splits(model)
    fix_output_casts(model)
    fuse_leaky_relu(model)
    hoist_input_transposes(model)
    _name_io(model, graph)
    outputs = zip(model.graph.output, graph.outputs, strict=True)
    for value in [*model.graph.input, *(v for v, meta in outputs if meta.shape[:1] == (-1,))] * (fixed_batch is None):
        value.type.tensor_type.shape.dim[0].dim_param = "batch"
    del model.graph.value_info[:]  # stale batch-1 shapes; runtimes re-infer them
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return path


def _name_io(model: onnx.ModelProto, graph: GraphIO) -> None:
    """Give the ONNX graph's inputs and outputs the contract's names (MindSpore names inputs after ``construct``'s
    parameters and outputs by node number). An output that is not a node's own (an input passed through, or the
    same tensor returned twice) gets an ``Identity`` node of its own name. A tensor that already bears one of
    those names (a Parameter ``log_std`` returned as the output ``log_std``) is renamed out of the way first."""
    _free_names(model, {t.name for t in (*graph.inputs, *graph.outputs)})
    for value, meta in zip(model.graph.input, graph.inputs, strict=True):
        if value.name != meta.name:
            for node in model.graph.node:
                node.input[:] = [meta.name if i == value.name else i for i in node.input]
            for out in model.graph.output:
                out.name = meta.name if out.name == value.name else out.name
            value.name = meta.name
    produced = {o for node in model.graph.node for o in node.output}
    renamed: dict[str, str] = {}  # a node output → the contract name it now has
    for value, meta in zip(model.graph.output, graph.outputs, strict=True):
        source = value.name
        if source in produced and source not in renamed:
            for node in model.graph.node:
                node.output[:] = [meta.name if o == source else o for o in node.output]
                node.input[:] = [meta.name if i == source else i for i in node.input]
            renamed[source] = meta.name
        else:
            src = renamed.get(source, source)
            model.graph.node.append(onnx.helper.make_node("Identity", [src], [meta.name], name=f"{meta.name}/out"))
        value.name = meta.name


def _free_names(model: onnx.ModelProto, names: set[str]) -> None:
    """Rename every graph input, initializer and node output called one of ``names`` to a name of its own, everywhere
    it appears (so the contract's names can be given without a tensor being defined twice)."""
    g = model.graph
    defined = [*(i.name for i in g.input), *(i.name for i in g.initializer), *(o for n in g.node for o in n.output)]
    taken = set(defined) | {i for n in g.node for i in n.input} | {o.name for o in g.output}
    for old in dict.fromkeys(d for d in defined if d in names):
        new, k = f"{old}/tensor", 1
        while new in taken:
            new, k = f"{old}/tensor{k}", k + 1
        taken.add(new)
        for value in [*g.input, *g.initializer, *g.output]:
            value.name = new if value.name == old else value.name
        for node in g.node:
            node.input[:] = [new if i == old else i for i in node.input]
            node.output[:] = [new if o == old else o for o in node.output]


class ConversionError(RuntimeError):
    """A format could not be produced from this graph."""


class ConverterUnavailable(ConversionError):
    """The tool that produces a format is not on this machine (not a problem of the graph)."""


def write_lite(
    onnx_path: Path, path: Path, converter: Path = DEFAULT_CONVERTER, fp16_weights: bool = False,
    config: Path | None = None,
) -> Path:  # fmt: skip
    """ONNX → ``.ms`` with the Lite converter binary built by ``make lite``; ``fp16_weights`` stores the float32
    weights as float16 (how Lite deploys fp16; inputs and outputs stay float32); ``config``: Lite's converter
    configuration file (precision mode, quantization)."""
    if not converter.exists():
        raise ConverterUnavailable(f"Lite converter not built ({converter}); run `make lite`")
    args = [str(converter), "--onnx", str(onnx_path), "--out", str(path), *(["--fp16"] if fp16_weights else []),
            *(["--config", str(config)] if config is not None else [])]  # fmt: skip
    proc = subprocess.run(args, capture_output=True, text=True, timeout=300)
    if proc.returncode != 0 or not path.exists():
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
        raise ConversionError(f"Lite converter failed on {onnx_path.name}: {tail[0]}")
    return path
