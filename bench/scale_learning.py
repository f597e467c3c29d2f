"""Does data parallelism hurt learning? CartPole: 2 workers x 4 envs vs 1 worker x 8 envs, same global batch.

Each run is the real CLI (``python -m msrl_consistency.train``, ``--workers 2`` through msrun), one after another.
The same preset and seeds for every layout; the 2-worker layouts are run with advantages normalised over both
ranks' minibatches (``global``, the default) and over each rank's own (``rank``). A run "reaches the target" when
the moving mean of the last 10 training episodes stays >= 475 from some step <= 30k to the end of the run
(``train_throughput.steps_to_threshold``, the column the README reports for one process).

    .venv/bin/python bench/scale_learning.py --seeds 1,2,3 --steps 50000
    .venv/bin/python bench/scale_learning.py --seeds 4,5,6   # adds to the same table (reports/bench/scale_learning)
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))
from train_throughput import THRESHOLDS, steps_to_threshold  # noqa: E402

from msrl_consistency.artifacts import run_dir as rd  # noqa: E402

LAYOUTS = {
    "1x8": ["--workers", "1", "--num-envs", "8"],
    "2x4 global": ["--workers", "2", "--num-envs", "4", "--adv-norm-scope", "global"],
    "2x4 rank": ["--workers", "2", "--num-envs", "4", "--adv-norm-scope", "rank"],
}
TARGET_STEPS = 30_000


def run(layout: str, seed: int, steps: int, out: Path) -> dict[str, Any]:
    run_dir = out / "runs" / f"{layout.replace(' ', '-')}-s{seed}"
    if run_dir.exists():
        shutil.rmtree(run_dir)
    cmd = [sys.executable, "-m", "msrl_consistency.train", "--env-id", "CartPole-v1", "--seed", str(seed),
           "--total-steps", str(steps), "--eval-episodes", "10", "--progress", "false", "--run-dir", str(run_dir),
           *LAYOUTS[layout]]  # fmt: skip
    start = time.perf_counter()
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"{layout} seed {seed} failed ({proc.returncode}):\n{proc.stderr[-2000:]}")
    episodes, rows = rd.episode_returns(run_dir), rd.read_log(run_dir / rd.METRICS_CSV)
    info = json.loads((run_dir / "run.json").read_text())
    return {
        "layout": layout,
        "seed": seed,
        "steps_to_threshold": steps_to_threshold(episodes, THRESHOLDS["CartPole-v1"]),
        "eval_mean": info["eval"]["mean"],
        "global_step": info["global_step"],
        "sps": float(rows[-1]["sps"]),
        "process_wall": wall,
        "rank_checksums": info["rank_checksums"],
    }


def table(results: list[dict[str, Any]]) -> str:
    lines = [
        "| layout | seeds | reached >= 475 by 30k | median steps to >= 475 | per seed | eval means | SPS (mean) |",
        "|---|---:|---:|---:|---|---|---:|",
    ]
    for layout in LAYOUTS:
        rs = [r for r in results if r["layout"] == layout]
        if not rs:
            continue
        steps = [r["steps_to_threshold"] for r in rs]
        met = sum(s is not None and s <= TARGET_STEPS for s in steps)
        per_seed = ", ".join("-" if s is None else f"{s / 1000:.1f}k" for s in steps)
        med = np.median([np.inf if s is None else s for s in steps])
        evals = ", ".join(f"{r['eval_mean']:.0f}" for r in rs)
        lines.append(
            f"| {layout} | {len(rs)} | {met}/{len(rs)} | {med / 1000:.1f}k | {per_seed} | {evals} "
            f"| {np.mean([r['sps'] for r in rs]):.0f} |"
        )
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", default="1,2,3")
    parser.add_argument("--steps", type=int, default=50_000)
    parser.add_argument("--layouts", default=",".join(LAYOUTS), help=f"comma-separated subset of {list(LAYOUTS)}")
    parser.add_argument("--out", type=Path, default=REPO / "reports/bench/scale_learning")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    store = args.out / "scale_learning.json"
    # Earlier invocations' runs are kept (another seed range adds to the table); a re-run replaces its entry.
    results = json.loads(store.read_text()) if store.exists() else []
    for layout in [s.strip() for s in args.layouts.split(",")]:
        for seed in (int(s) for s in args.seeds.split(",") if s.strip()):  # --seeds "": only print the table
            r = run(layout, seed, args.steps, args.out)
            results = [x for x in results if (x["layout"], x["seed"]) != (layout, seed)] + [r]
            print(f"{layout} seed {seed}: >=475 from {r['steps_to_threshold']}, eval {r['eval_mean']:.1f}, "
                  f"{r['sps']:.0f} SPS", flush=True)  # fmt: skip
            store.write_text(json.dumps(results, indent=1))
    results.sort(key=lambda x: (list(LAYOUTS).index(x["layout"]), x["seed"]))
    text = f"CartPole-v1, {args.steps} steps per run, preset hyperparameters\n\n{table(results)}\n"
    (args.out / "scale_learning.md").write_text(text)
    print("\n" + text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
