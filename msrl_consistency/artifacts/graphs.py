"""Write the policy's two graphs as MindIR, ONNX and MindSpore Lite ``.ms``.

* MindIR keeps a dynamic batch dimension directly (``Tensor(shape=[None, d])``).
* ONNX export in MindSpore 2.10 refuses dynamic shapes, so the graph is exported at batch 1 and its
  batch dimension is renamed to the symbol ``batch`` (valid because the policy graphs contain no
  batch-sized constants); output names are set to the contract's names.
* ``.ms`` comes from the Lite converter (``export/lite_converter.cc``) run on the ONNX file, the route
  that works with Lite 2.0.0, which cannot read MindIR v3.
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path

import mindspore as ms
import numpy as np
import onnx
from mindspore import Tensor, nn

from msrl_consistency.agent import ActorCritic, DeterministicPolicy, PolicySpec, StochasticPolicy

REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_CONVERTER = REPO_ROOT / ".lite" / "bin" / "msrl-lite-convert"


@dataclass(frozen=True)
class TensorSpec:
    name: str
    dtype: str
    shape: tuple[int, ...]  # -1 marks the dynamic batch dimension

    def to_dict(self) -> dict:
        return {"name": self.name, "dtype": self.dtype, "shape": list(self.shape)}


@dataclass(frozen=True)
class GraphSpec:
    """The cross-runtime I/O contract of one exported graph."""

    name: str  # "policy" | "policy_sample"
    kind: str  # "deterministic" | "stochastic"
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]

    def to_dict(self) -> dict:
        return {
            "kind": self.kind,
            "inputs": [t.to_dict() for t in self.inputs],
            "outputs": [t.to_dict() for t in self.outputs],
        }


def graph_specs(spec: PolicySpec) -> dict[str, GraphSpec]:
    obs = TensorSpec("obs", "float32", (-1, spec.obs_dim))
    if spec.discrete:
        action = TensorSpec("action", "int32", (-1,))
    else:
        action = TensorSpec("action", "float32", (-1, spec.action_dim))
    param = TensorSpec("logits" if spec.discrete else "mean", "float32", (-1, spec.action_dim))
    noise = TensorSpec("noise", "float32", (-1, spec.noise_dim))
    scalar = (-1,)
    return {
        "policy": GraphSpec("policy", "deterministic", (obs,), (action, param)),
        "policy_sample": GraphSpec(
            "policy_sample",
            "stochastic",
            (obs, noise),
            (action, TensorSpec("log_prob", "float32", scalar), TensorSpec("value", "float32", scalar)),
        ),
    }


class Float16Policy(nn.Cell):
    """Runs an fp16 copy of a head but keeps the float32 I/O contract, so runtimes need no special case."""

    def __init__(self, head: nn.Cell) -> None:
        super().__init__()
        self.head = head

    def construct(self, *inputs: Tensor) -> tuple[Tensor, ...]:
        outs = self.head(*[x.astype(ms.float16) for x in inputs])
        return tuple(o if o.dtype == ms.int32 else o.astype(ms.float32) for o in outs)


def export_heads(policy: ActorCritic, precision: str = "fp32") -> dict[str, nn.Cell]:
    """The Cells behind ``policy`` and ``policy_sample``; fp16 wraps a half-precision copy."""
    if precision == "fp16":
        policy.to_float(ms.float16)
        return {
            "policy": Float16Policy(DeterministicPolicy(policy)),
            "policy_sample": Float16Policy(StochasticPolicy(policy)),
        }
    return {"policy": DeterministicPolicy(policy), "policy_sample": StochasticPolicy(policy)}


def write_mindir(cell: nn.Cell, graph: GraphSpec, path: Path) -> Path:
    dynamic = [Tensor(shape=[None, *t.shape[1:]], dtype=ms.float32) for t in graph.inputs]
    ms.export(cell, *dynamic, file_name=str(path.with_suffix("")), file_format="MINDIR")
    return path


def write_onnx(cell: nn.Cell, graph: GraphSpec, path: Path) -> Path:
    examples = [Tensor(np.full((1, *t.shape[1:]), 0.5, np.float32)) for t in graph.inputs]
    ms.export(cell, *examples, file_name=str(path.with_suffix("")), file_format="ONNX")
    model = onnx.load(str(path))
    renames = {old.name: new.name for old, new in zip(model.graph.output, graph.outputs, strict=True)}
    for node in model.graph.node:
        node.output[:] = [renames.get(o, o) for o in node.output]
        node.input[:] = [renames.get(i, i) for i in node.input]
    for value in model.graph.output:
        value.name = renames[value.name]
    for value in [*model.graph.input, *model.graph.output]:
        value.type.tensor_type.shape.dim[0].dim_param = "batch"
    del model.graph.value_info[:]  # stale batch-1 shapes; runtimes re-infer them
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return path


class ConversionError(RuntimeError):
    pass


def write_lite(onnx_path: Path, path: Path, converter: Path = DEFAULT_CONVERTER) -> Path:
    """ONNX → ``.ms`` with the Lite converter binary built by ``make lite``."""
    if not converter.exists():
        raise ConversionError(f"Lite converter not built ({converter}); run `make lite`")
    proc = subprocess.run(
        [str(converter), "--onnx", str(onnx_path), "--out", str(path)], capture_output=True, text=True, timeout=300
    )
    if proc.returncode != 0 or not path.exists():
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
        raise ConversionError(f"Lite converter failed on {onnx_path.name}: {tail[0]}")
    return path
