"""What ONNX Runtime's fp32 tolerance needs: its error against the compiled Cell, per row, on real policies.

For each policy (our trainer's presets after a short training run, and a small CNN on float32 frames), the bundle
is exported and its ONNX graph runs on ONNX Runtime next to ``ms-graph`` (the Cell compiled: bitwise the
reference) on verify's synthetic feeds (around the normalisation statistics, within the bounds, and the edge
rows at ±1e4). Per output, the table gives over the ordinary rows the largest |Δ|, the largest magnitude among
those rows and their ratio; over the edge rows the largest |Δ| relative to the magnitude the rule gives them
(their own, never less than the ordinary rows'); and the atol that each group needs on top of the shipped
relative term (``scale`` x that magnitude, ``stats.Tolerance.row_atol``).
Same-run baseline: MindSpore Lite's error on the same graphs (``lite`` column, when the runner is built).

    python bench/ort_tolerance.py [--steps 8192] [--envs CartPole-v1,Pendulum-v1,BipedalWalker-v3]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

OBSERVATIONS = 10_000


def train(env_id: str, steps: int, out: Path) -> Path:
    run = out / env_id
    if not (run / "checkpoint.ckpt").exists():
        subprocess.run([sys.executable, "-m", "msrl_consistency.train", "--env-id", env_id, "--total-steps", str(steps),
                        "--run-dir", str(run), "--progress", "false", "--eval-episodes", "0"], check=True)  # fmt: skip
    return run / "checkpoint.ckpt"


def cnn_bundle(out: Path):
    """A small CNN on float32 (8, 8, 3) frames, seeded untrained weights, exported as a team would."""
    import mindspore as ms
    from mindspore import nn, ops

    from msrl_consistency.api import export_policy

    class FrameCNN(nn.Cell):
        def __init__(self) -> None:
            super().__init__()
            self.conv1 = nn.Conv2d(3, 16, 3, pad_mode="valid", has_bias=True)
            self.conv2 = nn.Conv2d(16, 16, 3, stride=2, pad_mode="valid", has_bias=True)
            self.fc = nn.Dense(16 * 2 * 2, 6)

        def construct(self, obs):
            x = ops.relu(self.conv1(ops.transpose(obs, (0, 3, 1, 2)) / 255.0))
            x = ops.relu(self.conv2(x))
            return self.fc(x.reshape(x.shape[0], -1))

    ms.set_seed(0)
    contract = {"input": {"obs": [8, 8, 3]}, "outputs": {"names": ["logits"]},
                "action": {"kind": "categorical", "logits": "logits"}}  # fmt: skip
    cell = FrameCNN()
    return export_policy(cell, contract, out / "cnn", force=True), cell


def errors(bundle, runtime: str, graph: str, feeds) -> dict[str, np.ndarray] | None:
    from inference.runtimes.base import RuntimeSource
    from inference.runtimes.registry import RUNTIMES, create

    source = RuntimeSource(bundle, None)
    if RUNTIMES[runtime].why_not(source):
        return None
    inputs = feeds.graph_inputs(bundle, graph)
    with create(runtime, source, graph) as rt:
        return rt.infer(*inputs)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--envs", default="CartPole-v1,Pendulum-v1,BipedalWalker-v3")
    p.add_argument("--steps", type=int, default=8192, help="training steps per preset")
    p.add_argument("--runs", type=Path, nargs="*", default=[], help="trained run directories to measure as well")
    p.add_argument("--out", type=Path, default=Path("reports/bench/ort_tolerance"))
    args = p.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    from inference.compare.feeds import seeded_feeds
    from inference.compare.judge.stats import RUNTIME_OVERRIDES
    from msrl_consistency import compat
    from msrl_consistency.api import export_run
    from msrl_consistency.artifacts.bundle import ExportOptions
    from msrl_consistency.artifacts.cells import TrainerCells

    compat.set_device("cpu")
    scale = RUNTIME_OVERRIDES["onnxruntime"]["fp32"].scale
    cases = []
    for env_id in [e for e in args.envs.split(",") if e]:
        ckpt = train(env_id, args.steps, args.out / "runs")
        bundle = export_run(ckpt, Path(tempfile.mkdtemp(dir=args.out)) / env_id, ExportOptions(), force=True)
        cases.append((f"{env_id} (trained {args.steps} steps)", bundle, TrainerCells(ckpt, bundle.policy_spec)))
    for run in args.runs:
        ckpt = run / "checkpoint.ckpt"
        bundle = export_run(ckpt, Path(tempfile.mkdtemp(dir=args.out)) / run.name, ExportOptions(), force=True)
        steps = bundle.manifest["source"]["global_step"]
        cases.append((f"{bundle.env_id} {run.name} ({steps} steps)", bundle, TrainerCells(ckpt, bundle.policy_spec)))
    cnn, cell = cnn_bundle(Path(tempfile.mkdtemp(dir=args.out)))
    cases.append(("CNN 8x8x3 frames (seeded)", cnn, lambda _graph: cell))
    print(f"| policy | graph.output | ordinary max abs Δ | ordinary max abs ref | ratio | edge max Δ / magnitude | "
          f"atol needed at scale {scale:g}: ordinary, edge | lite max abs Δ (ordinary) |")  # fmt: skip
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    for label, bundle, cells in cases:
        from inference.runtimes.base import RuntimeSource
        from inference.runtimes.registry import create

        feeds = seeded_feeds(bundle, OBSERVATIONS, 0)
        ordinary = feeds.ordinary & feeds.finite
        edge = (feeds.source == "edge") & feeds.finite
        source = RuntimeSource(bundle, cells)
        for graph in bundle.graphs:
            with create("ms-graph", source, graph) as rt:
                ref = rt.infer(*feeds.graph_inputs(bundle, graph))
            ort, lite = errors(bundle, "onnxruntime", graph, feeds), errors(bundle, "lite", graph, feeds)
            for name, r in ref.items():
                if r.dtype.kind != "f" or r.shape[:1] != feeds.finite.shape:
                    continue
                diff = np.abs(ort[name].astype(np.float64) - r).reshape(len(r), -1).max(1)
                own = np.abs(r.astype(np.float64)).reshape(len(r), -1).max(1)
                top = own[ordinary].max()
                magnitude = np.maximum(own, top)  # the rule: edge rows their own, never less than ordinary rows'
                needed = max(0.0, float((diff[ordinary] - scale * top).max()))
                edge_needed = max(0.0, float((diff[edge] - scale * magnitude[edge]).max())) if edge.any() else 0.0
                edge_ratio = float((diff[edge] / magnitude[edge]).max()) if edge.any() else 0.0
                lite_d = "–" if lite is None else f"{np.abs(lite[name] - r)[ordinary].max():.1e}"
                print(
                    f"| {label} | {graph}.{name} | {diff[ordinary].max():.1e} | {top:.3g} | "
                    f"{diff[ordinary].max() / top:.1e} | {edge_ratio:.1e} | {needed:.1e}, {edge_needed:.1e} | "
                    f"{lite_d} |",
                    flush=True,
                )


if __name__ == "__main__":
    main()
