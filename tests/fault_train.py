"""The training CLI with a fault injected, for tests only: like the Lite runner's ``-test`` binary, the shipped
command has no fault hook at all, and this program is that command plus one.

    MSRL_TRAIN_FAULT=kill:RANK:DONE python tests/fault_train.py ARGS...

``kill:RANK:DONE`` makes that rank kill itself with SIGKILL once DONE iterations are done, as the next one starts
(a real ``kill -9``, at a reproducible point); ``perturb:RANK:DONE`` nudges one weight on that rank there, as silent
corruption would. ``ARGS`` are ``python -m msrl_consistency.train``'s; with ``--workers N`` every rank runs this
program too, so the fault reaches the rank it names.
"""

from __future__ import annotations

import os
import signal
from dataclasses import dataclass
from pathlib import Path

import numpy as np

FAULT_ENV = "MSRL_TRAIN_FAULT"


@dataclass(frozen=True)
class Fault:
    kind: str  # "kill" (SIGKILL itself) or "perturb" (nudge one weight)
    rank: int
    iteration: int

    @classmethod
    def parse(cls, spec: str) -> Fault:
        kind, rank, iteration = spec.split(":")
        if kind not in ("kill", "perturb"):
            raise ValueError(f"{FAULT_ENV}: unknown fault kind {kind!r}")
        return cls(kind, int(rank), int(iteration))

    def __call__(self, trainer) -> None:  # noqa: ANN001 - a Trainer (``on_iteration``)
        if trainer.rank != self.rank or trainer.iteration != self.iteration:
            return
        if self.kind == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        from mindspore import Tensor

        weight = trainer.policy.actor.layers[0].weight
        weight.set_data(Tensor(weight.asnumpy() + np.float32(1e-3)))


def main() -> None:
    import msrl_consistency.train as train
    from inference.errors import run_cli

    spec = os.environ.get(FAULT_ENV)
    fault = Fault.parse(spec) if spec else None
    run_cli(lambda argv: train.main(argv, on_iteration=fault, rank_command=[str(Path(__file__).resolve())]))


if __name__ == "__main__":
    main()
