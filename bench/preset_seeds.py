"""Judge a preset (or a candidate: the preset plus overrides) on many seeds, not three.

Each run is the real CLI (``python -m msrl_consistency.train``) with periodic deterministic evaluations; ``--jobs``
runs go side by side (this measures learning, not speed: SPS here is only indicative). When the wall-seconds column
decides, use ``--jobs 1``: two runs sharing 2 cores penalise the candidates that make more act calls (CartPole's
16 x 16: a median 11.8 s to target side by side, 9.0 s alone). Every run compiles its graphs (``--compile-cache
false``), so the wall column compares with the rows measured before the compile cache. Per candidate it reports how
many seeds reached the env's target and when: CartPole's training mean of 10 episodes staying >= 475
(``train_throughput.steps_to_threshold``), or the first periodic evaluation (5 episodes) at or above the threshold
(Pendulum >= -200, BipedalWalker >= 300, Hopper >= 3000), plus the final evaluation (5 episodes).

    .venv/bin/python bench/preset_seeds.py --env CartPole-v1 --seeds 1-10                       # the preset
    .venv/bin/python bench/preset_seeds.py --env CartPole-v1 --seeds 1-10 --name 32x8 \\
        --set num_envs=32 --set num_steps=8                                                     # a candidate
Results accumulate in ``--out`` (default reports/bench/preset_seeds/): results.json and preset_seeds.md. Each
result keeps its evaluations, so ``--tabulate --threshold 200`` re-reads the stored runs against another bar (say
BipedalWalker's learning bar, eval >= 200, beside its 300 target) without training again.

A screen is cheaper than a full judgement: ``--stop-at-target`` stops a run once an evaluation reaches the target and
``--give-up-at STEPS`` stops one that has not by then (both checkpoint, so ``--resume`` goes on). The learning rate
still anneals over the full run, so the steps to target are an unstopped run's:

    .venv/bin/python bench/preset_seeds.py --env BipedalWalker-v3 --seeds 2 --name logstd-0.5 \
        --set init_log_std=-0.5 --eval-every-steps 81920 --stop-at-target --give-up-at 1400000
"""

from __future__ import annotations

import argparse
import json
import shutil
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))
from train_throughput import (  # noqa: E402
    THRESHOLDS,
    TRAINING_MEAN_TARGET,
    cpu_summary,
    iterations_between,
    steps_to_eval_threshold,
    steps_to_threshold,
    target_step,
    wall_at_step,
)

from msrl_consistency.artifacts import run_dir as rd  # noqa: E402  (the run dir's CSV logs; no MindSpore import)

EVAL_EVERY_STEPS = 4096
POLL_S = 5.0  # how often a stoppable run's logs are read


def parse_seeds(text: str) -> list[int]:
    seeds: list[int] = []
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        seeds += list(range(int(lo), int(hi or lo) + 1))
    return seeds


def stop_reason(env_id: str, run_dir: Path, stop_at_target: bool, give_up_at: int | None) -> str | None:
    """Why a running run should stop now: it reached its target, or passed ``give_up_at`` steps without it.
    Reads only the small logs (evaluations, metrics): it runs every few seconds while the run trains."""
    if env_id in TRAINING_MEAN_TARGET:
        return None  # "stays >= the bar" is only known at the end of a run
    thr = THRESHOLDS.get(env_id, float("inf"))
    if stop_at_target and steps_to_eval_threshold(rd.eval_means(run_dir), thr) is not None:
        return "target"
    metrics = rd.read_log(run_dir / rd.METRICS_CSV)
    at = int(metrics[-1]["global_step"]) if metrics else 0
    return "gave up" if give_up_at and at >= give_up_at else None


