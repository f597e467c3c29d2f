"""Per-runtime inference latency on one bundle: single-observation p50/p99 and batch-256 throughput.

ONNX Runtime (in-process) is the baseline measured in the same run; ratios are what to compare across
machines. Two tables: the verify runtimes in this (MindSpore) process, where Lite runs in the runner process; and
the deploy side, measured in a child process without MindSpore: ONNX Runtime's session, Lite in that process
(``LiteModel.infer``, ``infer_into`` without an output copy, and ``infer_into`` with the graph left on Lite's actor
thread, ``MSRL_LITE_INLINE=0``) and Lite through the runner process, called as a control loop calls them.
Usage: ``python bench/inference_latency.py [--bundle DIR] [--ckpt RUN/checkpoint.ckpt]``
(default: trains and exports a small CartPole-v1 policy into reports/bench/).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

import msrl_consistency.runtimes  # noqa: F401 - registers the MindSpore runtimes (ms-cell, ms-graph, ms-mindir)
from inference.bundle import Bundle, load_bundle
from inference.compare.feeds import seeded_feeds
from inference.runtimes.base import RuntimeSource
from inference.runtimes.registry import create
from msrl_consistency.artifacts.cells import TrainerCells

BASELINE = "onnxruntime"
RUNTIMES = ["onnxruntime", "lite", "ms-mindir", "ms-graph", "ms-cell"]


def prepare(out: Path) -> tuple[Path, Path]:
    run, bundle = out / "run-cartpole", out / "bundle-cartpole"
    if not (bundle / "manifest.json").exists():
        py = sys.executable
        subprocess.run([py, "-m", "msrl_consistency.train", "--total-steps", "4096", "--run-dir", str(run),
                        "--progress", "false", "--eval-episodes", "0"], check=True)  # fmt: skip
        subprocess.run([py, "-m", "msrl_consistency.export", "--ckpt", str(run / "checkpoint.ckpt"), "--out",
                        str(bundle), "--force"], check=True)  # fmt: skip
    return bundle, run / "checkpoint.ckpt"


def single_step_latency(infer: Callable[[np.ndarray], object], obs: np.ndarray, calls: int) -> tuple[float, float]:
    """p50 and p99 in µs of ``infer`` on one observation at a time."""
    lat = np.empty(calls)
    for i in range(calls):
        row = obs[i % len(obs) : i % len(obs) + 1]
        t = time.perf_counter()
        infer(row)
        lat[i] = time.perf_counter() - t
    return float(np.percentile(lat, 50) * 1e6), float(np.percentile(lat, 99) * 1e6)


def measure(name: str, source: RuntimeSource, obs: np.ndarray, single_calls: int, batch_calls: int) -> dict:
    with create(name, source, "policy") as rt:
        for i in range(20):  # warm-up (and graph compilation)
            rt.infer(obs[i : i + 1])
            rt.infer(obs[:256])
        p50, p99 = single_step_latency(rt.infer, obs, single_calls)
        t = time.perf_counter()
        for _ in range(batch_calls):
            rt.infer(obs[:256])
        batch_rate = 256 * batch_calls / (time.perf_counter() - t)
    return {"p50_us": p50, "p99_us": p99, "batch_obs_s": batch_rate}


def measure_raw_lite(bundle: Bundle, obs: np.ndarray, calls: int) -> dict:
    """The runner's own round trip through ``LiteRunner.infer``, without the runtime wrapper's feed checks."""
    from inference.lite_client import LiteRunner

    with LiteRunner(bundle.file("policy", "ms")) as runner:
        for i in range(50):
            runner.infer(obs[i : i + 1])
        p50, p99 = single_step_latency(runner.infer, obs, calls)
        ping = np.median([runner.ping() for _ in range(500)])
    return {"p50_us": p50, "p99_us": p99, "ping_us": ping * 1e6}


DEPLOY_SIDE = """
import json, os, sys, time
sys.modules["mindspore"] = None  # the deploy side: Lite may run in this process
import numpy as np
import onnxruntime as ort
from inference.lite_client import LiteRunner
from inference.lite_inprocess import LiteModel
onnx_path, ms_path, obs_path, calls = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
obs = np.load(obs_path)
options = ort.SessionOptions()
options.intra_op_num_threads = 1
session = ort.InferenceSession(onnx_path, options, providers=["CPUExecutionProvider"])
name = session.get_inputs()[0].name
model, runner = LiteModel(ms_path), LiteRunner(ms_path)
os.environ["MSRL_LITE_INLINE"] = "0"  # this model's graph runs on Lite's own actor thread, as Lite schedules it
handoff = LiteModel(ms_path)
calls_of = {"onnxruntime session": lambda x: session.run(None, {name: x}), "lite in this process": model.infer,
            "lite in this process, infer_into": model.infer_into,
            "lite in this process, infer_into, on Lite's actor thread": handoff.infer_into,
            "lite runner process": runner.infer}
