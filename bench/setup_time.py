"""Wall time of `make setup` on a fresh clone (venv, packages, the x86 and aarch64 Lite builds), two revisions.

Each run clones this checkout into a temporary directory, checks out the revision, runs `make setup` and deletes the
clone (~5 GB each). Runs alternate between the revisions so the machine's load moves both alike. Each run has empty
pip and uv caches of its own, as on a machine where nothing was installed before (CI); `--warm-caches` leaves the
user's caches in place, as a second clone on a developer's machine finds them.

    python bench/setup_time.py --base HEAD~1 --head HEAD --repeats 2
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from inference.machine.facts import cpu_summary  # noqa: E402


def one(rev: str, warm_caches: bool) -> float:
    root = Path(tempfile.mkdtemp(prefix="setup-time-"))
    try:
        clone = root / "clone"
        subprocess.run(["git", "clone", "-q", str(REPO), str(clone)], check=True)
        subprocess.run(["git", "checkout", "-q", rev], cwd=clone, check=True)
        env = dict(os.environ)
        if not warm_caches:
            env.update(PIP_CACHE_DIR=str(root / "pip-cache"), UV_CACHE_DIR=str(root / "uv-cache"))
        start = time.perf_counter()
        subprocess.run(["make", "setup"], cwd=clone, check=True, env=env, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL)  # fmt: skip
        return time.perf_counter() - start
    finally:
        shutil.rmtree(root, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", default="HEAD~1")
    parser.add_argument("--head", default="HEAD")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--warm-caches", action="store_true", help="use the user's pip and uv caches (default: empty)")
    args = parser.parse_args(argv)
    revs = {name: subprocess.check_output(["git", "rev-parse", "--short", rev], cwd=REPO, text=True).strip()
            for name, rev in (("base", args.base), ("head", args.head))}  # fmt: skip
    runs: dict[str, list[float]] = {"base": [], "head": []}
    for _ in range(args.repeats):
        for name in ("head", "base"):
            runs[name].append(one(revs[name], args.warm_caches))
    print(f"{time.strftime('%Y-%m-%d')}, {cpu_summary()}, {args.repeats} alternating runs each, "
          f"`python bench/setup_time.py --base {args.base} --head {args.head} --repeats {args.repeats}"
          f"{' --warm-caches' if args.warm_caches else ''}`\n")  # fmt: skip
    print("| revision | runs, s | median s | vs base |")
    print("|---|---|---:|---:|")
    base = statistics.median(runs["base"])
    for name in ("base", "head"):
        med = statistics.median(runs[name])
        print(f"| {name} {revs[name]} | {', '.join(f'{t:.1f}' for t in runs[name])} | {med:.1f} | {med / base:.2f}x |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
