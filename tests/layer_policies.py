"""Policy Cells built from the layers of modern policies (LayerNorm, attention with exact GELU and slicing, Embedding
for Discrete observations, a C51 head, tianshou's ``(logits, None)``, MAPPO's constant masks), with their contracts.

Each factory seeds MindSpore so that a Cell built twice has the same weights; tests pass ``layer_policies:FACTORY``
to the CLIs as a team passes its own module.
"""

from __future__ import annotations

import mindspore as ms
import numpy as np
from mindspore import Parameter, Tensor, nn, ops

CARTPOLE_LOGITS = {
    "env_id": "CartPole-v1",
    "input": {"obs": [4]},
    "outputs": {"names": ["logits"]},
    "action": {"kind": "categorical", "logits": "logits"},
}


class LayerNormPolicy(nn.Cell):
    """A CartPole MLP with one LayerNorm; ``gain`` scales the first layer (the LayerNorm's input) to large
    activations."""

    def __init__(self, gain: float = 1.0) -> None:
        super().__init__()
        self.fc1, self.ln, self.fc2 = nn.Dense(4, 64), nn.LayerNorm((64,)), nn.Dense(64, 2)
        if gain != 1.0:
            self.fc1.weight.set_data(self.fc1.weight * gain)

    def construct(self, obs: Tensor) -> Tensor:
        return self.fc2(ops.tanh(self.ln(self.fc1(obs))))


def make_layernorm() -> LayerNormPolicy:
    ms.set_seed(1)
    return LayerNormPolicy()


def make_layernorm_large() -> LayerNormPolicy:
    ms.set_seed(1)
    return LayerNormPolicy(gain=1000.0)


STEPS, FEATURES, WIDTH = 8, 4, 32
STACKED_CONTRACT = {**CARTPOLE_LOGITS, "input": {"obs": [STEPS, FEATURES]}}
del STACKED_CONTRACT["env_id"]


