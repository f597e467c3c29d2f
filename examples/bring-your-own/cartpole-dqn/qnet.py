"""A team's own DQN Q-network for CartPole: observations in, one Q-value per action out; the action is argmax."""

from __future__ import annotations

from mindspore import Tensor, nn


class QNet(nn.Cell):
    def __init__(self, obs_dim: int = 4, n_actions: int = 2, hidden: int = 64) -> None:
        super().__init__()
        self.body = nn.SequentialCell(
            nn.Dense(obs_dim, hidden), nn.ReLU(), nn.Dense(hidden, hidden), nn.ReLU(), nn.Dense(hidden, n_actions)
        )

    def construct(self, x: Tensor) -> Tensor:
        return self.body(x)


def make_qnet() -> QNet:
    return QNet()
