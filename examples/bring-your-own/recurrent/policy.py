"""A recurrent CartPole policy: a GRU cell carries a hidden state from step to step (what partial observability
asks for), and the logits come from that state. The state is an input and an output of the graph, so every
runtime is fed its own previous state, as on a device."""

from __future__ import annotations

from pathlib import Path

import mindspore as ms
from mindspore import Tensor, nn

HERE = Path(__file__).resolve().parent
HIDDEN = 16


class GRUPolicy(nn.Cell):
    """(obs [batch, 4], h [batch, 16]) -> (logits [batch, 2], h_next [batch, 16])."""

    def __init__(self) -> None:
        super().__init__()
        self.gru = nn.GRUCell(4, HIDDEN)
        self.head = nn.Dense(HIDDEN, 2)

    def construct(self, obs: Tensor, h: Tensor) -> tuple[Tensor, Tensor]:
        h_next = self.gru(obs, h)
        return self.head(h_next), h_next


class StuckStatePolicy(GRUPolicy):
    """A deployment fault: the graph returns the state it was given as ``h_next``, so the state never advances."""

    def construct(self, obs: Tensor, h: Tensor) -> tuple[Tensor, Tensor]:
        return self.head(self.gru(obs, h)), h


def make_policy() -> GRUPolicy:
    ms.set_seed(0)
    return GRUPolicy()


def make_stuck_policy() -> StuckStatePolicy:
    ms.set_seed(0)
    return StuckStatePolicy()
