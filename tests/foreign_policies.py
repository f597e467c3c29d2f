"""Policy Cells written the way other teams write them (not our trainer's), with their contracts.

Each factory seeds MindSpore so that a Cell built twice has the same weights; tests copy this module next to their
bundles and pass ``foreign_policies:FACTORY`` to the CLIs, as a team passes its own module.
"""

from __future__ import annotations

import mindspore as ms
import numpy as np
from mindspore import Parameter, Tensor, nn, ops


class SacActor(nn.Cell):
    """SAC-style: state-dependent std, sampling inside from given standard-normal noise, tanh squash to [-2, 2]."""

    def __init__(self, squash: bool = True) -> None:
        super().__init__()
        self.body = nn.SequentialCell(nn.Dense(3, 32), nn.ReLU(), nn.Dense(32, 32), nn.ReLU())
        self.mu = nn.Dense(32, 1)
        self.log_std = nn.Dense(32, 1)
        self.squash = squash

    def construct(self, obs: Tensor, noise: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        h = self.body(obs)
        mean = self.mu(h)
        std = ops.exp(ops.clip(self.log_std(h), -5.0, 2.0))
        raw = mean + std * noise
        return mean, std, (ops.tanh(raw) * 2.0 if self.squash else raw)


SAC_CONTRACT = {
    "env_id": "Pendulum-v1",
    "input": {"obs": [3], "noise": [1], "noise_kind": "normal"},
    "outputs": {"names": ["mean", "std", "action"]},
    "action": {"kind": "gaussian", "mean": "mean", "std": "std", "action": "action", "squash": "tanh",
               "low": [-2.0], "high": [2.0]},
}  # fmt: skip


class GumbelCNN(nn.Cell):
    """Categorical over 4 actions from float32 (8, 8, 3) frames (``/255`` inside), Gumbel-max sampling from given
    uniform noise; its flatten takes the batch from the input's shape."""

    def __init__(self, scale_inside: bool = True) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, pad_mode="valid", has_bias=True)
        self.conv2 = nn.Conv2d(8, 8, 3, stride=2, pad_mode="valid", has_bias=True)
        self.fc = nn.Dense(8 * 2 * 2, 4)
        self.scale = 1.0 / 255.0 if scale_inside else 1.0

    def logits(self, obs: Tensor) -> Tensor:
        x = ops.relu(self.conv1(ops.transpose(obs, (0, 3, 1, 2)) * self.scale))
        x = ops.relu(self.conv2(x))
        return self.fc(x.reshape(x.shape[0], -1))

    def construct(self, obs: Tensor, noise: Tensor) -> tuple[Tensor, Tensor]:
        logits = self.logits(obs)
        u = ops.clamp(noise, 1e-6, 1.0 - 1e-6)
        return logits, ops.argmax(logits - ops.log(-ops.log(u)), dim=-1).astype(ms.int32)


GUMBEL_CNN_CONTRACT = {
    "input": {"obs": [8, 8, 3], "noise": [4], "noise_kind": "uniform"},
    "outputs": {"names": ["logits", "action"]},
    "action": {"kind": "categorical", "logits": "logits", "action": "action"},
}


class FrameCNN(GumbelCNN):
    """The same network, deterministic (logits only): the frame policy of the ``/255`` diagnosis."""

    def construct(self, obs: Tensor) -> Tensor:
        return self.logits(obs)


FRAME_CONTRACT = {
    "input": {"obs": [8, 8, 3]},
    "outputs": {"names": ["logits"]},
    "action": {"kind": "categorical", "logits": "logits"},
}


