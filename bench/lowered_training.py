"""Training in the device's numerics against post-training lowering, per policy, in one run.

Per policy (a trained fp32 run directory, the *base*):

* ``fp32 base``: the base run's own deterministic evaluation;
* ``fp32 fine-tuned``: the base trained ``N`` more steps in fp32 on each seed (the spread a lowered fine-tune is
  measured against: same steps, same seeds);
* ``int8 PTQ all`` / ``fp16 PTQ all``: the base's bundle with every layer lowered after training
  (``python -m msrl_consistency.precision --keep none``), judged by verify against the fp32 Cell;
* ``int8 trained`` / ``fp16 trained``: ``train --init-from BASE --lower L --total-steps N`` on each seed, exported
  (a ``.ms`` with the trained scales) and verified against the run's own lowered Cell (``--emulate fp16`` for fp16).

Columns: steps and wall seconds of the fine-tune, the deterministic evaluation return (mean ± std over the seeds'
runs; PTQ rows: the return difference verify measured on paired episodes), the deterministic graph's ``.ms`` size
against fp32, the flip rate and mean exp|Δ log π| of the lowered runtime against its reference (PTQ: the fp32 Cell;
trained: the trained lowered Cell), and verify's exit codes.

    python bench/lowered_training.py --runs CartPole-v1=runs/cp,Pendulum-v1=runs/pd \\
        --steps CartPole-v1=20000,Pendulum-v1=30000 [--seeds 1,2,3] [--out reports/bench/lowered_training]
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

import numpy as np

from inference.machine.facts import host_cpu

REPO = Path(__file__).resolve().parents[1]
PY = sys.executable
JUDGE = ["--observations", "4000", "--episodes", "10"]


def sh(*args: str) -> tuple[subprocess.CompletedProcess[str], float]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    start = time.perf_counter()
    proc = subprocess.run([PY, *args], capture_output=True, text=True, env=env, cwd=REPO)
    return proc, time.perf_counter() - start


def must(proc: subprocess.CompletedProcess[str], what: str) -> None:
    if proc.returncode not in (0, 1):
        sys.exit(f"{what}: exit {proc.returncode}\n{proc.stderr[-2000:]}")


def lite_numbers(report: dict, runtime: str, graph: str = "policy") -> tuple[float | None, float | None]:
    """(flip rate, mean exp|Δ log π|) of ``runtime`` on the deterministic graph's policy check."""
    for check in report.get("checks", []):
        if check["runtime"] == runtime and check["name"] == f"policy.{graph}":
            metrics = check.get("metrics") or {}
            flips = metrics.get("flip_rate")
            rate = flips.get("rate") if isinstance(flips, dict) else flips  # Gaussian policies have none
            return rate, (metrics.get("mismatch") or {}).get("mean_exp_abs")
    return None, None


def verify(bundle: Path, ckpt: Path, out: Path, *extra: str) -> tuple[int, dict]:
    proc, _ = sh("-m", "msrl_consistency.verify", "--bundle", str(bundle), "--ckpt", str(ckpt), "--out", str(out),
                 "--quiet", *JUDGE, *extra)  # fmt: skip
    data = json.loads((out / "report.json").read_text()) if (out / "report.json").is_file() else {}
    return proc.returncode, data


def eval_return(run: Path) -> float:
    return float(json.loads((run / "run.json").read_text())["eval"]["mean"])


def ptq_row(env: str, base: Path, fp32: Path, work: Path, lower: str) -> dict:
    out = work / f"ptq-{lower}"
    proc, seconds = sh("-m", "msrl_consistency.precision", "--bundle", str(fp32), "--ckpt", str(base), "--lower",
                       lower, "--keep", "none", "--out", str(out), "--force", "--quiet", *JUDGE)  # fmt: skip
    if not (out / "manifest.json").is_file():
        return {"env": env, "row": f"{lower} PTQ all", "verify": f"no bundle: {proc.stderr.strip()[-160:]}"}
    runtime = "lite" if lower == "int8" else "emulated-fp16"
    code, report = verify(out, base, work / f"ptq-{lower}-report", *(["--emulate", "fp16"] if lower == "fp16" else []))
    flips, ratio = lite_numbers(report, runtime)
    final = json.loads((out / "manifest.json").read_text())["plan"]["final"]
    ret = max((r["difference"] for r in (final.get("returns") or {}).values()), default=None)
    return {
        "env": env,
        "row": f"{lower} PTQ all",
        "steps": "–",
        "wall": seconds,
        "return": ret,
        "relative": True,
        "kb": (out / "policy.ms").stat().st_size / 1024,
        "flips": flips,
        "ratio": ratio,
        "verify": str(code),
    }


