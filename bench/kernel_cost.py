"""Two facts about MindSpore's CPU runtime that bound our train step, and how far to trust an in-process A/B.

1. **Cost per kernel around the single-thread threshold.** MindSpore 2.10's graph scheduler runs a graph in the
   calling thread ("single thread execution") only when it has at most 100 kernel actors and one actor thread
   (``GraphScheduler::CheckSingleThreadRunningCondition``); larger graphs go through the actor thread pool, where
   every kernel is a message between threads. Chains of N cheap kernels (``tanh(x + b)``, N/2 times) on either side
   of 100 show the step. Our act graph (~40 kernels) runs in the calling thread; a minibatch update (~150-200
   kernels: 13 Parameters each bring an Adam, an L2Loss and a Mul) cannot.
2. **Position bias.** The same train step built twice in one process, timed in interleaved rounds (best of 5
   rounds each, as ``update_cost.py`` does): the two copies compute exactly the same thing, so any gap between them
   is the bias an in-process A/B of two graph variants carries.

    .venv/bin/python bench/kernel_cost.py                      # both tables
    .venv/bin/python bench/kernel_cost.py --env Pendulum-v1 --rounds 6

Ratios, not absolute times: both tables compare against a baseline measured in the same process, same run.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))
from update_cost import ours_on_synthetic_data, seconds_per_call  # noqa: E402

CHAIN_KERNELS = (90, 98, 102, 120)  # either side of MindSpore's 100-kernel single-thread limit


def chain_costs(repeats: int) -> dict[int, float]:
    """Seconds per call of graphs made of ``n`` dependent cheap kernels, for each n in ``CHAIN_KERNELS``."""
    import mindspore as ms
    from mindspore import Tensor, nn, ops

    class Chain(nn.Cell):
        def __init__(self, kernels: int) -> None:
            super().__init__()
            self.pairs = kernels // 2
            self.b = ms.Parameter(Tensor(np.zeros(64, np.float32)))

        def construct(self, x: Tensor) -> Tensor:
            for _ in range(self.pairs):
                x = ops.tanh(x + self.b)  # two kernels: Add, Tanh
            return x

    x = Tensor(np.random.default_rng(0).random((64, 64), dtype=np.float32))
    cells = {n: Chain(n) for n in CHAIN_KERNELS}
    # 60 warm-up calls each: the scheduler settles a graph's execution mode within its first 50 runs.
    for cell in cells.values():
        for _ in range(60):
            cell(x).asnumpy()
    times = seconds_per_call({str(n): (lambda c=c: c(x).asnumpy()) for n, c in cells.items()}, repeats)
    return {n: times[str(n)] for n in CHAIN_KERNELS}


def twin_steps(env_id: str, repeats: int, rounds: int) -> list[tuple[float, float]]:
    """Per round, ms per minibatch update of the first- and the second-built copy of the same train step."""
    from mindspore import Tensor

    from msrl_consistency import compat

    calls = []
    for _ in range(2):
        cfg, _, learner, rng, data = ours_on_synthetic_data(env_id)
        step = learner.train_step
        k = step.updates_per_call
        perms = [rng.permutation(cfg.batch_size)[: cfg.minibatch_size] for _ in range(k)]
        idx = Tensor(np.stack(perms).astype(np.int32))
        fast = compat.CompiledCall(step)
        fast(*data, idx).asnumpy()  # compile this copy now, before the next one is built
        calls.append((lambda f=fast, d=data, i=idx: f(*d, i).asnumpy(), k))
    out = []
    for _ in range(rounds):
        t = seconds_per_call({"first": calls[0][0], "second": calls[1][0]}, repeats)
        out.append((t["first"] / calls[0][1] * 1e3, t["second"] / calls[1][1] * 1e3))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--env", default="CartPole-v1", help="whose train step the position-bias table builds")
    parser.add_argument("--repeats", type=int, default=100, help="calls per timing round")
    parser.add_argument("--rounds", type=int, default=4, help="position-bias rounds (each best of 5)")
    args = parser.parse_args()

    from msrl_consistency import compat

    compat.set_device("cpu")
    compat.set_threads(1)  # as the Trainer runs: one op thread, hence one actor thread
    compat.use_graph_mode()
    started = time.strftime("%Y-%m-%d %H:%M")
    chains = chain_costs(args.repeats)
    base = CHAIN_KERNELS[0]
    print(f"Dependent cheap kernels per graph ({started}, best of 5 rounds x {args.repeats} calls; "
          f"baseline: the {base}-kernel graph)\n")  # fmt: skip
    print("| kernels | ms per call | µs per kernel | µs per kernel vs baseline |\n|---:|---:|---:|---:|")
    for n, sec in chains.items():
        per = sec / n * 1e6
        print(f"| {n} | {sec * 1e3:.3f} | {per:.1f} | {per / (chains[base] / base * 1e6):.2f}x |")

    pairs = twin_steps(args.env, args.repeats, args.rounds)
    print(f"\nThe same {args.env} train step built twice in one process, ms per minibatch update "
          "(the ratio would be 1.00 without position bias)\n")  # fmt: skip
    print("| round | first-built | second-built | second / first |\n|---:|---:|---:|---:|")
    for r, (a, b) in enumerate(pairs, 1):
        print(f"| {r} | {a:.3f} | {b:.3f} | {b / a:.2f} |")
    ratios = [b / a for a, b in pairs]
    print(f"\nsecond / first: {min(ratios):.2f}-{max(ratios):.2f}, first faster in "
          f"{sum(r > 1 for r in ratios)}/{len(ratios)} rounds")  # fmt: skip


if __name__ == "__main__":
    main()
