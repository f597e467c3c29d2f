"""What a batch change costs the Lite runner: calls at one batch against calls alternating between two.

Lite 2.0.0 corrupts its heap resizing some graphs after a Predict, so the runner builds the model again for a new
batch once it has run, and keeps the last few models for the batches they ran at (an fp16 ``.ms``, which Lite builds
once per process, is resized as before). This prints the per-call time at a fixed batch and with the batch changing
on every call, and their ratio, for each ``.ms`` given.

    python bench/lite_batch_change.py bundles/cartpole/policy.ms bundles/bipedal/policy.ms
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np

from inference.lite.client import LiteRunner
from inference.machine.facts import measured_here


def per_call(runner: LiteRunner, feeds: list[list[np.ndarray]], calls: int) -> float:
    start = time.perf_counter()
    for i in range(calls):
        runner.infer(*feeds[i % len(feeds)])
    return (time.perf_counter() - start) / calls


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("models", nargs="+", type=Path)
    parser.add_argument("--calls", type=int, default=200)
    args = parser.parse_args()
    models = " ".join(map(str, args.models))
    print(measured_here(f"python bench/lite_batch_change.py {models} --calls {args.calls}") + "\n")
    print("| model | KB | one batch (µs/call) | batch 1 and 8 alternating (µs/call) | ratio |")
    print("|---|---:|---:|---:|---:|")
    for path in args.models:
        with LiteRunner(path) as runner:
            ones, eights = ([np.zeros((b, *m.shape[1:]), m.dtype) for m in runner.inputs] for b in (1, 8))
            per_call(runner, [ones], 20)  # warm
            same = per_call(runner, [ones], args.calls)
            changing = per_call(runner, [ones, eights], args.calls)
        print(f"| {path} | {path.stat().st_size / 1024:.0f} | {same * 1e6:.0f} | {changing * 1e6:.0f} | "
              f"{changing / same:.1f}x |")  # fmt: skip


if __name__ == "__main__":
    main()