rows = {}
for label, infer in calls_of.items():
    for i in range(200):
        infer(obs[i : i + 1]); infer(obs[:256])
    lat = np.empty(calls)
    for i in range(calls):
        row = obs[i % len(obs) : i % len(obs) + 1]
        t = time.perf_counter(); infer(row); lat[i] = time.perf_counter() - t
    n = max(50, calls // 10)
    t = time.perf_counter()
    for _ in range(n):
        infer(obs[:256])
    rows[label] = {"p50_us": float(np.percentile(lat, 50) * 1e6), "p99_us": float(np.percentile(lat, 99) * 1e6),
                   "batch_obs_s": 256 * n / (time.perf_counter() - t)}
assert model.runs_inline, "the in-process graph did not run on the calling thread"
print(json.dumps(rows))
"""


def deploy_side(bundle: Bundle, obs: np.ndarray, calls: int, out: Path) -> dict:
    """The deploy side's calls, measured in a child process without MindSpore (see the module docstring)."""
    import json

    out.mkdir(parents=True, exist_ok=True)
    np.save(out / "latency_obs.npy", obs)
    args = [str(bundle.file("policy", "onnx")), str(bundle.file("policy", "ms")), str(out / "latency_obs.npy")]
    proc = subprocess.run([sys.executable, "-c", DEPLOY_SIDE, *args, str(calls)], capture_output=True, text=True,
                          check=True)  # fmt: skip
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--bundle", type=Path)
    p.add_argument("--ckpt", type=Path)
    p.add_argument("--calls", type=int, default=3000)
    p.add_argument("--out", type=Path, default=Path("reports/bench"))
    args = p.parse_args()
    bundle_dir, ckpt = (args.bundle, args.ckpt) if args.bundle else prepare(args.out)
    bundle = load_bundle(bundle_dir)
    source = RuntimeSource(bundle, TrainerCells(ckpt, bundle.policy_spec))
    obs = seeded_feeds(bundle, 1024, seed=0).obs
    rows = {}
    for name in RUNTIMES:
        reason = create(name, source, "policy").unavailable_reason(source)
        if reason:
            print(f"{name}: unavailable ({reason})")
            continue
        calls = args.calls if name != "ms-cell" else max(100, args.calls // 20)  # PyNative is slow
        rows[name] = measure(name, source, obs, calls, max(20, calls // 20))
    base = rows[BASELINE]
    print(f"\n{bundle.env_id} deterministic policy ({bundle.policy_spec['hidden_sizes']} MLP), baseline {BASELINE}\n")
    print("| runtime | single p50 (µs) | single p99 (µs) | p50 / baseline | batch-256 obs/s | batch / baseline |")
    print("|---|---:|---:|---:|---:|---:|")
    for name, r in rows.items():
        print(f"| {name} | {r['p50_us']:.1f} | {r['p99_us']:.1f} | {r['p50_us'] / base['p50_us']:.1f}x | "
              f"{r['batch_obs_s']:,.0f} | {r['batch_obs_s'] / base['batch_obs_s']:.2f}x |")  # fmt: skip
    deploy = deploy_side(bundle, obs, args.calls, args.out)
    base = deploy["onnxruntime session"]
    print("\nThe deploy side (a process without MindSpore), called as a control loop calls it; baseline the ONNX "
          "Runtime session\n")
    print("| call | single p50 (µs) | single p99 (µs) | p50 / baseline | p99 / baseline | batch-256 obs/s | "
          "batch / baseline |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for name, r in deploy.items():
        print(f"| {name} | {r['p50_us']:.1f} | {r['p99_us']:.1f} | {r['p50_us'] / base['p50_us']:.2f}x | "
              f"{r['p99_us'] / base['p99_us']:.2f}x | {r['batch_obs_s']:,.0f} | "
              f"{r['batch_obs_s'] / base['batch_obs_s']:.2f}x |")  # fmt: skip
    if "lite" in rows:
        raw = measure_raw_lite(bundle, obs, args.calls)
        target = 50.0
        verdict = "meets" if raw["p50_us"] <= target else "misses"
        print(
            f"\nLite runner round trip (LiteRunner.infer, no wrapper): p50 {raw['p50_us']:.1f} µs, p99 "
            f"{raw['p99_us']:.1f} µs, empty-request ping {raw['ping_us']:.1f} µs: {verdict} the {target:.0f} µs target"
        )


if __name__ == "__main__":
    main()
