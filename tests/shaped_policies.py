"""Stand-ins of the shapes real policies have, written here from the shapes alone: the MindSpore RL library's SAC
actor (256-256, conditioned std, tanh squash) with a noise input, its Dueling DQN head (a mean with no axis), a
Dreamer-style ``FullyConnectedLayers`` (a SequentialCell of ``nn.Dense(..., activation=...)`` sharing one
activation), an LSTMCell policy carrying ``(h, c)``, a QMIX-style agent on ``nn.GRU``, and an Atari-style CNN on
84x84x4 uint8 frames with an env that draws them.

Each factory seeds MindSpore so that a Cell built twice has the same weights; tests copy this module next to their
bundles and pass ``shaped_policies:FACTORY`` to the CLIs, as a team passes its own module.
"""

from __future__ import annotations

import gymnasium as gym
import mindspore as ms
import numpy as np
from mindspore import Parameter, Tensor, nn, ops


def scaled(cell: nn.Cell, factor: float) -> nn.Cell:
    """``cell`` with every Parameter multiplied by ``factor``: weights of a trained net's magnitude (activations of
    several units, where float32 sums in another order differ by several ULP)."""
    for p in cell.get_parameters():
        p.set_data(Tensor(p.asnumpy() * np.float32(factor)))
    return cell