def run(
    env_id: str,
    name: str,
    overrides: list[str],
    seed: int,
    steps: int | None,
    out: Path,
    eval_every_steps: int = EVAL_EVERY_STEPS,
    stop_at_target: bool = False,
    give_up_at: int | None = None,
) -> dict[str, Any]:
    """One training run of the real CLI. With ``stop_at_target`` / ``give_up_at`` it is stopped (SIGTERM: the
    iteration finishes and is checkpointed, so ``--resume`` can go on) once its target is reached or once it has
    passed ``give_up_at`` steps without it. The learning-rate schedule still spans the full run's steps, so the
    steps to target are those of an unstopped run; a stopped run has no final evaluation."""
    run_dir = out / "runs" / f"{env_id}-{name}-s{seed}"
    if run_dir.exists():
        shutil.rmtree(run_dir)
    sys.path.insert(0, str(REPO))
    from msrl_consistency.config import parse_config

    flags = [f"--{k.replace('_', '-')}={v}" for k, v in (o.split("=", 1) for o in overrides)]
    base = ["--env-id", env_id, "--seed", str(seed), *(["--total-steps", str(steps)] if steps else []), *flags]
    cfg = parse_config([*base, "--run-dir", str(run_dir)])
    every = iterations_between(eval_every_steps, cfg.batch_size)
    cmd = [sys.executable, "-m", "msrl_consistency.train", *base, "--eval-every", str(every), "--eval-episodes", "5",
           "--progress", "false", "--compile-cache", "false", "--run-dir", str(run_dir)]  # fmt: skip
    log_path = out / "runs" / f"{run_dir.name}.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    stopped = None
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, cwd=REPO, stdout=log, stderr=subprocess.STDOUT, text=True)
        while proc.poll() is None:
            time.sleep(POLL_S)
            if stopped is None and (stop_at_target or give_up_at):
                stopped = stop_reason(env_id, run_dir, stop_at_target, give_up_at)
                if stopped is not None:
                    proc.send_signal(signal.SIGTERM)
    if proc.returncode != 0 and not (stopped and proc.returncode == 130):
        tail = log_path.read_text()[-2000:]
        raise SystemExit(f"{name} seed {seed} failed ({proc.returncode}):\n{tail}")
    wall = time.perf_counter() - start
    episodes = rd.episode_returns(run_dir)
    evals, rows = rd.eval_means(run_dir), rd.read_log(run_dir / rd.METRICS_CSV)
    info = json.loads((run_dir / "run.json").read_text())
    thr = THRESHOLDS.get(env_id, float("inf"))
    final = [float(x) for x in info["eval"]["returns"]] if info.get("eval") else []
    return {"env_id": env_id, "name": name, "overrides": overrides, "seed": seed, "global_step": info["global_step"],
            "steps_to_threshold": steps_to_threshold(episodes, thr), "steps_to_eval_threshold":
            steps_to_eval_threshold(evals, thr), "evals": evals, "final_eval": float(np.mean(final)) if final else None,
            "stopped": stopped, "sps": float(rows[-1]["sps"]), "process_wall": wall,
            "backend": info["env_backend"]["name"], "peak_rss_mb": info.get("peak_rss_mb"), "host": cpu_summary(),
            "progress": [(int(r["global_step"]), float(r["wall_time"])) for r in rows]}  # fmt: skip


def reached_at(result: dict[str, Any], threshold: float | None) -> int | None:
    """The env step at which a run met its env's target, or first evaluated at or above ``threshold``."""
    if threshold is None:
        return target_step(result)
    if result["env_id"] in TRAINING_MEAN_TARGET or "evals" not in result:
        raise SystemExit(
            f"--threshold needs stored evaluations: {result['env_id']} {result['name']} seed "
            f"{result['seed']} has none (its target is the training mean, or it ran before they were)"
        )
    return steps_to_eval_threshold(result["evals"], threshold)


def seed_cell(result: dict[str, Any], step: int | None) -> str:
    """A seed's steps to target in k steps; a miss is "–", or "–@1.40M" if given up on (--give-up-at) that early."""
    if step is not None:
        return f"{step / 1000:.1f}"
    return f"–@{result['global_step'] / 1e6:.2f}M" if result.get("stopped") == "gave up" else "–"


