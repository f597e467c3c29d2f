"""MLP trunks with orthogonal initialisation drawn from an explicit NumPy seed."""

from __future__ import annotations

import mindspore as ms
import numpy as np
from mindspore import Parameter, Tensor, nn, ops

from msrl_consistency.agent import lowered


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
        lower: str = "fp32",
        keep: tuple[int, ...] = (),
    ) -> None:
        """``lower``: the numerics the trunk computes in (``lowered.forward``); ``keep``: positions in ``layers``
        of the layers that stay fp32. An int8 trunk carries its activation ranges as a Parameter."""
        super().__init__()
        layers: list[nn.Cell] = []
        self.tanh = activation == "tanh"
        self.dense_index = tuple(range(0, 2 * len(hidden_sizes) + 1, 2))  # positions of the Dense layers
        width = in_dim
        for h in hidden_sizes:
            layers += [dense(rng, width, h, float(np.sqrt(2.0))), nn.Tanh() if activation == "tanh" else nn.ReLU()]
            width = h
        layers.append(dense(rng, width, out_dim, out_gain))
        self.layers = nn.SequentialCell(layers)
        self.lower, self.kept_index, self.lowered = lower, tuple(keep), lower != "fp32"
        # the Dense layers kept in fp32, by their order among the Dense layers (``lowered.activation_ranges``)
        self.kept_dense = tuple(k for k, i in enumerate(self.dense_index) if i in self.kept_index)
        if lower == "int8":  # [min, max] of the input, then of each Dense's and each activation's output
            init = np.tile(np.asarray([[-1.0, 1.0]], np.float32), (2 * len(hidden_sizes) + 2, 1))
            self.ranges = Parameter(Tensor(init), name="ranges", requires_grad=False)
            self.qparams = Parameter(Tensor(lowered.act_qparams(init)), name="qparams", requires_grad=False)

    def construct(self, x: Tensor) -> Tensor:
        if self.lowered:  # a Python constant: each setting compiles its own graph
            return lowered.forward(self, x)
        return self.layers(x)

    def forward_as(self, x: Tensor, dtype: ms.dtype) -> Tensor:
        """The same MLP computed in ``dtype`` (mixed-precision updates): the float32 weights are cast on the fly,
        so they stay the master copy and their gradients come back in float32."""
        h = x.astype(dtype)
        last = len(self.dense_index) - 1
        for k, i in enumerate(self.dense_index):
            layer = self.layers[i]
            h = ops.dense(h, layer.weight.astype(dtype), layer.bias.astype(dtype))
            if k < last:
                h = ops.tanh(h) if self.tanh else ops.relu(h)
        return h
