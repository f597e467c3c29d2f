"""The Lite runner's memory when a request exceeds its row cap: refused and skipped unbuffered, so its RSS stays flat.

Baseline from the same run: the runner's RSS after an accepted request at the cap. A 1e6-row request (16 MB) is
then sent to a runner capped at 1,000 rows, as a client that ignores the cap would; the table shows the RSS before
and after, and after one more small request.

    python bench/runner_row_cap.py [--bundle DIR]    (default: a CartPole-v1 bundle made by bench/inference_latency.py)
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from inference.bundle import load_bundle
from inference.bundle.tensors import FeedError
from inference.lite.client import LiteRunner
from inference.machine.procfs import status_mb


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--bundle", type=Path)
    p.add_argument("--out", type=Path, default=Path("reports/bench"))
    args = p.parse_args()
    bundle_dir = args.bundle
    if bundle_dir is None:
        from inference_latency import prepare  # the training side makes the bundle

        bundle_dir, _ = prepare(args.out)
    bundle = load_bundle(bundle_dir)
    width = bundle.contract("policy").obs_shape[0]
    with LiteRunner(bundle.file("policy", "ms"), max_rows=1000) as runner:
        runner.infer(np.zeros((1000, width), np.float32))
        at_cap = status_mb("VmRSS", runner.pid)
        runner.max_rows = 10**7  # as a client that does not know the cap
        try:
            runner.infer(np.zeros((1_000_000, width), np.float32))
            refused = "no"
        except FeedError:
            refused = "yes"
        after = status_mb("VmRSS", runner.pid)
        runner.infer(np.zeros((2, width), np.float32))
        later = status_mb("VmRSS", runner.pid)
    print("| runner RSS after a 1,000-row request (baseline) | 1e6-row request refused | RSS after it | "
          "RSS after the next request | growth vs baseline |")  # fmt: skip
    print("|---:|---|---:|---:|---:|")
    print(f"| {at_cap:.1f} MB | {refused} | {after:.1f} MB | {later:.1f} MB | {later - at_cap:+.1f} MB |")


if __name__ == "__main__":
    main()
