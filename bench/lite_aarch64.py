"""Lite's ARM kernels (``lite-aarch64``: the aarch64 runner under qemu-user) next to its x86 kernels (``lite``).

Policies: the trainer's presets after a short training run (as the gate trains them) and a small CNN on float32
frames (seeded weights, ``tests/foreign_policies.py``). Two tables:

* accuracy: per graph output, the largest |difference| from the Cell (``ms-graph``, bitwise the reference) over
  verify's 10,000 seeded feeds (ordinary rows: no edge or NaN rows), through x86 Lite and through aarch64 Lite, and
  how many rows the two Lites answer with the same bits;
* verify: wall time of a full verify (10k observations, 20 episodes per mode) with ``--runtimes lite`` (the
  baseline, same run) and with ``--runtimes lite-aarch64``, each required, on the genuine bundle and on one whose
  second hidden layer was scaled by 1.5 (the CNN: its second convolution moved by 0.5): exit codes, and the layer each
  names; and lite-aarch64 once more with every runner a plain start (``MSRL_LITE_FORK_SERVER=0``), the baseline of
  the runners forked from a fork server (``inference.lite.forks``). Each verify starts its own fork server, as a
  verify command does.

    python bench/lite_aarch64.py [--steps 8192] [--envs CartPole-v1,Pendulum-v1] [--arm-cpu neoverse-n1]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))
sys.path.insert(0, str(BENCH.parent / "tests"))
from foreign_policies import FRAME_CONTRACT, make_frame_cnn, nudge  # noqa: E402 - the CNN the localisation tests use
from ort_tolerance import train  # noqa: E402 - the presets trained as the ONNX Runtime table trains them

import msrl_consistency.runtimes  # noqa: E402,F401 - registers ms-graph

OBSERVATIONS = 10_000
RUNTIMES = ("lite", "lite-aarch64")


def outputs(bundle, cells, runtime: str, graph: str, feeds) -> dict[str, np.ndarray]:
    from inference.runtimes.base import RuntimeSource
    from inference.runtimes.registry import RUNTIMES as ALL
    from inference.runtimes.registry import create

    source = RuntimeSource(bundle, cells)
    why = ALL[runtime].why_not(source)
    if why:
        sys.exit(f"{runtime} is unavailable: {why}")
    with create(runtime, source, graph) as rt:
        return rt.infer(*feeds.graph_inputs(bundle, graph))


def accuracy_rows(label: str, bundle, cells) -> list[str]:
    from inference.compare.feeds import seeded_feeds

    feeds = seeded_feeds(bundle, OBSERVATIONS, 0)
    ordinary = feeds.ordinary & feeds.finite
    rows = []
    for graph in bundle.graphs:
        ref = outputs(bundle, cells, "ms-graph", graph, feeds)
        x86, arm = (outputs(bundle, cells, name, graph, feeds) for name in RUNTIMES)
        for name, r in ref.items():
            if r.dtype.kind != "f" or r.shape[:1] != feeds.finite.shape:
                continue
            a, b = x86[name][ordinary], arm[name][ordinary]
            same = np.array([x.tobytes() == y.tobytes() for x, y in zip(a, b, strict=True)])
            err = [float(np.abs(v.astype(np.float64) - r[ordinary]).max()) for v in (a, b)]
            rows.append(
                f"| {label} | {graph}.{name} | {err[0]:.2e} | {err[1]:.2e} | {int(same.sum())} / {len(same)} | "
                f"{'yes' if same.all() else 'no'} | {float(np.abs(a.astype(np.float64) - b).max()):.2e} |"
            )
    return rows


def timed_verify(run, runtime: str, fork_server: bool = True) -> tuple[float, int, str]:
    """(seconds, exit code, first diverging layer) of ``run()``'s verify with ``runtime`` required; the Lite runners
    forked from a fork server this verify starts, or (``fork_server=False``) each started as a plain process."""
    from inference.compare.verifier import VerifyOptions
    from inference.lite import forks

    forks.close_all()
    os.environ["MSRL_LITE_FORK_SERVER"] = "1" if fork_server else "0"
    start = time.perf_counter()
    result = run(VerifyOptions(observations=OBSERVATIONS, episodes=20, runtimes=(runtime,), required=(runtime,)))
    loc = result.localizations.get(runtime)
    return time.perf_counter() - start, result.exit_code, (loc.first or "-") if loc else "-"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--envs", default="CartPole-v1,Pendulum-v1")
    p.add_argument("--steps", type=int, default=8192, help="training steps per preset (the gate's)")
    p.add_argument("--arm-cpu", default=None, help="the CPU model lite-aarch64 emulates (default: its default)")
    p.add_argument("--out", type=Path, default=Path("reports/bench/lite_aarch64"))
    args = p.parse_args()
    if args.arm_cpu:
        os.environ["MSRL_ARM_CPU"] = args.arm_cpu
    args.out.mkdir(parents=True, exist_ok=True)
    from inference.doctor import cpu_summary
    from inference.lite.emulation import describe
    from msrl_consistency import compat
    from msrl_consistency.api import export_policy, export_run, verify_policy, verify_run
    from msrl_consistency.artifacts.bundle import ExportOptions
    from msrl_consistency.artifacts.cells import TrainerCells

    compat.set_device("cpu")
    print(f"{cpu_summary()}; lite-aarch64: {describe()}\n", flush=True)
    cases = []
    for env_id in [e for e in args.envs.split(",") if e]:
        ckpt = train(env_id, args.steps, args.out / "runs")
        bundle = export_run(ckpt, Path(tempfile.mkdtemp(dir=args.out)) / env_id, ExportOptions(), force=True)
        cells = TrainerCells(ckpt, bundle.policy_spec)
        nudged = scaled(ckpt, args.out)
        cases.append((f"{env_id} ({args.steps} steps)", bundle, cells,
                      lambda o, b=bundle, c=ckpt: verify_run(b, c, o),
                      lambda o, b=nudged, c=ckpt: verify_run(b, c, o)))  # fmt: skip
    work = Path(tempfile.mkdtemp(dir=args.out))
    cnn = export_policy(make_frame_cnn(), FRAME_CONTRACT, work / "cnn")
    bad = export_policy(nudge(make_frame_cnn(), "conv2.weight", 0.5), FRAME_CONTRACT, work / "cnn-nudged")
    cell = make_frame_cnn()  # the reference: the seeded Cell both were exported from, the second with a change
    frames = np.random.default_rng(0).integers(0, 256, (OBSERVATIONS, 8, 8, 3)).astype(np.float32)
    cases.append(("CNN 8x8x3 frames (seeded)", cnn, lambda _graph: cell,
                  lambda o: verify_policy(cell, None, cnn.root, observations=frames, options=o),
                  lambda o: verify_policy(cell, None, bad.root, observations=frames, options=o)))  # fmt: skip
    print("| policy | graph.output | x86 Lite max abs Δ vs Cell | aarch64 Lite max abs Δ vs Cell | rows bitwise equal "
          "x86 / ARM | all bitwise | max abs Δ x86 vs ARM |")  # fmt: skip
    print("|---|---|---:|---:|---:|---|---:|")
    for label, bundle, cells, _genuine, _nudged in cases:
        print("\n".join(accuracy_rows(label, bundle, cells)), flush=True)
    print(
        "\n| policy | bundle | lite: s, exit, layer | lite-aarch64: s, exit, layer | aarch64 / x86 time "
        "| lite-aarch64, plain starts: s, exit, layer | forked / plain starts time |"
    )
    print("|---|---|---|---|---:|---|---:|")
    for label, _bundle, _cells, genuine, nudged in cases:
        for kind, run in (("genuine", genuine), ("layer changed", nudged)):
            x86, arm = (timed_verify(run, name) for name in RUNTIMES)
            plain = timed_verify(run, "lite-aarch64", fork_server=False)
            print(
                f"| {label} | {kind} | {x86[0]:.1f}, {x86[1]}, {x86[2]} | {arm[0]:.1f}, {arm[1]}, {arm[2]} | "
                f"{arm[0] / x86[0]:.1f}x | {plain[0]:.1f}, {plain[1]}, {plain[2]} | {arm[0] / plain[0]:.2f}x |",
                flush=True,
            )


def scaled(ckpt: Path, out: Path):
    """The checkpoint's policy with its actor's second hidden layer scaled by 1.5, exported: a changed layer."""
    from msrl_consistency.agent import PolicySpec
    from msrl_consistency.api import export_run
    from msrl_consistency.artifacts import run_dir as rd
    from msrl_consistency.artifacts.bundle import ExportOptions
    from msrl_consistency.artifacts.checkpoint import load_policy

    policy = load_policy(ckpt, PolicySpec.from_dict(rd.read_run_json(ckpt.parent)["policy_spec"]))
    weight = policy.actor.layers[2].weight
    weight.set_data(type(weight.value())(weight.asnumpy() * 1.5))
    return export_run(ckpt, Path(tempfile.mkdtemp(dir=out)) / "nudged", ExportOptions(), policy=policy, force=True)


if __name__ == "__main__":
    main()
