"""What a MindSpore CLI pays to start and to end: the import and the exit, with and without ``compat``'s collector
handling.

Every training-side CLI (train, export, verify, an msrun rank) imports MindSpore through ``msrl_consistency.compat``,
which imports it with collection paused and freezes the live heap before the interpreter's exit collections. The
baseline imports the same modules directly (collections on, a plain exit). Rows alternate baseline and compat, each
a fresh interpreter; the table gives the medians and their ratio.

    .venv/bin/python bench/cli_startup.py --repeats 7
"""

from __future__ import annotations

import argparse
import platform
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BASELINE = "import numpy, inference.errors, mindspore\nfrom mindspore import nn\nfrom mindspore.graph import api"
COMPAT = "import msrl_consistency.compat"


def cpu_model() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown CPU"


def one(code: str) -> tuple[float, float]:
    """(wall, CPU) seconds of a fresh interpreter that runs ``code`` and exits."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args(argv)
    rows: dict[str, list[tuple[float, float]]] = {"baseline": [], "compat": []}
    one(COMPAT)  # warm the page cache for both
    for _ in range(args.repeats):
        rows["baseline"].append(one(BASELINE))
        rows["compat"].append(one(COMPAT))
    med = {k: (statistics.median(w for w, _ in v), statistics.median(c for _, c in v)) for k, v in rows.items()}
    print(f"{time.strftime('%Y-%m-%d')}, {cpu_model()}, {args.repeats} alternating runs each, "
          f"`{Path(sys.executable).name} bench/cli_startup.py --repeats {args.repeats}`\n")  # fmt: skip
    print("| start and exit | wall s (median) | CPU s (median) | CPU vs baseline |")
    print("|---|---:|---:|---:|")
    for name, label in (("baseline", "MindSpore imported directly"), ("compat", "through compat")):
        wall, cpu = med[name]
        print(f"| {label} | {wall:.2f} | {cpu:.2f} | {cpu / med['baseline'][1]:.2f}x |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
