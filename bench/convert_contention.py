"""The int8 converter on a busy machine: calibration on one thread (the default) against Lite's own thread count.

Lite's full-quant calibration runs its sessions on 4 threads capped at the core count, and its kernel threads wait
by spinning on ``sched_yield``; ``msrl-lite-convert`` reports one core to Lite (``MSRL_LITE_CONVERT_CORES`` sets
another count). Each row converts the same ONNX MLP with full-quant calibration, on an idle machine and with one
busy-looping process per core but one beside it; the baseline is one core on the idle machine, in the same run.
Usage: ``python bench/convert_contention.py [--repeats 5] [--cores 1,2]``
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from inference.bundle.precision_mode import converter_config
from msrl_consistency.precision.lowering import full_quant_sections, quant_section, write_calibration

REPO = Path(__file__).resolve().parents[1]
CONVERTER = REPO / ".lite" / "bin" / "msrl-lite-convert"


def write_case(where: Path, hidden: int = 64, rows: int = 200) -> tuple[Path, Path]:
    """A CartPole-sized Gemm/Tanh MLP at batch 1, its calibration rows and the full-quant configuration."""
    rng = np.random.default_rng(0)
    shapes = {"w1": (4, hidden), "b1": (hidden,), "w2": (hidden, hidden), "b2": (hidden,), "w3": (hidden, 2),
              "b3": (2,)}  # fmt: skip
    inits = [numpy_helper.from_array((rng.standard_normal(s) * 0.3).astype(np.float32), n) for n, s in shapes.items()]
    nodes = [helper.make_node("Gemm", ["obs", "w1", "b1"], ["h1"]), helper.make_node("Tanh", ["h1"], ["a1"]),
             helper.make_node("Gemm", ["a1", "w2", "b2"], ["h2"]), helper.make_node("Tanh", ["h2"], ["a2"]),
             helper.make_node("Gemm", ["a2", "w3", "b3"], ["logits"])]  # fmt: skip
    graph = helper.make_graph(nodes, "mlp", [helper.make_tensor_value_info("obs", TensorProto.FLOAT, [1, 4])],
                              [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, 2])], inits)  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.save(model, str(where / "mlp.onnx"))
    calibration = write_calibration(where / "obs", rng.standard_normal((rows, 4)).astype(np.float32))
    sections = {"common_quant_param": quant_section("full"), **full_quant_sections({"obs": calibration})}
    (where / "int8.cfg").write_text(converter_config("cpu", None, sections))  # what the int8 plan writes
    return where / "mlp.onnx", where / "int8.cfg"


def convert(onnx_path: Path, config: Path, out: Path, cores: int) -> tuple[float, float]:
    """Wall and CPU (user + system) seconds of one conversion."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    subprocess.run([str(CONVERTER), "--onnx", str(onnx_path), "--out", str(out), "--config", str(config)], check=True,
                   capture_output=True, env={**os.environ, "MSRL_LITE_CONVERT_CORES": str(cores)})  # fmt: skip
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--cores", default="1,2", help="core counts reported to Lite (comma-separated)")
    args = parser.parse_args()
    if not CONVERTER.is_file():
        sys.exit(f"error: {CONVERTER} not built (run `make lite`)")
    with tempfile.TemporaryDirectory() as tmp:
        onnx_path, config = write_case(Path(tmp))
        rows = []
        for load in ("idle", "busy"):
            hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"])
                    for _ in range(max(1, (os.cpu_count() or 2) - 1))] if load == "busy" else []  # fmt: skip
            try:
                for cores in (int(c) for c in args.cores.split(",")):
                    runs = [convert(onnx_path, config, Path(tmp) / f"{load}-{cores}.ms", cores)
                            for _ in range(args.repeats)]  # fmt: skip
                    walls, cpus = zip(*runs, strict=True)
                    rows.append((load, cores, float(np.median(walls)), float(np.median(cpus))))
            finally:
                for hog in hogs:
                    hog.kill()
                    hog.wait()
        outputs = {p.read_bytes() for p in Path(tmp).glob("*.ms")}
    base = rows[0][2]
    print(f"| machine | cores told to Lite | wall (median of {args.repeats}) | CPU | wall / baseline |")
    print("|---|---|---|---|---|")
    for load, cores, wall, cpu in rows:
        print(f"| {load} | {cores} | {wall:.3f} s | {cpu:.3f} s | {wall / base:.1f} |")
    print(f"\nevery .ms byte-identical: {len(outputs) == 1}")


if __name__ == "__main__":
    main()