def trained_rows(env: str, base: Path, work: Path, lower: str, steps: int, seeds: list[int], lr: str | None) -> dict:
    returns, walls, codes, flips, ratios, sizes = [], [], [], [], [], []
    rate = ["--learning-rate", lr] if lr else []
    for seed in seeds:
        run = work / f"{lower}-s{seed}"
        shutil.rmtree(run, ignore_errors=True)  # a fresh run each time the bench runs
        proc, seconds = sh("-m", "msrl_consistency.train", "--env-id", env, "--init-from", str(base), "--lower", lower,
                           "--total-steps", str(steps), "--seed", str(seed), "--run-dir", str(run), "--no-progress",
                           *rate)  # fmt: skip
        must(proc, f"train {env} {lower} seed {seed}")
        returns.append(eval_return(run))
        walls.append(seconds)
        if lower == "fp32":
            continue
        bundle = work / f"{lower}-s{seed}-bundle"
        proc, _ = sh("-m", "msrl_consistency.export", "--ckpt", str(run), "--out", str(bundle), "--force")
        must(proc, f"export {env} {lower} seed {seed}")
        code, report = verify(bundle, run, work / f"{lower}-s{seed}-report",
                              *(["--emulate", "fp16"] if lower == "fp16" else []))  # fmt: skip
        codes.append(str(code))
        f, r = lite_numbers(report, "lite" if lower == "int8" else "emulated-fp16")
        flips.append(f)
        ratios.append(r)
        sizes.append((bundle / "policy.ms").stat().st_size / 1024)
    worst = [v for v in flips if v is not None]
    return {"env": env, "row": f"{lower} {'fine-tuned' if lower == 'fp32' else 'trained'}", "steps": steps,
            "wall": float(np.mean(walls)), "return": (float(np.mean(returns)), float(np.std(returns))),
            "kb": float(np.mean(sizes)) if sizes else None, "flips": max(worst) if worst else None,
            "ratio": max((v for v in ratios if v is not None), default=None),
            "verify": ", ".join(codes) if codes else "–", "seeds": returns}  # fmt: skip


def fmt(row: dict, fp32_kb: float) -> str:
    ret = row.get("return")
    if ret is None:
        shown = "–"
    elif row.get("relative"):
        shown = f"Δ {ret:.1%}"
    elif isinstance(ret, tuple):
        shown = f"{ret[0]:.1f} ± {ret[1]:.1f}"
    else:
        shown = f"{ret:.1f}"
    kb = row.get("kb")
    size = f"{kb:.1f} ({kb / fp32_kb:.0%})" if kb else "–"
    flips = f"{row['flips']:.2%}" if row.get("flips") is not None else "–"
    value = row.get("ratio")
    ratio = "–" if value is None else f"{value:.5f}" if value < 1e3 else f"{value:.3g}"
    wall = f"{row['wall']:.0f}" if isinstance(row.get("wall"), float) else "–"
    return (f"| {row['env']} | {row['row']} | {row.get('steps', '–')} | {wall} | {shown} | {size} | {flips} | "
            f"{ratio} | {row.get('verify', '–')} |")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", required=True, help="ENV=RUN_DIR,... (trained fp32 base runs)")
    parser.add_argument("--steps", required=True, help="ENV=N,... fine-tuning steps per env")
    parser.add_argument("--seeds", default="1,2,3")
    parser.add_argument("--out", type=Path, default=REPO / "reports" / "bench" / "lowered_training")
    parser.add_argument(
        "--rows", default="fp32,ptq-int8,int8,ptq-fp16,fp16", help="which rows to run (the fp32 base row always)"
    )
    parser.add_argument("--learning-rate", help="the fine-tunes' learning rate (default: each env's preset)")
    args = parser.parse_args()
    runs = dict(item.split("=", 1) for item in args.runs.split(","))
    steps = {k: int(v) for k, v in (item.split("=", 1) for item in args.steps.split(","))}
    seeds = [int(s) for s in args.seeds.split(",")]
    started = time.perf_counter()
    lines = ["| policy | row | steps | wall s | deterministic return | policy.ms KB (vs fp32) | flip rate | "
             "mean exp\\|Δ log π\\| | verify |", "|---|---|---:|---:|---|---:|---:|---:|---|"]  # fmt: skip
    notes: list[str] = []
    for env, base_dir in runs.items():
        base, work = Path(base_dir).resolve(), args.out / env
        work.mkdir(parents=True, exist_ok=True)
        fp32 = work / "fp32"
        proc, _ = sh("-m", "msrl_consistency.export", "--ckpt", str(base), "--out", str(fp32), "--force")
        must(proc, f"export {env}")
        fp32_kb = (fp32 / "policy.ms").stat().st_size / 1024
        wanted = set(args.rows.split(","))
        rows = [{"env": env, "row": "fp32 base", "return": eval_return(base), "kb": fp32_kb, "verify": "–"}]
        for name in ("fp32", "ptq-int8", "int8", "ptq-fp16", "fp16"):
            if name not in wanted:
                continue
            lower = name.removeprefix("ptq-")
            rows.append(ptq_row(env, base, fp32, work, lower) if name.startswith("ptq-") else
                        trained_rows(env, base, work, lower, steps[env], seeds, args.learning_rate))  # fmt: skip
        for row in rows:
            lines.append(fmt(row, fp32_kb))
            print(lines[-1], flush=True)
        notes += [f"{row['env']} {row['row']} per seed: {', '.join(f'{r:.1f}' for r in row['seeds'])}"
                  for row in rows if row.get("seeds")]  # fmt: skip
    header = (f"{time.strftime('%Y-%m-%d')}, {host_cpu()[0]} ({os.cpu_count()} CPUs), "
              f"`python bench/lowered_training.py --runs {args.runs} --steps {args.steps} --seeds {args.seeds} "
              f"--rows {args.rows}{f' --learning-rate {args.learning_rate}' if args.learning_rate else ''}`, "
              f"{time.perf_counter() - started:.0f} s")  # fmt: skip
    print("\n" + header + "\n\n" + "\n".join(lines) + "\n\n" + "\n".join(f"- {n}" for n in notes))


if __name__ == "__main__":
    main()