class AttentionPolicy(nn.Cell):
    """Self-attention over ``STEPS`` stacked observations, a LayerNorm, an exact-GELU feed-forward and the last
    step's features (``x[:, -1]``) to the logits."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Dense(FEATURES, WIDTH)
        self.q, self.k, self.v = nn.Dense(WIDTH, WIDTH), nn.Dense(WIDTH, WIDTH), nn.Dense(WIDTH, WIDTH)
        self.ln = nn.LayerNorm((WIDTH,))
        self.ff = nn.Dense(WIDTH, WIDTH)
        self.gelu = nn.GELU(approximate=False)
        self.head = nn.Dense(WIDTH, 2)

    def construct(self, obs: Tensor) -> Tensor:
        x = self.embed(obs)
        att = ops.softmax(ops.matmul(self.q(x), self.k(x).swapaxes(1, 2)) / float(np.sqrt(WIDTH)), axis=-1)
        x = self.ln(x + ops.matmul(att, self.v(x)))
        x = x + self.gelu(self.ff(x))
        return self.head(x[:, -1])


def make_attention() -> AttentionPolicy:
    ms.set_seed(3)
    return AttentionPolicy()


HEADS = 4


class MultiHeadAttentionPolicy(nn.Cell):
    """Multi-head self-attention: each projection reshaped to ``[b, t, heads, d]`` and transposed (the exporter merges
    the Dense's reshape with the heads' into one: no tensor of the graph has the projection's shape)."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Dense(FEATURES, WIDTH)
        self.q, self.k, self.v = nn.Dense(WIDTH, WIDTH), nn.Dense(WIDTH, WIDTH), nn.Dense(WIDTH, WIDTH)
        self.out, self.head = nn.Dense(WIDTH, WIDTH), nn.Dense(WIDTH, 2)

    def heads(self, x: Tensor) -> Tensor:
        return x.reshape(x.shape[0], x.shape[1], HEADS, WIDTH // HEADS).transpose(0, 2, 1, 3)

    def construct(self, obs: Tensor) -> Tensor:
        x = self.embed(obs)
        q, k, v = self.heads(self.q(x)), self.heads(self.k(x)), self.heads(self.v(x))
        att = ops.softmax(ops.matmul(q, k.swapaxes(2, 3)) / float(np.sqrt(WIDTH // HEADS)), axis=-1)
        y = ops.matmul(att, v).transpose(0, 2, 1, 3)
        x = x + self.out(y.reshape(y.shape[0], y.shape[1], WIDTH))
        return self.head(x[:, -1])


def make_multi_head() -> MultiHeadAttentionPolicy:
    ms.set_seed(3)
    return MultiHeadAttentionPolicy()


SLICES = ("last", "tail", "first", "prefix", "full_prefix")


class SlicePolicy(nn.Cell):
    """Stacked observations through a Dense, then one indexing form on the batch-dependent tensor ``[b, 8, 32]``:
    ``x[:, -1]``, ``x[:, 3:, :].reshape(b, d)``, ``x[:, 0]``, ``x[..., :k]`` with k below the width, and with k the
    full width (a slice that slices nothing)."""

    def __init__(self, form: str) -> None:
        super().__init__()
        self.embed, self.head = nn.Dense(FEATURES, WIDTH), nn.Dense(WIDTH, 2)
        self.form = form

    def construct(self, obs: Tensor) -> Tensor:
        x = ops.tanh(self.embed(obs))
        b = x.shape[0]
        if self.form == "last":
            h = x[:, -1]
        elif self.form == "tail":
            h = x[:, 3:, :].reshape(b, (STEPS - 3) * WIDTH)[:, -WIDTH:]
        elif self.form == "first":
            h = x[:, 0]
        elif self.form == "prefix":
            h = x[..., :5].reshape(b, -1)[:, :WIDTH]
        else:
            h = x[..., :WIDTH][:, 2]
        return self.head(h)


def make_slice(form: str) -> SlicePolicy:
    ms.set_seed(5)
    return SlicePolicy(form)


class BatchMeanPolicy(nn.Cell):
    """Advantages centred on their mean over every axis, batch included (MindSpore RL's Dueling DQN does this):
    ``ReduceMean(keep_dims=True)`` without an axis."""

    def __init__(self) -> None:
        super().__init__()
        self.fc, self.mean = nn.Dense(4, 2), ops.ReduceMean(keep_dims=True)

    def construct(self, obs: Tensor) -> Tensor:
        advantage = self.fc(obs)
        return advantage - self.mean(advantage)


def make_batch_mean() -> BatchMeanPolicy:
    ms.set_seed(9)
    return BatchMeanPolicy()


class EluPolicy(nn.Cell):
    """ELU layers as Dreamer's actor has them: ``nn.Dense(..., activation=nn.ELU())`` and a bare ``nn.ELU``, twice in
    a row and under a scalar multiple (a ``Mul`` by a constant the exporter would fold a marker into)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.elu, self.fc2 = nn.Dense(4, 32, activation=nn.ELU()), nn.ELU(), nn.Dense(32, 2)

    def construct(self, obs: Tensor) -> Tensor:
        return self.fc2(self.elu(self.fc1(obs)) * 2.0)


def make_elu() -> EluPolicy:
    ms.set_seed(10)
    return EluPolicy()


class ErfPrimitivePolicy(nn.Cell):
    """Exact GELU written with an ``ops.Erf()`` primitive made in ``__init__``: the one form export cannot rewrite."""

    def __init__(self) -> None:
        super().__init__()
        self.fc, self.erf = nn.Dense(4, 2), ops.Erf()

    def construct(self, obs: Tensor) -> Tensor:
        x = self.fc(obs)
        return x * 0.5 * (1.0 + self.erf(x / 1.4142135))


class NegativeSplitPolicy(nn.Cell):
    """``P.Split(-1, 2)``, as Dreamer's actor splits mean and std: the ONNX exporter refuses the negative axis, which
    export counts from the front."""

    def __init__(self) -> None:
        super().__init__()
        self.fc, self.split = nn.Dense(4, 4), ops.Split(-1, 2)

    def construct(self, obs: Tensor) -> Tensor:
        a, b = self.split(self.fc(obs))
        return a * b


class LogStdActor(nn.Cell):
    """A Gaussian actor returning its state-independent Parameter ``log_std`` as the output named ``log_std``."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Dense(3, 1)
        self.log_std = Parameter(Tensor(np.full([1], -0.5, np.float32)), name="log_std")

    def construct(self, obs: Tensor) -> tuple[Tensor, Tensor]:
        return self.fc(obs), self.log_std


LOG_STD_CONTRACT = {
    "env_id": "Pendulum-v1",
    "input": {"obs": [3]},
    "outputs": {"names": ["mean", "log_std"]},
    "action": {"kind": "gaussian", "mean": "mean", "log_std": "log_std", "squash": "clip", "low": [-2.0],
               "high": [2.0]},
}  # fmt: skip


def make_log_std() -> LogStdActor:
    ms.set_seed(7)
    return LogStdActor()


class EmbeddingPolicy(nn.Cell):
    """A Discrete(N) observation through ``nn.Embedding`` (a tabular env: FrozenLake, Taxi)."""

    def __init__(self, n: int, actions: int) -> None:
        super().__init__()
        self.emb, self.fc, self.head = nn.Embedding(n, 16), nn.Dense(16, 32), nn.Dense(32, actions)

    def construct(self, obs: Tensor) -> Tensor:
        return self.head(ops.relu(self.fc(self.emb(obs))))


def make_frozenlake() -> EmbeddingPolicy:
    ms.set_seed(2)
    return EmbeddingPolicy(16, 4)


def make_taxi() -> EmbeddingPolicy:
    ms.set_seed(2)
    return EmbeddingPolicy(500, 6)


FROZENLAKE_CONTRACT = {
    "env_id": "FrozenLake-v1",
    "input": {"discrete": 16},
    "outputs": {"names": ["logits"]},
    "action": {"kind": "categorical", "logits": "logits"},
}
TAXI_CONTRACT = {
    "env_id": "Taxi-v3",
    "input": {"discrete": 500},
    "outputs": {"names": ["q"]},
    "action": {"kind": "argmax", "values": "q"},
}


class C51Net(nn.Cell):
    """A C51 head: ``[batch, 2 actions, 51 atoms]`` probabilities."""

    def __init__(self) -> None:
        super().__init__()
        self.fc, self.out, self.softmax = nn.Dense(4, 64), nn.Dense(64, 2 * 51), nn.Softmax()

    def construct(self, obs: Tensor) -> Tensor:
        return self.softmax(self.out(ops.relu(self.fc(obs))).reshape(-1, 2, 51))


C51_CONTRACT = {
    "env_id": "CartPole-v1",
    "input": {"obs": [4]},
    "outputs": {"names": ["dist"]},
    "action": {"kind": "distributional", "values": "dist", "atoms": 51, "support": [-10.0, 10.0]},
}


def make_c51() -> C51Net:
    ms.set_seed(4)
    return C51Net()


class NoStatePolicy(nn.Cell):
    """tianshou's convention: ``(logits, state)`` with ``None`` for a policy without state."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Dense(4, 16), nn.Dense(16, 2)

    def construct(self, obs: Tensor) -> tuple[Tensor, None]:
        return self.fc2(ops.tanh(self.fc1(obs))), None


def make_no_state() -> NoStatePolicy:
    ms.set_seed(5)
    return NoStatePolicy()


class MaskedPolicy(nn.Cell):
    """MAPPO-style: ``construct(obs, masks)``, masks of ones at acting time."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Dense(4, 16), nn.Dense(16, 2)

    def construct(self, obs: Tensor, masks: Tensor) -> Tensor:
        return self.fc2(ops.tanh(self.fc1(obs)) * masks)


MASKED_CONTRACT = {**CARTPOLE_LOGITS, "input": {"obs": [4], "masks": {"constant": 1.0, "shape": [1]}}}


def make_masked() -> MaskedPolicy:
    ms.set_seed(6)
    return MaskedPolicy()


# -- layers MindSpore's ONNX exporter stops at, which export writes as substitutes ------------------------------------
HIDDEN = 16
RECURRENT_CONTRACT = {
    "env_id": "CartPole-v1",
    "input": {"obs": [4]},
    "state": {"h": {"shape": [HIDDEN], "next": "h_next", "init": "zeros"}},
    "outputs": {"names": ["logits", "h_next"]},
    "action": {"kind": "categorical", "logits": "logits"},
}
LSTM_CONTRACT = {
    **RECURRENT_CONTRACT,
    "state": {"h": {"shape": [HIDDEN], "next": "h_next", "init": "zeros"},
              "c": {"shape": [HIDDEN], "next": "c_next", "init": "zeros"}},
    "outputs": {"names": ["logits", "h_next", "c_next"]},
}  # fmt: skip


class OneStepGRUPolicy(nn.Cell):
    """QMIX's agent layout: a Dense, ``nn.GRU`` over one time-major step from the carried state, a LayerNorm on the
    GRU's sequence output, logits. MindSpore's GRU loop has no ONNX export (``make_list``), and its sequence output
    keeps the first call's batch in a dynamic-batch MindIR."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Dense(4, HIDDEN, activation=nn.ReLU())
        self.rnn = nn.GRU(HIDDEN, HIDDEN)
        self.norm, self.head = nn.LayerNorm((HIDDEN,)), nn.Dense(HIDDEN, 2)

    def construct(self, obs: Tensor, h: Tensor) -> tuple[Tensor, Tensor]:
        out, h_n = self.rnn(self.fc(obs).expand_dims(0), h.expand_dims(0))
        return self.head(self.norm(out.squeeze(0))), h_n.squeeze(0)


class OneStepLSTMPolicy(nn.Cell):
    """An ``nn.LSTM`` over one batch-first step, carrying ``(h, c)``."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Dense(4, HIDDEN)
        self.rnn = nn.LSTM(HIDDEN, HIDDEN, batch_first=True)
        self.head = nn.Dense(HIDDEN, 2)

    def construct(self, obs: Tensor, h: Tensor, c: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        out, (h_n, c_n) = self.rnn(ops.tanh(self.fc(obs)).expand_dims(1), (h.expand_dims(0), c.expand_dims(0)))
        return self.head(out.squeeze(1)), h_n.squeeze(0), c_n.squeeze(0)


class GreedyQPolicy(nn.Cell):
    """A DQN that also returns its greedy action as int64 (MindSpore writes the Cast as int32 into an int64 output)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc, self.q = nn.Dense(4, 32), nn.Dense(32, 2)

    def construct(self, obs: Tensor) -> tuple[Tensor, Tensor]:
        q = self.q(ops.relu(self.fc(obs)))
        return q, ops.argmax(q, dim=1).astype(ms.int64)


GREEDY_CONTRACT = {"env_id": "CartPole-v1", "input": {"obs": [4]}, "outputs": {"names": ["q", "action"]},
                   "action": {"kind": "deterministic", "action": "action", "discrete": True}}  # fmt: skip


class AdaptivePoolQNet(nn.Cell):
    """An Atari-style Q-net on uint8 frames with ``nn.AdaptiveMaxPool2d`` (no ONNX export in MindSpore)."""

    def __init__(self, pooled: int = 5) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, pad_mode="valid", has_bias=True)
        self.pool = nn.AdaptiveMaxPool2d((pooled, pooled))
        self.q = nn.Dense(8 * pooled * pooled, 4)

    def construct(self, frame: Tensor) -> Tensor:
        x = ops.transpose(frame.astype(ms.float32) / 255.0, (0, 3, 1, 2))
        x = self.pool(ops.relu(self.conv(x)))
        return self.q(x.reshape(x.shape[0], -1))


FRAME_CONTRACT = {"input": {"obs": [12, 12, 3], "dtype": "uint8"}, "outputs": {"names": ["q"]},
                  "action": {"kind": "argmax", "values": "q"}}  # fmt: skip


def make_negative_split() -> NegativeSplitPolicy:
    ms.set_seed(5)
    return NegativeSplitPolicy()


def make_gru() -> OneStepGRUPolicy:
    ms.set_seed(5)
    return OneStepGRUPolicy()


def make_lstm() -> OneStepLSTMPolicy:
    ms.set_seed(5)
    return OneStepLSTMPolicy()


def make_greedy_q() -> GreedyQPolicy:
    ms.set_seed(5)
    return GreedyQPolicy()


def make_adaptive_pool(pooled: int = 5) -> AdaptivePoolQNet:
    ms.set_seed(5)
    return AdaptivePoolQNet(pooled)


class ExpandedLayerNormPolicy(nn.Cell):
    """QMIX's agent on one step: the observation given a leading time axis (``expand_dims(0)``), a LayerNorm over
    ``[1, batch, n]``, a Dense, the axis squeezed again. Lite 2.0.0 resizing this graph after a Predict corrupted its
    heap ("double free" at the next batch)."""

    def __init__(self) -> None:
        super().__init__()
        self.norm, self.fc, self.head = nn.LayerNorm((4,)), nn.Dense(4, 16, activation=nn.ReLU()), nn.Dense(16, 2)

    def construct(self, obs: Tensor) -> Tensor:
        return self.head(self.fc(self.norm(obs.expand_dims(0))).squeeze(0))


def make_expanded_layernorm() -> ExpandedLayerNormPolicy:
    ms.set_seed(5)
    return ExpandedLayerNormPolicy()


class HalfSplitActor(nn.Cell):
    """Dreamer's action decoder when not training: ``P.Split(-1, 2)`` of a wide head, the mean half kept (Lite 2.0.0
    crashed at batches of 256 and more on a Split whose other half nothing reads)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc, self.out, self.split = nn.Dense(3, 400, activation=nn.ELU()), nn.Dense(400, 12), ops.Split(-1, 2)

    def construct(self, obs: Tensor) -> Tensor:
        mean, _ = self.split(self.out(self.fc(obs)))
        return ops.tanh(mean / 5.0) * 5.0


HALF_SPLIT_CONTRACT = {"input": {"obs": [3]}, "outputs": {"names": ["action"]},
                       "action": {"kind": "deterministic", "action": "action"}}  # fmt: skip


def make_half_split() -> HalfSplitActor:
    ms.set_seed(5)
    return HalfSplitActor()