def table(results: list[dict[str, Any]], threshold: float | None = None) -> str:
    lines = ["| env | candidate | overrides | seeds | reached | median steps to target | worst | per seed (k steps) "
             "| final eval: mean (min) | SPS (indicative) | median wall s to target (indicative) |",
             "|---|---|---|---:|---:|---:|---:|---|---|---:|---:|"]  # fmt: skip
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for r in results:
        groups.setdefault((r["env_id"], r["name"]), []).append(r)
    for (env, name), rs in groups.items():
        rs = sorted(rs, key=lambda r: r["seed"])
        steps = [reached_at(r, threshold) for r in rs]
        reached = [s for s in steps if s is not None]
        med_step = np.median([np.inf if s is None else s for s in steps])  # a missed seed counts as never
        med = f"{med_step:,.0f}" if np.isfinite(med_step) else "–"
        worst = "–" if len(reached) < len(rs) else f"{max(reached):,}"
        per_seed = ", ".join(seed_cell(r, s) for r, s in zip(rs, steps, strict=True))
        finals = [r["final_eval"] for r in rs if r["final_eval"] is not None]
        final = f"{np.mean(finals):.1f} ({np.min(finals):.1f})" if finals else "– (stopped)"
        walls = [wall_at_step(r.get("progress", []), s) for r, s in zip(rs, steps, strict=True)]
        wall = np.median([np.inf if w is None else w for w in walls])  # inf (shown as –) if most seeds missed
        lines.append(f"| {env} | {name} | {' '.join(rs[0]['overrides']) or 'preset'} | {len(rs)} | "
                     f"{len(reached)}/{len(rs)} | {med} | {worst} | {per_seed} | {final} | "
                     f"{np.mean([r['sps'] for r in rs]):,.0f} | "
                     f"{f'{wall:.1f}' if np.isfinite(wall) else '–'} |")  # fmt: skip
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--env", default="CartPole-v1")
    parser.add_argument("--seeds", default="1-10", help="e.g. 1-10 or 1,2,5")
    parser.add_argument("--steps", type=int, default=0, help="total steps (default: the preset's)")
    parser.add_argument("--name", default="preset", help="candidate name in the table")
    parser.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE", help="override a preset field")
    parser.add_argument("--jobs", type=int, default=2, help="runs side by side")
    parser.add_argument(
        "--eval-every-steps",
        type=int,
        default=EVAL_EVERY_STEPS,
        help="periodic evaluation cadence (Hopper's 1M steps: 51200, or evaluations dominate)",
    )
    parser.add_argument("--out", default="reports/bench/preset_seeds")
    parser.add_argument(
        "--threshold", type=float, default=None, help="tabulate against this evaluation bar instead of the env's target"
    )
    parser.add_argument("--tabulate", action="store_true", help="only tabulate the runs stored in --out")
    parser.add_argument(
        "--stop-at-target",
        action="store_true",
        help="stop a run once an evaluation reaches the target (no final evaluation then)",
    )
    parser.add_argument(
        "--give-up-at",
        type=int,
        default=0,
        metavar="STEPS",
        help="stop a run that has not reached its target after STEPS env steps (a screen)",
    )
    args = parser.parse_args(argv)
    out = REPO / args.out
    store = out / "results.json"
    results = json.loads(store.read_text())["results"] if store.exists() else []
    if args.tabulate:
        if not results:
            raise SystemExit(f"no stored runs in {store}")
        bar = "each env's target" if args.threshold is None else f"the first evaluation >= {args.threshold:g}"
        print(f"Target: {bar}.\n\n{table(results, args.threshold)}")
        return 0
    out.mkdir(parents=True, exist_ok=True)
    seeds = parse_seeds(args.seeds)
    # A rerun replaces this candidate's results for these seeds; its other seeds are kept.
    results = [r for r in results if not (r["env_id"] == args.env and r["name"] == args.name and r["seed"] in seeds)]
    with ThreadPoolExecutor(args.jobs) as pool:
        futures = [
            pool.submit(
                run,
                args.env,
                args.name,
                args.set,
                s,
                args.steps or None,
                out,
                args.eval_every_steps,
                args.stop_at_target,
                args.give_up_at or None,
            )
            for s in seeds
        ]
        for f in futures:
            r = f.result()
            final = "–" if r["final_eval"] is None else f"{r['final_eval']:.1f}"
            stopped = f" (stopped: {r['stopped']} at {r['global_step']:,})" if r["stopped"] else ""
            print(f"{r['name']} seed {r['seed']}: target at {target_step(r)}, final eval {final}, "
                  f"{r['sps']:,.0f} SPS{stopped}", flush=True)  # fmt: skip
            results.append(r)
            store.write_text(json.dumps({"results": results}, indent=1))
    text = table(results, args.threshold)
    (out / "preset_seeds.md").write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
