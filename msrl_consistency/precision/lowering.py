"""The bundle's graphs with a set of layers kept in fp32 and the rest lowered, and the unlowered reference they are
measured against, in the same runtime, so that the only difference is the lowering.

* ``fp16``: the fp16 emulation (``inference.runtimes.fp16_emulation``) in ONNX Runtime, against the float32 ONNX
  graph in ONNX Runtime with the same settings (graph optimisations off);
* ``int8``: Lite's quantization (``[common_quant_param]``: full quantization with ``skip_quant_node`` for the kept
  layers' nodes, calibrated on observations the policy really saw; or weight quantization), converted by the
  bundle's converter from a fixed-batch copy of the ONNX graph and run by Lite, against the bundle's float32 ``.ms``
  in Lite.
"""

from __future__ import annotations

import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from inference.bundle import Bundle
from inference.bundle.precision_mode import converter_config
from inference.bundle.tensors import TensorMeta
from msrl_consistency.precision.layers import Layer, kept_nodes

QUANTIZATIONS = {"full": "FULL_QUANT", "weight": "WEIGHT_QUANT"}
CALIBRATION_SIZE = 200


def batch_one_onnx(source: Path, out: Path) -> Path:
    """A copy of ``source`` with a free batch dim fixed to 1: calibration runs the graph, and Lite needs every shape."""
    import onnx

    model = onnx.load(str(source))
    for value in [*model.graph.input, *model.graph.output]:
        dims = value.type.tensor_type.shape.dim
        if len(dims) and not dims[0].dim_value:
            dims[0].dim_value = 1
    onnx.save(model, str(out))
    return out


def write_calibration(where: Path, rows: np.ndarray) -> Path:
    """One input's calibration rows as Lite reads them: one raw batch-1 ``.bin`` per row in ``where``."""
    where.mkdir(parents=True, exist_ok=True)
    for k, row in enumerate(rows):
        row[None].tofile(where / f"{k:04d}.bin")
    return where


def quant_section(quantization: str, skip: Sequence[str] = ()) -> dict[str, Any]:
    """``[common_quant_param]``: 8-bit ``quantization`` ("full" or "weight") of every weight, ``skip`` nodes kept."""
    quant: dict[str, Any] = {"quant_type": QUANTIZATIONS[quantization], "bit_num": 8, "min_quant_weight_size": 0,
                             "min_quant_weight_channel": 0}  # fmt: skip
    if skip:
        quant["skip_quant_node"] = ",".join(skip)
    return quant


def full_quant_sections(dirs: Mapping[str, Path], bias_correction: bool = True) -> dict[str, dict[str, Any]]:
    """The converter's calibration and full-quantization sections for per-input calibration directories.
    ``bias_correction`` off keeps the biases as they are (a policy trained in int8 was trained with them)."""
    count = min(len(list(d.iterdir())) for d in dirs.values())
    return {"data_preprocess_param": {"calibrate_path": ",".join(f"{name}:{path}" for name, path in dirs.items()),
                                      "calibrate_size": count, "input_type": "BIN"},
            "full_quant_param": {"activation_quant_method": "MAX_MIN",
                                 "bias_correction": "true" if bias_correction else "false"}}  # fmt: skip


class SessionRuntime:
    """ONNX Runtime on one graph with ``Runtime.infer``'s interface (what ``acting.ModePolicy`` needs)."""

    def __init__(self, session: Any, outputs: Sequence[str]) -> None:
        self.session, self.outputs = session, list(outputs)
        self.inputs = [i.name for i in session.get_inputs()]

    def infer(self, *arrays: np.ndarray) -> dict[str, np.ndarray]:
        return dict(zip(self.outputs, self.session.run(self.outputs, dict(zip(self.inputs, arrays, strict=True))),
                        strict=True))  # fmt: skip

    def close(self) -> None:
        self.session = None


class PlanLiteRunner:
    """A Lite runner on one ``.ms`` with ``Runtime.infer``'s interface, its outputs in the contract's order."""

    def __init__(self, path: Path, outputs: Sequence[str]) -> None:
        from inference.lite.client import LiteRunner

        self.runner, self.outputs = LiteRunner(path, timeout=60.0, fork_server=True), list(outputs)  # one per plan

    def infer(self, *arrays: np.ndarray) -> dict[str, np.ndarray]:
        got = self.runner.infer(*arrays)
        return {name: got[name] for name in self.outputs}

    def close(self) -> None:
        self.runner.close()


def _outputs(bundle: Bundle, graph: str) -> list[str]:
    return [o["name"] for o in bundle.graph(graph)["outputs"]]


