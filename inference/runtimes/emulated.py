"""``emulated-fp16``: the bundle's ONNX graph on the CPU as a device computing in fp16 would run it (an emulation).

Every operator's inputs, weights and outputs rounded to fp16, matrix products accumulated in fp32, as Ascend's
Cube unit computes (``fp16_emulation``). It shows what a device's fp16 does to the policy before deploying: verify
runs it with ``--emulate fp16`` (and on a bundle whose target computes in fp16) with every check, the stage
diagnosis and the first diverging layer. A precision plan's kept layers (``Bundle.plan``) stay in fp32 here as on the
device. It is an emulation on this CPU, not the device: reports say so.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from inference.runtimes.base import Runtime, RuntimeSource
from inference.runtimes.onnxrt import import_problem

EMULATION_NOTE = (
    "an emulation on this CPU, not the device: ONNX Runtime with every operator's inputs, weights and outputs "
    "rounded to fp16 and matrix products accumulated in fp32 (as Ascend's Cube unit)"
)


def kept_nodes(bundle: Any, graph: str) -> list[str]:
    """The ONNX nodes of ``graph`` that a bundle's fp16 plan keeps in fp32 (none without a plan)."""
    plan = bundle.plan or {}
    if plan.get("lower") != "fp16":
        return []
    return [name for layer in plan.get("layers", []) if layer.get("precision") == "fp32"
            for name in (layer.get("nodes") or {}).get(graph, [])]  # fmt: skip


def emulated_model(bundle: Any, graph: str) -> Any:
    """The bundle's ONNX graph rewritten for the emulation (its plan's kept layers in fp32)."""
    import onnx

    from inference.runtimes.fp16_emulation import emulate_fp16

    return emulate_fp16(onnx.load(str(bundle.file(graph, "onnx"))), kept_nodes(bundle, graph))


class EmulatedFp16Runtime(Runtime):
    name = "emulated-fp16"
    description = f"the bundle's .onnx in fp16: {EMULATION_NOTE}"
    fmt = "onnx"
    precision = "fp16"  # what it computes in: judged with the verifier's fp16 preset
    opt_in = True  # runs when asked (--emulate fp16, --runtimes) or when the device computes in fp16

    @classmethod
    def unavailable_reason(cls, source: RuntimeSource) -> str | None:
        problem = import_problem()
        if problem:
            return problem
        try:
            import onnx  # noqa: F401 - the graph is rewritten with it
        except ImportError:
            return "the onnx package is not installed (the emulation rewrites the ONNX graph)"
        return None

    def _load(self) -> None:
        from inference.runtimes.fp16_emulation import session

        self.session = session(emulated_model(self.source.bundle, self.graph))
        self.input_names = [i.name for i in self.session.get_inputs()]
        self.output_names = [o.name for o in self.outputs]

    def _run(self, arrays: list[np.ndarray]) -> list[np.ndarray]:
        return self.session.run(self.output_names, dict(zip(self.input_names, arrays, strict=True)))

    def versions(self) -> dict[str, str]:
        import onnxruntime as ort

        return {"onnxruntime": ort.__version__, "emulation": "fp16 (operator inputs, weights and outputs), fp32 "
                "accumulation of matrix products"}  # fmt: skip
