"""Soak the deployed runner: N single-observation requests (default 200,000) over repeated seeded inputs.

Reports the runner's RSS over time and the bitwise drift of answers to repeated inputs, via
``python -m inference.bench --soak N``. Usage: ``python bench/soak.py [--bundle DIR] [--requests N]``; without
``--bundle`` a small CartPole-v1 policy is trained and exported into reports/bench/ first (needs MindSpore).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from inference.bench import main as bench_main


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--bundle", type=Path)
    p.add_argument("--requests", type=int, default=200_000)
    p.add_argument("--out", type=Path, default=Path("reports/bench"))
    args = p.parse_args()
    bundle = args.bundle
    if bundle is None:
        from inference_latency import prepare  # the training side makes the bundle

        bundle, _ = prepare(args.out)
    json_out = args.out / "soak.json"
    return bench_main([str(bundle), "--batch", "1", "--soak", str(args.requests), "--episodes", "0",
                       "--json", str(json_out)])  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
