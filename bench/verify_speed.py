"""Wall time of a full verify (10k observations + 20 episodes per mode, every available runtime).

Prints the total and a breakdown, with the reference-only cost measured in the same run as the baseline
(``--runtimes ms-cell`` compares nothing and shows what building the reference costs). Target: <= 60 s.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

from inference_latency import prepare


def timed(args: list[str]) -> tuple[float, int]:
    t = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "msrl_consistency.verify", *args, "--quiet"], capture_output=True)
    return time.perf_counter() - t, proc.returncode


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=Path("reports/bench"))
    args = p.parse_args()
    bundle, ckpt = prepare(args.out)
    common = ["--bundle", str(bundle), "--ckpt", str(ckpt), "--observations", "10000", "--episodes", "20"]
    base, _ = timed([*common, "--runtimes", "ms-graph", "--out", str(args.out / "verify-ref")])
    full, code = timed([*common, "--out", str(args.out / "verify-full")])
    print("| run | wall time (s) | ratio to reference-only |")
    print("|---|---:|---:|")
    print(f"| reference + ms-graph only | {base:.1f} | 1.00x |")
    print(f"| full verify, all available runtimes (exit {code}) | {full:.1f} | {full / base:.2f}x |")
    print(f"\ntarget <= 60 s: {'met' if full <= 60 else 'missed'}")


if __name__ == "__main__":
    main()
