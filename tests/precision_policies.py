"""A policy that fp16 breaks in one layer: its LayerNorm sees values whose squares overflow fp16 (|x| > 256).

``fc1`` computes O(0.1-1) features, scaled by 1000 before ``norm`` (a LayerNorm): fine in fp16 (|x| < 65504), but
the variance sums their squares (~1e5-1e6 each), which overflows fp16 to inf; every other layer is harmless in
fp16. Tests copy this module next to their bundles and pass ``precision_policies:make_layernorm`` as a team passes
its own.
"""

from __future__ import annotations

import mindspore as ms
from mindspore import Tensor, nn, ops


class LayerNormPolicy(nn.Cell):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Dense(4, 32)
        self.norm = nn.LayerNorm((32,))
        self.fc2 = nn.Dense(32, 2)

    def construct(self, obs: Tensor) -> Tensor:
        return self.fc2(ops.tanh(self.norm(self.fc1(obs) * 1000.0)))


def make_layernorm() -> LayerNormPolicy:
    """No biases: the features scale with the observation (the LayerNorm makes the action depend on its direction),
    and the action follows the normalised features alone; where fp16 turns them into nothing, the logits tie."""
    ms.set_seed(0)
    policy = LayerNormPolicy()
    for dense in (policy.fc1, policy.fc2):
        dense.bias.set_data(ops.zeros_like(dense.bias))
    return policy


LAYERNORM_CONTRACT = {
    "env_id": "CartPole-v1",
    "input": {"obs": [4]},
    "outputs": {"names": ["logits"]},
    "action": {"kind": "categorical", "logits": "logits"},
}


# -- a parameter-free sub-Cell fp16 overflows, on a Gaussian head with a state-independent std -----------------------
class UnitNorm(nn.Cell):
    """``x / sqrt(sum x^2)``: parameter-free; the sum of squares of raw readings overflows fp16 (> 65504)."""

    def construct(self, x: Tensor) -> Tensor:
        return x / ops.sqrt((x * x).sum(-1, keepdims=True))


class SensorPolicy(nn.Cell):
    """Pendulum's readings scaled to raw sensor units (x300: sums of squares ~1e5-6e6), unit-normed, then a Dense
    and tanh to the mean; the std is one Parameter (shape [1], the same for every state)."""

    def __init__(self) -> None:
        super().__init__()
        self.unitnorm = UnitNorm()
        self.fc = nn.Dense(3, 1)
        self.log_std = ms.Parameter(Tensor([-0.5], ms.float32), name="log_std")

    def construct(self, obs: Tensor) -> tuple[Tensor, Tensor]:
        return ops.tanh(self.fc(self.unitnorm(obs * 300.0))) * 2.0, ops.exp(self.log_std)


def make_sensor() -> SensorPolicy:
    ms.set_seed(0)
    return SensorPolicy()


SENSOR_CONTRACT = {
    "env_id": "Pendulum-v1",
    "input": {"obs": [3]},
    "outputs": {"names": ["mean", "std"]},
    "action": {"kind": "gaussian", "mean": "mean", "std": "std", "squash": "clip", "low": [-2.0], "high": [2.0]},
}


# -- nothing to lower: a policy without a layer whose weights int8 quantizes -------------------------------------------
class NoDense(nn.Cell):
    """CartPole's pole angle and angular velocity as the two logits: no weights at all."""

    def construct(self, obs: Tensor) -> Tensor:
        return ops.tanh(obs[:, 2:4] * 3.0)


def make_no_dense() -> NoDense:
    return NoDense()
