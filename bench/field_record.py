"""What recording costs on the device, and what auditing costs on the training box.

Recorder: ``policy.act`` on a CartPole bundle through Lite in the calling process (a child process without
MindSpore, as on a device), without and with ``record=`` (chunks of 16,384 steps written by the recorder's thread),
at batch 1 and 64; the baseline is the same call without recording, measured in the same run. Audit: ``verify
--audit`` on a recording of 100,000 steps (batch-64 calls on seeded observations), against a reference-only verify
of 10,000 observations (``--runtimes ms-graph``) measured in the same run.

    python bench/field_record.py [--bundle DIR --ckpt RUN/checkpoint.ckpt]
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

from inference_latency import prepare

DEVICE = """
import json, sys, tempfile, time
sys.modules["mindspore"] = None
import numpy as np
import inference
bundle, out, calls, batch = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
obs = np.random.default_rng(0).standard_normal((batch, 4)).astype(np.float32)
rows = {}
for label, record in (("plain", None), ("recorded", out)):
    policy = inference.load(bundle, record=record)
    for _ in range(500):
        policy.act(obs)
    lat = np.empty(calls)
    for i in range(calls):
        t = time.perf_counter(); policy.act(obs); lat[i] = time.perf_counter() - t
    start = time.perf_counter(); policy.close(); closing = time.perf_counter() - start
    rows[label] = {"p50_us": float(np.percentile(lat, 50) * 1e6), "p99_us": float(np.percentile(lat, 99) * 1e6),
                   "mean_us": float(lat.mean() * 1e6), "close_s": closing}
print(json.dumps(rows))
"""


def device_costs(bundle: Path, out: Path, calls: int, batch: int) -> dict:
    shutil.rmtree(out, ignore_errors=True)
    proc = subprocess.run([sys.executable, "-c", DEVICE, str(bundle), str(out), str(calls), str(batch)],
                          capture_output=True, text=True, check=True)  # fmt: skip
    return json.loads(proc.stdout.strip().splitlines()[-1])


def timed_verify(args: list[str]) -> float:
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "msrl_consistency.verify", *args, "--quiet"], capture_output=True,
                          text=True)  # fmt: skip
    if proc.returncode not in (0, 1):
        sys.exit(f"verify {' '.join(args)} failed:\n{proc.stderr[-2000:]}")
    return time.perf_counter() - start


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--bundle", type=Path)
    p.add_argument("--ckpt", type=Path)
    p.add_argument("--calls", type=int, default=20000)
    p.add_argument("--out", type=Path, default=Path("reports/bench/field_record"))
    args = p.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    bundle, ckpt = (args.bundle, args.ckpt) if args.bundle else prepare(args.out)
    print(
        "| batch | act p50, plain (µs) | act p50, recorded (µs) | added per call (µs) | added per step (µs) | "
        "p99 plain / recorded (µs) | close (flush) s |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for batch in (1, 64):
        r = device_costs(bundle, args.out / f"rec-{batch}", args.calls, batch)
        plain, rec = r["plain"], r["recorded"]
        added = rec["mean_us"] - plain["mean_us"]
        print(f"| {batch} | {plain['p50_us']:.1f} | {rec['p50_us']:.1f} | {added:.1f} | {added / batch:.2f} | "
              f"{plain['p99_us']:.1f} / {rec['p99_us']:.1f} | {rec['close_s']:.3f} |", flush=True)  # fmt: skip
    steps = 100_000
    big = args.out / "rec-audit"
    device_costs(bundle, big, steps // 64, 64)  # ~100k recorded steps (and the warm-up's)
    common = ["--bundle", str(bundle), "--ckpt", str(ckpt)]
    for old in ("r-base", "r-audit"):
        shutil.rmtree(args.out / old, ignore_errors=True)
    base = timed_verify([*common, "--runtimes", "ms-graph", "--observations", "10000", "--episodes", "1", "--out",
                         str(args.out / "r-base")])  # fmt: skip
    audit = timed_verify([*common, "--audit", str(big), "--out", str(args.out / "r-audit")])
    steps = json.loads((args.out / "r-audit" / "audit.json").read_text())["steps"]
    print("\n| audit | steps | wall s | reference-only verify (10k observations) s | ratio |")
    print("|---|---:|---:|---:|---:|")
    print(f"| verify --audit | {steps:,} | {audit:.1f} | {base:.1f} | {audit / base:.2f}x |")


if __name__ == "__main__":
    main()
