"""MLP trunks with orthogonal initialisation drawn from an explicit NumPy seed."""

from __future__ import annotations

import numpy as np
from mindspore import Tensor, nn


def orthogonal(rng: np.random.Generator, rows: int, cols: int, gain: float) -> np.ndarray:
    """Orthogonal matrix (rows x cols) scaled by ``gain``, as in CleanRL's ``layer_init``."""
    a = rng.standard_normal((max(rows, cols), min(rows, cols)))
    q, r = np.linalg.qr(a)
    q = q * np.sign(np.diag(r))
    if rows < cols:
        q = q.T
    return (gain * q[:rows, :cols]).astype(np.float32)


def dense(rng: np.random.Generator, fan_in: int, fan_out: int, gain: float) -> nn.Dense:
    weight = Tensor(orthogonal(rng, fan_out, fan_in, gain))
    return nn.Dense(fan_in, fan_out, weight_init=weight, bias_init="zeros")


class MLP(nn.Cell):
    """``hidden_sizes`` layers with an activation, then a linear output layer with its own gain."""

    def __init__(
        self,
        rng: np.random.Generator,
        in_dim: int,
        hidden_sizes: list[int],
        out_dim: int,
        activation: str = "tanh",
        out_gain: float = 1.0,
    ) -> None:
        super().__init__()
        layers: list[nn.Cell] = []
        width = in_dim
        for h in hidden_sizes:
            layers += [dense(rng, width, h, float(np.sqrt(2.0))), nn.Tanh() if activation == "tanh" else nn.ReLU()]
            width = h
        layers.append(dense(rng, width, out_dim, out_gain))
        self.layers = nn.SequentialCell(layers)

    def construct(self, x: Tensor) -> Tensor:
        return self.layers(x)