class OldStyleActor(nn.Cell):
    """An older MindSpore RL style actor: primitives made in ``__init__``, ``sigma`` from ``ZerosLike(mean)`` plus a
    bias through softplus, then ``reshape(sigma, mean.shape)``: shapes the ONNX exporter folds at the export batch."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Dense(3, 32), nn.Dense(32, 1)
        self.tanh = nn.Tanh()
        self.zeros_like, self.bias_add, self.softplus = ops.ZerosLike(), ops.BiasAdd(), ops.Softplus()
        self.sigma_bias = Parameter(Tensor(np.full([1], -0.5, np.float32)), name="sigma_bias")

    def construct(self, obs: Tensor) -> tuple[Tensor, Tensor]:
        mean = self.tanh(self.fc2(self.tanh(self.fc1(obs))))
        sigma = self.softplus(self.bias_add(self.zeros_like(mean), self.sigma_bias))
        return mean, ops.reshape(sigma, mean.shape)


OLD_STYLE_CONTRACT = {
    "env_id": "Pendulum-v1",
    "input": {"obs": [3]},
    "outputs": {"names": ["mean", "std"]},
    "action": {"kind": "gaussian", "mean": "mean", "std": "std", "squash": "clip", "low": [-2.0], "high": [2.0]},
}


class BatchNormPolicy(nn.Cell):
    """An MLP with BatchNorm1d and Dropout (CartPole logits)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.bn, self.drop, self.fc2 = nn.Dense(4, 32), nn.BatchNorm1d(32), nn.Dropout(p=0.2), nn.Dense(32, 2)

    def construct(self, obs: Tensor) -> Tensor:
        return self.fc2(self.drop(ops.relu(self.bn(self.fc1(obs)))))


BATCHNORM_CONTRACT = {
    "env_id": "CartPole-v1",
    "input": {"obs": [4]},
    "outputs": {"names": ["logits"]},
    "action": {"kind": "categorical", "logits": "logits"},
}


def make_sac() -> SacActor:
    ms.set_seed(3)
    return SacActor()


def make_sac_unsquashed() -> SacActor:
    ms.set_seed(3)
    return SacActor(squash=False)


def make_gumbel_cnn() -> GumbelCNN:
    ms.set_seed(7)
    return GumbelCNN()


def make_frame_cnn() -> FrameCNN:
    ms.set_seed(7)
    return FrameCNN()


def make_frame_cnn_unscaled() -> FrameCNN:
    ms.set_seed(7)
    return FrameCNN(scale_inside=False)


def make_old_style() -> OldStyleActor:
    ms.set_seed(11)
    return OldStyleActor()


def make_batchnorm() -> BatchNormPolicy:
    """Seeded weights and non-trivial BatchNorm statistics (a few training-mode batches), in eval mode."""
    ms.set_seed(5)
    net = BatchNormPolicy()
    net.set_train(True)
    rng = np.random.default_rng(0)
    for _ in range(5):
        net(Tensor(rng.normal(0.5, 2.0, (64, 4)).astype(np.float32)))
    net.set_train(False)
    return net


def nudge(cell: nn.Cell, name: str, delta: float) -> nn.Cell:
    """``cell`` with the first element of Parameter ``name`` moved by ``delta`` (a fault at a known place)."""
    param = dict(cell.parameters_and_names())[name]
    value = param.asnumpy().copy()
    value.flat[0] += delta
    param.set_data(Tensor(value))
    return cell


class RowIndexPolicy(nn.Cell):
    """Logits plus a thousandth of each row's index in its batch: a constant that depends on the batch and differs
    row by row, which no symbolic rewrite of the ONNX export can express (its ONNX and .ms cannot be produced)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Dense(4, 2)

    def construct(self, obs: Tensor) -> Tensor:
        return self.fc(obs) + 1e-3 * ops.arange(0, obs.shape[0], dtype=ms.float32).reshape(-1, 1)


def make_row_index() -> RowIndexPolicy:
    ms.set_seed(1)
    return RowIndexPolicy()


class BroadcastStdActor(nn.Cell):
    """SAC-style with a state-independent std: ``broadcast_to(exp(log_std), mean.shape)``."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Dense(3, 32), nn.Dense(32, 1)
        self.log_std = Parameter(Tensor(np.full([1], -0.3, np.float32)), name="log_std")

    def construct(self, obs: Tensor) -> tuple[Tensor, Tensor]:
        mean = self.fc2(ops.relu(self.fc1(obs)))
        return mean, ops.broadcast_to(ops.exp(self.log_std), mean.shape)


