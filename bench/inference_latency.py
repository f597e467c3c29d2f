"""Per-runtime inference latency on one bundle: single-observation p50/p99 and batch-256 throughput.

ONNX Runtime (in-process) is the baseline measured in the same run; ratios are what to compare across
machines. Two tables: the verify runtimes in this (MindSpore) process, where Lite runs in the runner process; and
the deploy side, measured in child processes without MindSpore: ONNX Runtime's session, Lite in that process
(``LiteModel.infer``, ``infer_into`` without an output copy) and Lite through the runner process, called as a control
loop calls them; and ``infer_into`` in a process started with ``MSRL_LITE_INLINE=0``, the graph on Lite's actor
thread as such a process runs it (that thread pinned to the caller's CPU), against that process's own ONNX Runtime.
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
    from inference.lite.client import LiteRunner

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
from inference.lite.client import LiteRunner
from inference.lite.inprocess import LiteModel
onnx_path, ms_path, obs_path, calls, handoff = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5]
obs = np.load(obs_path)
options = ort.SessionOptions()
options.intra_op_num_threads = 1
session = ort.InferenceSession(onnx_path, options, providers=["CPUExecutionProvider"])
name = session.get_inputs()[0].name
model = LiteModel(ms_path)
calls_of = {"onnxruntime session": lambda x: session.run(None, {name: x})}
if handoff == "1":  # a process started with MSRL_LITE_INLINE=0: the graph on Lite's actor thread, as Lite runs it
    calls_of["lite in this process, infer_into"] = model.infer_into
else:
    runner = LiteRunner(ms_path)
    import inference
    policy = inference.load(os.path.dirname(onnx_path))
    calls_of.update({"lite in this process": model.infer, "lite in this process, infer_into": model.infer_into,
                     "inference.load(bundle).act": policy.act, "lite runner process": runner.infer})
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
actors = [t for t in os.listdir("/proc/self/task") if open(f"/proc/self/task/{t}/comm").read().startswith("Actor")]
print(json.dumps({"rows": rows, "pid": os.getpid(), "MSRL_LITE_INLINE": os.environ.get("MSRL_LITE_INLINE"),
                  "runs_inline": model.runs_inline,
                  "actor_cpus": [sorted(os.sched_getaffinity(int(t))) for t in actors]}))
"""
HANDOFF = "MSRL_LITE_INLINE=0 process"


def deploy_side(bundle: Bundle, obs: np.ndarray, calls: int, out: Path) -> dict:
    """The deploy side's calls, measured in child processes without MindSpore (see the module docstring): one as
    this build runs by default, and one started with ``MSRL_LITE_INLINE=0`` (Lite's hand-off, its actor thread pinned
    to the caller's CPU as in any such process), each with its own ONNX Runtime baseline."""
    import json
    import os

    out.mkdir(parents=True, exist_ok=True)
    np.save(out / "latency_obs.npy", obs)
    args = [str(bundle.file("policy", "onnx")), str(bundle.file("policy", "ms")), str(out / "latency_obs.npy")]
    result = {}
    for handoff in (False, True):
        env = {k: v for k, v in os.environ.items() if k != "MSRL_LITE_INLINE"}
        if handoff:
            env["MSRL_LITE_INLINE"] = "0"
        proc = subprocess.run([sys.executable, "-c", DEPLOY_SIDE, *args, str(calls), str(int(handoff))],
                              capture_output=True, text=True, check=True, env=env)  # fmt: skip
        result[HANDOFF if handoff else "default"] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


def deploy_table(deploy: dict) -> list[str]:
    """The deploy side's rows, each against the ONNX Runtime session of its own process."""
    lines = ["| process | call | single p50 (µs) | single p99 (µs) | p50 / ORT | p99 / ORT | batch-256 obs/s | "
             "batch / ORT |", "|---|---|---:|---:|---:|---:|---:|---:|"]  # fmt: skip
    for process, child in deploy.items():
        base = child["rows"]["onnxruntime session"]
        for name, r in child["rows"].items():
            lines.append(f"| {process} | {name} | {r['p50_us']:.1f} | {r['p99_us']:.1f} | "
                         f"{r['p50_us'] / base['p50_us']:.2f}x | {r['p99_us'] / base['p99_us']:.2f}x | "
                         f"{r['batch_obs_s']:,.0f} | {r['batch_obs_s'] / base['batch_obs_s']:.2f}x |")  # fmt: skip
    return lines


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
    inline = {process: child["runs_inline"] for process, child in deploy.items()}
    print(
        "\nThe deploy side (processes without MindSpore), called as a control loop calls it; baseline the ONNX "
        f"Runtime session of the same process; graph on the calling thread: {inline}\n"
    )
    print("\n".join(deploy_table(deploy)))
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
