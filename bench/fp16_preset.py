"""Judge the fp16 tolerance preset on trained policies: each exported with ``--precision fp16 --require-lite`` and
verified in full (10k observations, 20 episodes per mode, every runtime) against its fp32 training path.

A genuine fp16 export must pass; the table says, per policy, the verdict, the runtimes compared, the largest
difference of any output relative to the atol it was granted, and the action flips (how many, how many within
the tolerance granted to the scores). The same policies exported fp32 are the same-run baseline (they must pass fp32).

    python bench/fp16_preset.py [--policies CartPole-v1:30000:1,...] [--out reports/bench/fp16_preset]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

DEFAULT = ",".join([*(f"CartPole-v1:30000:{s}" for s in range(1, 6)), *(f"Pendulum-v1:60000:{s}" for s in range(1, 6))])


def sh(*args: str) -> int:
    return subprocess.run([sys.executable, "-m", *args], capture_output=True, text=True).returncode


def judge(env_id: str, steps: int, seed: int, out: Path) -> dict:
    run, tag = out / "runs" / f"{env_id}-s{seed}", f"{env_id}-s{seed}"
    if not (run / "checkpoint.ckpt").exists():
        code = sh("msrl_consistency.train", "--env-id", env_id, "--total-steps", str(steps), "--seed", str(seed),
                  "--run-dir", str(run), "--progress", "false", "--eval-episodes", "0")  # fmt: skip
        if code:
            raise SystemExit(f"training {tag} failed ({code})")
    row: dict = {"policy": f"{env_id} seed {seed} ({steps} steps)"}
    for precision in ("fp32", "fp16"):
        bundle, report = out / "bundles" / f"{tag}-{precision}", out / "reports" / f"{tag}-{precision}"
        started = time.perf_counter()
        code = sh("msrl_consistency.export", "--ckpt", str(run), "--out", str(bundle), "--precision", precision,
                  "--require-lite", "--force")  # fmt: skip
        if code:
            row[precision] = {"exit": f"export {code}"}
            continue
        code = sh("msrl_consistency.verify", "--bundle", str(bundle), "--ckpt", str(run), "--out", str(report),
                  "--quiet")  # fmt: skip
        if not (report / "report.json").is_file():
            row[precision] = {"exit": f"verify {code}, no report"}
            continue
        rep = json.loads((report / "report.json").read_text())
        flips = [c["metrics"]["flips"] for c in rep["checks"] if "flips" in c.get("metrics", {})]
        worst = [o["max_abs"] / max(o["atol"] or 0.0, 1e-12) for c in rep["checks"]
                 if c["name"].startswith("observations.") and c["runtime"] != "ms-graph"
                 for o in c["metrics"].get("outputs", {}).values() if not o["exact"]]  # fmt: skip
        row[precision] = {
            "exit": code,
            "ran": sorted(n for n, i in rep["runtimes"].items() if i["status"] == "ran"),
            "failed": [f"{c['runtime']}.{c['name']}" for c in rep["checks"] if c["status"] == "fail"],
            "flips": sum(f["flips"] for f in flips),
            "explained": sum(f["explained"] for f in flips),
            "worst_vs_atol": max(worst, default=0.0),
            "seconds": round(time.perf_counter() - started, 1),
        }
    return row


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--policies", default=DEFAULT, help="ENV:STEPS:SEED,... (trained once, reused)")
    p.add_argument("--out", type=Path, default=Path("reports/bench/fp16_preset"))
    args = p.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    rows = []
    print("| policy | fp32 exit | fp16 exit | fp16 runtimes | fp16 failed checks | fp16 flips (within tolerance) | "
          "fp16 worst max abs Δ / its atol |")  # fmt: skip
    print("|---|---:|---:|---|---|---:|---:|")
    for spec in args.policies.split(","):
        env_id, steps, seed = spec.split(":")
        row = judge(env_id, int(steps), int(seed), args.out)
        rows.append(row)
        f16, f32 = row["fp16"], row["fp32"]
        print(
            f"| {row['policy']} | {f32['exit']} | {f16['exit']} | {', '.join(f16.get('ran', []))} | "
            f"{', '.join(f16.get('failed', [])) or '–'} | {f16.get('flips', '–')} ({f16.get('explained', '–')}) | "
            f"{f16.get('worst_vs_atol', 0):.2f} |",
            flush=True,
        )
    (args.out / "fp16_preset.json").write_text(json.dumps(rows, indent=2) + "\n")


if __name__ == "__main__":
    main()