class LeakyActorCritic(nn.Cell):
    """An actor-critic with LeakyReLU (exported to ONNX by MindSpore as Mul + Max): logits and a value."""

    def __init__(self) -> None:
        super().__init__()
        self.actor = nn.SequentialCell(nn.Dense(4, 32), nn.LeakyReLU(0.2), nn.Dense(32, 2))
        self.critic = nn.SequentialCell(nn.Dense(4, 32), nn.LeakyReLU(0.2), nn.Dense(32, 1))

    def construct(self, obs: Tensor) -> tuple[Tensor, Tensor]:
        return self.actor(obs), self.critic(obs).squeeze(-1)


class ProbsActor(nn.Cell):
    """An actor that returns probabilities (softmax inside), as the MindSpore RL library's AC actor does."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.SequentialCell(nn.Dense(4, 32), nn.LeakyReLU(0.2), nn.Dense(32, 2))
        self.softmax = nn.Softmax()

    def construct(self, obs: Tensor) -> Tensor:
        return self.softmax(self.body(obs))


BROADCAST_STD_CONTRACT = {**OLD_STYLE_CONTRACT}
LEAKY_AC_CONTRACT = {
    "env_id": "CartPole-v1",
    "input": {"obs": [4]},
    "outputs": {"names": ["logits", "value"], "value": "value"},
    "action": {"kind": "categorical", "logits": "logits"},
}
PROBS_CONTRACT = {
    "env_id": "CartPole-v1",
    "input": {"obs": [4]},
    "outputs": {"names": ["probs"]},
    "action": {"kind": "categorical", "probs": "probs"},
}


def make_broadcast_std() -> BroadcastStdActor:
    ms.set_seed(13)
    return BroadcastStdActor()


def make_leaky_actor_critic() -> LeakyActorCritic:
    ms.set_seed(17)
    return LeakyActorCritic()


def make_probs_actor() -> ProbsActor:
    ms.set_seed(19)
    return ProbsActor()


class TwoHeadPolicy(nn.Cell):
    """Two categorical heads on a shared body: a direction (2) and a strength (3), for a ``MultiDiscrete`` action."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.SequentialCell(nn.Dense(4, 32), nn.Tanh())
        self.direction, self.strength = nn.Dense(32, 2), nn.Dense(32, 3)

    def construct(self, obs: Tensor) -> tuple[Tensor, Tensor]:
        h = self.body(obs)
        return self.direction(h), self.strength(h)


class DictPolicy(nn.Cell):
    """A vector and a uint8 frame (a ``Dict`` observation), one input each; logits over 2 actions."""

    def __init__(self) -> None:
        super().__init__()
        self.vec = nn.Dense(4, 16)
        self.conv = nn.Conv2d(3, 4, 3, stride=2, pad_mode="valid", has_bias=True)
        self.head = nn.Dense(16 + 4 * 3 * 3, 2)

    def construct(self, vec: Tensor, img: Tensor) -> Tensor:
        x = ops.relu(self.conv(ops.transpose(img.astype(ms.float32) / 255.0, (0, 3, 1, 2))))
        return self.head(ops.concat((ops.tanh(self.vec(vec)), x.reshape(x.shape[0], -1)), -1))


TWO_HEAD_CONTRACT = {
    "input": {"obs": [4]},
    "outputs": {"names": ["direction", "strength"]},
    "action": {"kind": "categorical", "logits": ["direction", "strength"]},
}
DICT_CONTRACT = {
    "input": {"obs": {"vec": [4], "img": {"shape": [8, 8, 3], "dtype": "uint8"}}},
    "outputs": {"names": ["logits"]},
    "action": {"kind": "categorical", "logits": "logits"},
}


def make_two_head() -> TwoHeadPolicy:
    ms.set_seed(23)
    return TwoHeadPolicy()


def make_dict_policy() -> DictPolicy:
    ms.set_seed(29)
    return DictPolicy()