class SacActor256(nn.Cell):
    """The library's SAC actor shape: 256-256 ReLU, a mean head and a conditioned log-std head clipped to [-20, 2],
    then the sample ``tanh(mean + std * noise)`` scaled to Pendulum's [-2, 2] from the given standard-normal noise."""

    def __init__(self) -> None:
        super().__init__()
        self.model = nn.SequentialCell(nn.Dense(3, 256, weight_init="XavierUniform"), nn.ReLU(),
                                       nn.Dense(256, 256, weight_init="XavierUniform"), nn.ReLU())  # fmt: skip
        self.last_fc = nn.Dense(256, 1)
        self.last_fc_log_std = nn.Dense(256, 1, weight_init="XavierUniform")

    def construct(self, obs: Tensor, noise: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        h = self.model(obs)
        mean = self.last_fc(h)
        std = ops.exp(ops.clip(self.last_fc_log_std(h), -20.0, 2.0))
        return mean, std, ops.tanh(mean + std * noise) * 2.0


SAC256_CONTRACT = {
    "env_id": "Pendulum-v1",
    "input": {"obs": [3], "noise": [1], "noise_kind": "normal"},
    "outputs": {"names": ["mean", "std", "action"]},
    "action": {"kind": "gaussian", "mean": "mean", "std": "std", "action": "action", "squash": "tanh",
               "low": [-2.0], "high": [2.0]},
}  # fmt: skip


def make_sac256() -> SacActor256:
    """Weights three times their initial scale: a trained actor's magnitudes."""
    ms.set_seed(3)
    return scaled(SacActor256(), 3.0)


class DuelingQNet(nn.Cell):
    """The library's Dueling DQN head: ``v + (a - mean(a))`` with ``ReduceMean(keep_dims=True)`` and no axis, which
    averages over the batch too (each row's Q-values depend on the other rows)."""

    def __init__(self) -> None:
        super().__init__()
        self.v_model = nn.SequentialCell(nn.Dense(4, 32), nn.ReLU(), nn.Dense(32, 1))
        self.a_model = nn.SequentialCell(nn.Dense(4, 32), nn.ReLU(), nn.Dense(32, 2))
        self._mean = ops.ReduceMean(keep_dims=True)

    def construct(self, obs: Tensor) -> Tensor:
        v, a = self.v_model(obs), self.a_model(obs)
        return v + (a - self._mean(a))


DUELING_CONTRACT = {
    "env_id": "CartPole-v1",
    "input": {"obs": [4]},
    "outputs": {"names": ["q"]},
    "action": {"kind": "argmax", "values": "q"},
}


def make_dueling() -> DuelingQNet:
    ms.set_seed(41)
    return DuelingQNet()


class FullyConnectedLayers(nn.Cell):
    """Dreamer-style: a SequentialCell of ``nn.Dense(..., activation=act)`` sharing one activation Cell."""

    def __init__(self, sizes: tuple[int, ...], act: nn.Cell) -> None:
        super().__init__()
        pairs = zip(sizes[:-1], sizes[1:], strict=True)
        self.fc_layers = nn.SequentialCell([nn.Dense(i, o, activation=act) for i, o in pairs])

    def construct(self, x: Tensor) -> Tensor:
        return self.fc_layers(x)


class DreamerStyleActor(nn.Cell):
    """``FullyConnectedLayers`` inside an actor (ReLU here: Dreamer's ELU has no ONNX export in MindSpore), a Dense
    with an activation of its own, logits over 2."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = FullyConnectedLayers((4, 32, 32, 32), nn.ReLU())
        self.squeeze = nn.Dense(32, 16, activation="tanh")
        self.fc_out = nn.Dense(16, 2)

    def construct(self, obs: Tensor) -> Tensor:
        return self.fc_out(self.squeeze(self.fc(obs)))


DREAMER_CONTRACT = {
    "env_id": "CartPole-v1",
    "input": {"obs": [4]},
    "outputs": {"names": ["logits"]},
    "action": {"kind": "categorical", "logits": "logits"},
}


def make_dreamer_style() -> DreamerStyleActor:
    ms.set_seed(43)
    return DreamerStyleActor()


class LogStdActor(nn.Cell):
    """A Gaussian actor whose ``log_std`` is a Parameter of the actor itself (in no layer)."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.SequentialCell(nn.Dense(3, 32, activation="tanh"), nn.Dense(32, 1))
        self.log_std = Parameter(Tensor(np.full([1, 1], -0.5, np.float32)), name="log_std")

    def construct(self, obs: Tensor) -> tuple[Tensor, Tensor]:
        mean = self.body(obs)
        return mean, ops.broadcast_to(ops.exp(self.log_std), mean.shape)


LOG_STD_CONTRACT = {
    "env_id": "Pendulum-v1",
    "input": {"obs": [3]},
    "outputs": {"names": ["mean", "std"]},
    "action": {"kind": "gaussian", "mean": "mean", "std": "std", "squash": "clip", "low": [-2.0], "high": [2.0]},
}


def make_log_std_actor() -> LogStdActor:
    ms.set_seed(47)
    return LogStdActor()


class LstmPolicy(nn.Cell):
    """Dense + tanh, an ``nn.LSTMCell`` carrying ``(h, c)`` between steps, logits over 2."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Dense(4, 16)
        self.lstm = nn.LSTMCell(16, 16)
        self.head = nn.Dense(16, 2)

    def construct(self, obs: Tensor, h: Tensor, c: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        h2, c2 = self.lstm(ops.tanh(self.embed(obs)), (h, c))
        return self.head(h2), h2, c2


LSTM_CONTRACT = {
    "env_id": "CartPole-v1",
    "input": {"obs": [4]},
    "state": {"h": {"shape": [16], "next": "h_next", "init": "zeros"},
              "c": {"shape": [16], "next": "c_next", "init": "zeros"}},
    "outputs": {"names": ["logits", "h_next", "c_next"]},
    "action": {"kind": "categorical", "logits": "logits"},
}  # fmt: skip


def make_lstm() -> LstmPolicy:
    ms.set_seed(31)
    return LstmPolicy()


class GruAgent(nn.Cell):
    """A QMIX-style agent: Dense + ReLU, ``nn.GRU`` over one step (hidden ``[1, B, H]``), Q-values."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Dense(4, 16)
        self.gru = nn.GRU(16, 16, batch_first=False)
        self.fc2 = nn.Dense(16, 2)

    def construct(self, obs: Tensor, h: Tensor) -> tuple[Tensor, Tensor]:
        out, h2 = self.gru(ops.relu(self.fc1(obs)).expand_dims(0), h.expand_dims(0))
        return self.fc2(out.squeeze(0)), h2.squeeze(0)


GRU_CONTRACT = {
    "env_id": "CartPole-v1",
    "input": {"obs": [4]},
    "state": {"h": {"shape": [16], "next": "h_next", "init": "zeros"}},
    "outputs": {"names": ["q", "h_next"]},
    "action": {"kind": "argmax", "values": "q"},
}


def make_gru_agent() -> GruAgent:
    ms.set_seed(37)
    return GruAgent()


class AtariCNN(nn.Cell):
    """The classic Atari torso on 84x84x4 uint8 frames (``/255`` inside): conv 32 8x8/4, 64 4x4/2, 64 3x3/1,
    dense 512, logits over 6 actions."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(4, 32, 8, stride=4, pad_mode="valid", has_bias=True)
        self.conv2 = nn.Conv2d(32, 64, 4, stride=2, pad_mode="valid", has_bias=True)
        self.conv3 = nn.Conv2d(64, 64, 3, stride=1, pad_mode="valid", has_bias=True)
        self.fc = nn.Dense(64 * 7 * 7, 512)
        self.head = nn.Dense(512, 6)

    def construct(self, obs: Tensor) -> Tensor:
        x = ops.transpose(obs.astype(ms.float32) / 255.0, (0, 3, 1, 2))
        x = ops.relu(self.conv3(ops.relu(self.conv2(ops.relu(self.conv1(x))))))
        return self.head(ops.relu(self.fc(x.reshape(x.shape[0], -1))))


ATARI_CONTRACT = {
    "input": {"obs": [84, 84, 4], "dtype": "uint8"},
    "outputs": {"names": ["logits"]},
    "action": {"kind": "categorical", "logits": "logits"},
}


def make_atari_cnn() -> AtariCNN:
    ms.set_seed(53)
    return AtariCNN()


class FrameStackEnv(gym.Env):
    """Atari-shaped observations without the emulator: a paddle and a ball drawn on 84x84 frames, the last four
    stacked (uint8), 6 actions (move the paddle), deterministic under a seed; episodes end at ``horizon`` steps."""

    observation_space = gym.spaces.Box(0, 255, (84, 84, 4), np.uint8)
    action_space = gym.spaces.Discrete(6)

    def __init__(self, horizon: int = 200) -> None:
        self.horizon = horizon

    def _frame(self) -> np.ndarray:
        frame = np.zeros((84, 84), np.uint8)
        frame[80:82, max(0, self.paddle - 6) : self.paddle + 6] = 200
        y, x = int(self.ball[0]), int(self.ball[1])
        frame[max(0, y - 1) : y + 2, max(0, x - 1) : x + 2] = 255
        return frame

    def reset(self, *, seed=None, options=None):  # noqa: ANN001, ANN201
        super().reset(seed=seed)
        self.t, self.paddle = 0, 42
        self.ball = self.np_random.uniform(10, 70, 2)
        self.velocity = self.np_random.uniform(-2, 2, 2)
        self.stack = np.repeat(self._frame()[..., None], 4, axis=-1)
        return self.stack.copy(), {}

    def step(self, action):  # noqa: ANN001, ANN201
        self.t += 1
        self.paddle = int(np.clip(self.paddle + (int(action) - 2.5) * 2, 6, 78))
        self.ball = self.ball + self.velocity
        for k in range(2):
            if not 1 <= self.ball[k] <= 82:
                self.velocity[k] = -self.velocity[k]
                self.ball[k] = np.clip(self.ball[k], 1, 82)
        self.stack = np.concatenate([self.stack[..., 1:], self._frame()[..., None]], axis=-1)
        reward = float(abs(self.ball[1] - self.paddle) < 6)
        return self.stack.copy(), reward, False, self.t >= self.horizon, {}


def make_frame_env() -> FrameStackEnv:
    return FrameStackEnv()


class DictRobotPolicy(nn.Cell):
    """A robot arm's policy: 24 joint readings and a 64x64x3 uint8 wrist camera (a ``Dict`` observation), a small
    CNN on the camera, a Gaussian over 6 joint velocities with a state-independent std."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 16, 5, stride=2, pad_mode="valid", has_bias=True)
        self.conv2 = nn.Conv2d(16, 32, 5, stride=2, pad_mode="valid", has_bias=True)
        self.camera = nn.Dense(32 * 13 * 13, 128)
        self.joints = nn.Dense(24, 64)
        self.mu = nn.Dense(192, 6)
        self.log_std = Parameter(Tensor(np.full([1, 6], -0.7, np.float32)), name="log_std")

    def construct(self, joints: Tensor, camera: Tensor) -> tuple[Tensor, Tensor]:
        x = ops.transpose(camera.astype(ms.float32) / 255.0, (0, 3, 1, 2))
        x = ops.relu(self.conv2(ops.relu(self.conv1(x))))
        h = ops.concat((ops.relu(self.camera(x.reshape(x.shape[0], -1))), ops.tanh(self.joints(joints))), -1)
        mean = ops.tanh(self.mu(h))
        return mean, ops.broadcast_to(ops.exp(self.log_std), mean.shape)


DICT_ROBOT_CONTRACT = {
    "input": {"obs": {"joints": [24], "camera": {"shape": [64, 64, 3], "dtype": "uint8"}}},
    "outputs": {"names": ["mean", "std"]},
    "action": {"kind": "gaussian", "mean": "mean", "std": "std", "squash": "clip", "low": [-1.0] * 6,
               "high": [1.0] * 6},
}  # fmt: skip


def make_dict_robot() -> DictRobotPolicy:
    ms.set_seed(59)
    return DictRobotPolicy()


class RobotEnv(gym.Env):
    """Joint readings and a wrist camera seeing a target (a bright square) move as the joints do; deterministic under
    a seed; episodes end at ``horizon`` steps."""

    observation_space = gym.spaces.Dict({"joints": gym.spaces.Box(-np.pi, np.pi, (24,), np.float32),
                                         "camera": gym.spaces.Box(0, 255, (64, 64, 3), np.uint8)})  # fmt: skip
    action_space = gym.spaces.Box(-1.0, 1.0, (6,), np.float32)

    def __init__(self, horizon: int = 200) -> None:
        self.horizon = horizon

    def _observe(self) -> dict[str, np.ndarray]:
        camera = np.zeros((64, 64, 3), np.uint8)
        y, x = (np.clip(32 + 20 * np.sin(self.joints[:2]), 4, 59)).astype(int)
        camera[y - 4 : y + 4, x - 4 : x + 4] = (255, 160, 40)
        return {"joints": self.joints.astype(np.float32), "camera": camera}

    def reset(self, *, seed=None, options=None):  # noqa: ANN001, ANN201
        super().reset(seed=seed)
        self.t = 0
        self.joints = self.np_random.uniform(-1.0, 1.0, 24)
        return self._observe(), {}

    def step(self, action):  # noqa: ANN001, ANN201
        self.t += 1
        self.joints = np.clip(self.joints + 0.05 * np.resize(np.asarray(action, np.float64), 24), -np.pi, np.pi)
        reward = -float(np.abs(self.joints[:2]).sum())
        return self._observe(), reward, False, self.t >= self.horizon, {}


def make_robot_env() -> RobotEnv:
    return RobotEnv()
