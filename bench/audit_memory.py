"""Peak memory and time of ``verify --audit`` as a field recording grows.

The audit streams a recording chunk by chunk (``inference.compare.audit``), so its peak resident memory should stay
that of a plain verify whatever the number of steps. This records CartPole recordings of each size on the deploy
side (a child process without MindSpore, Lite in that process, batch-64 calls on seeded observations, an episode
ending at random about every 100 steps per row, chunks of 16,384 steps), audits each in a process of its own and
reads that process's peak resident set (``wait4``'s ``ru_maxrss``) and wall time. The baseline, measured in the same
run: ``verify`` of the same bundle on 10,000 seeded observations against the compiled Cell (``--runtimes ms-graph
--episodes 1``), the smallest verify a training box runs.

    python bench/audit_memory.py [--bundle DIR --ckpt RUN/checkpoint.ckpt] [--steps 10000,100000,1000000]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from inference_latency import prepare

from inference.machine.facts import measured_here

DEVICE = """
import sys
sys.modules["mindspore"] = None
import numpy as np
import inference
bundle, out, steps = sys.argv[1], sys.argv[2], int(sys.argv[3])
rng = np.random.default_rng(0)
policy = inference.load(bundle, record=out)
for _ in range(-(-steps // 64)):
    policy.act((rng.standard_normal((64, 4)) * 0.3).astype(np.float32))
    policy.observe(np.ones(64), rng.random(64) < 0.01)
policy.close()
"""


def measured(args: list[str]) -> tuple[float, float, int]:
    """Wall seconds, peak RSS in MB and exit code of one process."""
    start = time.perf_counter()
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    proc.returncode = os.waitstatus_to_exitcode(status)
    err = proc.stderr.read() if proc.stderr else ""
    if proc.returncode not in (0, 1):
        sys.exit(f"{' '.join(args)} exited {proc.returncode}:\n{err[-2000:]}")
    return wall, usage.ru_maxrss / 1024, proc.returncode


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--bundle", type=Path)
    p.add_argument("--ckpt", type=Path)
    p.add_argument("--steps", default="10000,100000,1000000", help="comma-separated recording sizes")
    p.add_argument("--out", type=Path, default=Path("reports/bench/audit_memory"))
    args = p.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    bundle, ckpt = (args.bundle, args.ckpt) if args.bundle else prepare(args.out)
    py = sys.executable
    verify = [py, "-m", "msrl_consistency.verify", "--bundle", str(bundle), "--ckpt", str(ckpt), "--quiet"]
    print(measured_here(f"python bench/audit_memory.py {' '.join(sys.argv[1:])}") + "\n")
    shutil.rmtree(args.out / "r-base", ignore_errors=True)
    base_wall, base_rss, _ = measured([*verify, "--runtimes", "ms-graph", "--observations", "10000", "--episodes", "1",
                                       "--out", str(args.out / "r-base")])  # fmt: skip
    print("| run | steps | recording (MB) | wall s | µs per step | peak RSS (MB) | peak RSS / baseline | exit |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    print(f"| baseline: verify, 10,000 seeded observations, ms-graph | – | – | {base_wall:.1f} | – | {base_rss:.0f} | "
          "1.00x | 0 |", flush=True)  # fmt: skip
    for steps in (int(s) for s in args.steps.split(",")):
        rec, report = args.out / f"rec-{steps}", args.out / f"r-{steps}"
        for path in (rec, report):
            shutil.rmtree(path, ignore_errors=True)
        subprocess.run([py, "-c", DEVICE, str(bundle), str(rec), str(steps)], check=True, capture_output=True)
        size = sum(f.stat().st_size for f in rec.glob("chunk-*.npz")) / 2**20
        wall, rss, code = measured([*verify, "--audit", str(rec), "--out", str(report)])
        audited = json.loads((report / "audit.json").read_text())["steps"]
        print(f"| verify --audit | {audited:,} | {size:.0f} | {wall:.1f} | {wall / audited * 1e6:.1f} | {rss:.0f} | "
              f"{rss / base_rss:.2f}x | {code} |", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
