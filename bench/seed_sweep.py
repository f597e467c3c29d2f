"""A seed sweep in one process: what taking over a finished run's compiled graphs saves per run.

``train_policy`` runs one after another in one process (a notebook's sweep, a test suite) with a config that
differs only in host-side fields (the seed here) reuse the finished run's compiled Cells
(``training/learner.py``). The baseline is the same sweep with the finished runs' Cells dropped after each run,
as every run compiled before. Rows alternate baseline and reuse per seed; both modes run in the same process, and
the first run of each mode compiles either way. Each pair must end with bitwise-equal weights.

    .venv/bin/python bench/seed_sweep.py --env-id CartPole-v1 --seeds 5 --total-steps 2048
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import io
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from inference.machine.facts import cpu_summary  # noqa: E402
from msrl_consistency.config import TrainConfig, parse_config  # noqa: E402


def one_run(cfg: TrainConfig, run_dir: Path) -> tuple[float, float, str, dict[str, np.ndarray]]:
    """(wall seconds, compile seconds, compile_cache state, final weights) of one in-process run."""
    from msrl_consistency import train_policy
    from msrl_consistency.artifacts import run_dir as rd
    from msrl_consistency.artifacts.checkpoint import read_checkpoint

    start = time.perf_counter()
    with contextlib.redirect_stdout(io.StringIO()):  # the run's profile table
        train_policy(dataclasses.replace(cfg, run_dir=str(run_dir)))
    wall = time.perf_counter() - start
    profile = json.loads((run_dir / "profile.json").read_text())
    state = rd.read_run_json(run_dir)["compile_cache"]["state"]
    weights = {k: v.asnumpy() for k, v in read_checkpoint(run_dir / rd.CHECKPOINT).items()}
    return wall, profile["sections"]["compile"]["seconds"], state, weights


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--env-id", default="CartPole-v1")
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--total-steps", type=int, default=2048)
    args = parser.parse_args(argv)

    from msrl_consistency import compat
    from msrl_consistency.training import learner

    compat.set_device("cpu")
    base = parse_config(
        [
            "--env-id",
            args.env_id,
            "--total-steps",
            str(args.total_steps),
            "--progress",
            "false",
            "--eval-episodes",
            "0",
            "--compile-cache",
            "false",
            "--profile",
            "true",
        ]
    )  # the env's preset
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for seed in range(1, args.seeds + 1):
            cfg = dataclasses.replace(base, seed=seed)
            with learner.kept_runs_set_aside():  # the baseline compiles, whatever the sweep's earlier runs left
                fresh = one_run(cfg, Path(tmp) / f"fresh-{seed}")
            reused = one_run(cfg, Path(tmp) / f"reused-{seed}")
            same = all(np.array_equal(fresh[3][k], reused[3][k]) for k in fresh[3])
            rows.append((seed, *fresh[:3], *reused[:3], same))

    command = f"python bench/seed_sweep.py --env-id {args.env_id} --seeds {args.seeds} --total-steps {args.total_steps}"
    print(f"{time.strftime('%Y-%m-%d')}, {cpu_summary()}, `{command}`")
    print("(one process, the env's preset, compile cache off)\n")
    print(
        "| seed | compile, compiled (s) | compile, reused (s) | run wall, compiled (s) | run wall, reused (s) "
        "| wall reused / compiled | reused run's graphs | weights bitwise equal |"
    )
    print("|---:|---:|---:|---:|---:|---:|---|---|")
    for seed, f_wall, f_comp, _, r_wall, r_comp, r_state, same in rows:
        print(
            f"| {seed} | {f_comp:.2f} | {r_comp:.2f} | {f_wall:.2f} | {r_wall:.2f} | {r_wall / f_wall:.2f}x "
            f"| {r_state} | {'yes' if same else 'NO'} |"
        )
    return 0 if all(row[-1] for row in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
