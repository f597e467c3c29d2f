"""ActorCritic and the Cells that are compiled or exported from it.

One policy, several heads, all sharing the same pre/post-processing:

* ``trunks``: the actor's output (logits or mean) and the value for the PPO loss (normalised obs);
* ``RolloutPolicy``: (obs, noise) → one packed tensor for the training hot loop;
* ``StochasticPolicy``: (obs, noise) → (env action, log-prob, value, logits | mean): the exported sampling graph;
* ``DeterministicPolicy``: obs → (env action, logits or mean): the exported deterministic graph.
"""

from __future__ import annotations

import mindspore as ms
import numpy as np
from mindspore import Parameter, Tensor, nn, ops

from msrl_consistency.agent import distributions as D
from msrl_consistency.agent.networks import MLP
from msrl_consistency.agent.preprocess import ActionPostprocess, ObsNormalizer
from msrl_consistency.agent.spec import PolicySpec

CALIBRATION_ROWS = 200  # within the 100-500 Lite's converter recommends


class ActorCritic(nn.Cell):
    """Separate actor and critic MLPs on normalised observations; Categorical or diagonal Gaussian head."""

    def __init__(self, spec: PolicySpec, seed: int = 0) -> None:
        super().__init__()
        rng = np.random.default_rng(seed)
        self.spec = spec
        self.discrete = spec.discrete
        self.action_dim = spec.action_dim
        self.normalizer = ObsNormalizer(spec.obs_dim, spec.clip_obs, spec.normalize_obs)
        keep = tuple(int(name.rpartition(".")[2]) for name in spec.keep)  # "actor.layers.K" (checked by the config)
        self.actor = MLP(rng, spec.obs_dim, spec.hidden_sizes, spec.action_dim, spec.activation, out_gain=0.01,
                         lower=spec.lower, keep=keep)  # fmt: skip
        if spec.lower == "int8":  # the observations the actor's int8 ranges come from: export calibrates Lite on them
            rows = np.zeros((CALIBRATION_ROWS, spec.obs_dim), np.float32)
            self.calibration = Parameter(Tensor(rows), name="calibration", requires_grad=False)
        self.critic = MLP(rng, spec.obs_dim, spec.hidden_sizes, 1, spec.activation, out_gain=1.0)
        if not self.discrete:
            init = np.full(spec.action_dim, spec.init_log_std, np.float32)
            self.log_std = Parameter(Tensor(init), name="log_std")
            self.postprocess = ActionPostprocess(spec.action_low, spec.action_high, spec.action_postprocess)

    def dist_param(self, obs: Tensor) -> Tensor:
        """Logits (discrete) or Gaussian mean (box) from raw observations."""
        return self.actor(self.normalizer(obs))

    def value(self, obs: Tensor) -> Tensor:
        return self.critic(self.normalizer(obs)).squeeze(-1)

    def prepare_actions(self, actions: Tensor) -> Tensor:
        """Stored raw actions as the loss reads them: one-hot rows for discrete, unchanged for box."""
        if self.discrete:
            return ops.one_hot(actions.astype("int32"), self.action_dim, 1.0, 0.0)
        return actions

    def trunks(self, x: Tensor, dtype: ms.dtype | None = None) -> tuple[Tensor, Tensor]:
        """Logits or Gaussian mean, and value, from normalised observations: what the PPO loss differentiates.

        ``dtype`` (mixed-precision update) computes both MLPs in that dtype; their outputs return to float32 before
        the log-probabilities and losses, which need the range. Rollouts and the exported graphs never take it.
        """
        if dtype is None:
            return self.actor(x), self.critic(x).squeeze(-1)
        param = self.actor.forward_as(x, dtype).astype(ms.float32)
        return param, self.critic.forward_as(x, dtype).astype(ms.float32).squeeze(-1)

    def sample(self, obs: Tensor, noise: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
        """(env action, raw action, log-prob of the raw action, value, logits or mean) from explicit noise."""
        x = self.normalizer(obs)
        param = self.actor(x)
        value = self.critic(x).squeeze(-1)
        if self.discrete:
            action = D.gumbel_argmax(param, noise)
            one_hot = ops.one_hot(action, self.action_dim, 1.0, 0.0)
            return action, action, D.categorical_log_prob(param, one_hot), value, param
        log_std = self.log_std + 0.0 * param
        raw = D.gaussian_sample(param, log_std, noise)
        return self.postprocess(raw), raw, D.gaussian_log_prob(param, log_std, raw), value, param

    def deterministic(self, obs: Tensor) -> tuple[Tensor, Tensor]:
        """(env action, logits or mean): argmax for discrete, the post-processed mean for box."""
        param = self.dist_param(obs)
        if self.discrete:
            return D.argmax_int32(param), param
        return self.postprocess(param), param


class RolloutPolicy(nn.Cell):
    """Training hot loop: one packed float32 output ``[raw action(s), env action(s), log-prob, value]``.

    A single output tensor measured ~2x faster per call than several in GRAPH_MODE.
    """

    def __init__(self, policy: ActorCritic) -> None:
        super().__init__()
        self.policy = policy

    def construct(self, obs: Tensor, noise: Tensor) -> Tensor:
        env_action, raw, logp, value, _ = self.policy.sample(obs, noise)
        if self.policy.discrete:
            raw = raw.astype("float32").expand_dims(-1)
            env_action = raw
        return ops.concat((raw, env_action, logp.expand_dims(-1), value.expand_dims(-1)), -1)


class StochasticPolicy(nn.Cell):
    """Exported sampling graph: (obs, noise) → (env action, log-prob, value, logits or mean).

    The distribution's parameters are an output too, so the graph's contract can say what it samples from
    (Gumbel-max of the logits, or the mean plus std times the noise): verify then knows each sample's margin.
    """

    def __init__(self, policy: ActorCritic) -> None:
        super().__init__()
        self.policy = policy

    def construct(self, obs: Tensor, noise: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        env_action, _, logp, value, param = self.policy.sample(obs, noise)
        return env_action, logp, value, param


class DeterministicPolicy(nn.Cell):
    """Exported deterministic graph: obs → (env action, logits or mean)."""

    def __init__(self, policy: ActorCritic) -> None:
        super().__init__()
        self.policy = policy

    def construct(self, obs: Tensor) -> tuple[Tensor, Tensor]:
        return self.policy.deterministic(obs)


def unpack_rollout(packed: np.ndarray, spec: PolicySpec) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Split ``RolloutPolicy`` output into (raw action, env action, log-prob, value)."""
    k = 1 if spec.discrete else spec.action_dim
    raw, env_action = packed[:, :k], packed[:, k : 2 * k]
    if spec.discrete:
        raw = raw[:, 0]
        env_action = env_action[:, 0].astype(np.int64)
    return raw, env_action, packed[:, 2 * k], packed[:, 2 * k + 1]
