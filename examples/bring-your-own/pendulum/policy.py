"""A team's own Pendulum policy, written the way MindSpore RL guides write it: a Dense trunk returning
``(mean, std)`` with a state-independent ``log_std`` Parameter. Nothing here knows about msrl-consistency
except ``make_policy``, which wraps the net for export (see ``README.md``)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from mindspore import Parameter, Tensor, nn, ops

HERE = Path(__file__).resolve().parent


class PolicyNet(nn.Cell):
    def __init__(self, obs_dim: int = 3, act_dim: int = 1, hidden: int = 64) -> None:
        super().__init__()
        self.fc1 = nn.Dense(obs_dim, hidden)
        self.fc2 = nn.Dense(hidden, hidden)
        self.mean_layer = nn.Dense(hidden, act_dim)
        self.log_std = Parameter(Tensor(np.full(act_dim, -0.5, np.float32)), name="log_std")
        self.relu = nn.ReLU()

    def construct(self, x: Tensor) -> tuple[Tensor, Tensor]:
        h = self.relu(self.fc1(x))
        h = self.relu(self.fc2(h))
        mean = self.mean_layer(h)
        std = ops.exp(self.log_std)
        return mean, std


def obs_stats(path: Path = HERE / "obs_stats.npz") -> tuple[np.ndarray, np.ndarray]:
    """The observation statistics the team's training normalises with on the host (written by train.py)."""
    with np.load(path) as data:
        return data["mean"], data["var"]


def make_net() -> PolicyNet:
    """The bare net: what the team trains and checkpoints."""
    return PolicyNet()


def make_policy() -> nn.Cell:
    """The training path: host-side normalisation moved into the graph around the net (export-safe)."""
    from msrl_consistency.agent.export_safe import NormalizeObservation

    mean, var = obs_stats()
    return NormalizeObservation(PolicyNet(), mean, var, clip=10.0)