class Fp16Lowering:
    lower = "fp16"
    runtime = "emulated-fp16 (ONNX Runtime)"

    def __init__(self, bundle: Bundle, layers: Sequence[Layer]) -> None:
        import onnx

        self.bundle, self.layers = bundle, layers
        self.models = {g: onnx.load(str(bundle.file(g, "onnx"))) for g in bundle.graphs}

    def reference(self) -> dict[str, SessionRuntime]:
        from inference.runtimes.fp16_emulation import session

        return {g: SessionRuntime(session(m), _outputs(self.bundle, g)) for g, m in self.models.items()}

    def lowered(self, kept: frozenset[str]) -> dict[str, SessionRuntime]:
        from inference.runtimes.fp16_emulation import emulate_fp16, session

        return {g: SessionRuntime(session(emulate_fp16(m, kept_nodes(self.layers, kept, g))), _outputs(self.bundle, g))
                for g, m in self.models.items()}  # fmt: skip


class Int8Lowering:
    lower = "int8"
    runtime = "Lite (quantized .ms)"

    def __init__(self, bundle: Bundle, layers: Sequence[Layer], workdir: Path,
                 calibration: Mapping[str, Mapping[str, np.ndarray]], quantization: str = "full",
                 bias_correction: bool = True) -> None:  # fmt: skip
        """``calibration``: per graph, per input name, the rows Lite calibrates on (full quantization)."""
        from msrl_consistency.artifacts.graphs import DEFAULT_CONVERTER, ConverterUnavailable

        if not DEFAULT_CONVERTER.exists():
            raise ConverterUnavailable(f"Lite converter not built ({DEFAULT_CONVERTER}); run `make lite`")
        self.bundle, self.layers, self.workdir, self.quantization = bundle, layers, workdir, quantization
        self.bias_correction = bias_correction
        self.fixed: dict[str, Path] = {}
        self.calibration_dirs: dict[str, dict[str, Path]] = {}
        self._converted: dict[tuple[str, frozenset[str]], Path] = {}
        for graph in bundle.graphs:
            self.fixed[graph] = batch_one_onnx(bundle.file(graph, "onnx"), workdir / f"{graph}.fixed.onnx")
            if quantization == "full":
                self.calibration_dirs[graph] = self._calibration_files(graph, calibration[graph])

    def _calibration_files(self, graph: str, rows: Mapping[str, np.ndarray]) -> dict[str, Path]:
        dirs = {}
        metas = {t["name"]: TensorMeta.from_manifest(t) for t in self.bundle.graph(graph)["inputs"]}
        for name, values in rows.items():
            dirs[name] = write_calibration(self.workdir / "calibration" / graph / name,
                                           np.asarray(values, metas[name].dtype))  # fmt: skip
        return dirs

    def config(self, graph: str, kept: frozenset[str]) -> str:
        """The converter configuration of ``graph`` with ``kept`` in fp32 (``skip_quant_node``)."""
        sections = {"common_quant_param": quant_section(self.quantization, kept_nodes(self.layers, kept, graph))}
        if self.quantization == "full":
            sections.update(full_quant_sections(self.calibration_dirs[graph], self.bias_correction))
        return converter_config(self.bundle.target.get("device", "cpu"), self.bundle.target.get("precision_mode"),
                                sections)  # fmt: skip

    def convert(self, graph: str, kept: frozenset[str]) -> Path:
        """``graph``'s ``.ms`` with ``kept`` in fp32 (cached). Converted at batch 1 (calibration runs the graph), it
        runs at any batch: Lite resizes its inputs (the runner and the in-process library check every dim but the
        batch against the declared one)."""
        from msrl_consistency.artifacts.graphs import write_lite

        key = (graph, kept)
        if key not in self._converted:
            tag = f"{graph}.{len(self._converted)}"
            config = self.workdir / f"{tag}.cfg"
            config.write_text(self.config(graph, kept))
            self._converted[key] = write_lite(self.fixed[graph], self.workdir / f"{tag}.ms", config=config)
        return self._converted[key]

    def reference(self) -> dict[str, PlanLiteRunner]:
        return {g: PlanLiteRunner(self.bundle.file(g, "ms"), _outputs(self.bundle, g)) for g in self.bundle.graphs}

    def lowered(self, kept: frozenset[str]) -> dict[str, PlanLiteRunner]:
        return {g: PlanLiteRunner(self.convert(g, kept), _outputs(self.bundle, g)) for g in self.bundle.graphs}

    def copy_out(self, graph: str, kept: frozenset[str], target: Path) -> tuple[Path, str]:
        """The converted file and its configuration's text, for the plan's bundle."""
        shutil.copyfile(self.convert(graph, kept), target)
        return target, self.config(graph, kept)


def close(runtimes: Mapping[str, Any]) -> None:
    for rt in runtimes.values():
        rt.close()
