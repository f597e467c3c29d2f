"""``onnxruntime``: the bundle's ONNX graph on ONNX Runtime's CPU provider (one thread)."""

from __future__ import annotations

import functools
import importlib

import numpy as np

from inference.errors import first_line
from inference.runtimes.base import Runtime, RuntimeSource


@functools.cache
def import_problem() -> str | None:
    """Why ``import onnxruntime`` fails here (not installed, or installed but broken), or None."""
    try:
        importlib.import_module("onnxruntime")
    except ImportError as exc:
        if getattr(exc, "name", None) == "onnxruntime":
            return "the onnxruntime package is not installed"
        return f"onnxruntime is installed but does not import: {first_line(exc)}"
    except Exception as exc:  # noqa: BLE001 - a broken native extension raises anything on import
        return f"onnxruntime is installed but does not import: {type(exc).__name__}: {first_line(exc)}"
    return None


class OnnxRuntime(Runtime):
    name = "onnxruntime"
    description = "ONNX Runtime (CPUExecutionProvider) on the bundle's .onnx"
    fmt = "onnx"

    @classmethod
    def unavailable_reason(cls, source: RuntimeSource) -> str | None:
        return import_problem()

    def _load(self) -> None:
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.intra_op_num_threads = 1
        options.inter_op_num_threads = 1
        path = self.model_path()
        self.session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        self.input_names = [i.name for i in self.session.get_inputs()]
        self.output_names = [o.name for o in self.outputs]

    def _run(self, arrays: list[np.ndarray]) -> list[np.ndarray]:
        return self.session.run(self.output_names, dict(zip(self.input_names, arrays, strict=True)))

    def model_input_dtypes(self) -> list[np.dtype]:
        onnx_types = {"tensor(float)": "float32", "tensor(uint8)": "uint8", "tensor(int32)": "int32",
                      "tensor(int64)": "int64", "tensor(float16)": "float16", "tensor(double)": "float64"}  # fmt: skip
        return [np.dtype(onnx_types.get(i.type, "object")) for i in self.session.get_inputs()]

    def versions(self) -> dict[str, str]:
        import onnxruntime as ort

        return {"onnxruntime": ort.__version__}
