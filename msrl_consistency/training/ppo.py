"""PPO loss and the compiled train step (CleanRL's update, as MindSpore Cells).

The train step is an ``nn.Cell`` run in GRAPH_MODE: value_and_grad → global-norm clip →
optimizer, with minibatch indices gathered inside the graph so there is one shape and one compile.
"""

from __future__ import annotations

import mindspore as ms
from mindspore import Tensor, nn, ops

from msrl_consistency.agent.policy import ActorCritic

# Order of the scalars returned by ``PPOTrainStep``.
STEP_METRICS = ("loss", "pg_loss", "v_loss", "entropy", "approx_kl", "clipfrac")
MAX_UPDATES_PER_CALL = 8  # unrolled in the graph: more means longer compiles


def updates_per_call(num_minibatches: int) -> int:
    """The largest divisor of ``num_minibatches`` that is at most ``MAX_UPDATES_PER_CALL``."""
    return max(d for d in range(1, MAX_UPDATES_PER_CALL + 1) if num_minibatches % d == 0)


def clip_by_global_norm(grads: tuple[Tensor, ...], max_norm: float) -> tuple[Tensor, ...]:
    """Scale gradients so their global L2 norm is at most ``max_norm`` (PyTorch's ``clip_grad_norm_`` rule).

    Written out because ``ops.clip_by_global_norm`` is deprecated since MindSpore 2.9.
    """
    total = ops.sqrt(ops.addn([ops.square(g).sum() for g in grads]))
    scale = ops.minimum(max_norm / (total + 1e-6), 1.0)
    return tuple(g * scale for g in grads)


class PPOLoss(nn.Cell):
    """Clipped surrogate + (optionally clipped) value loss − entropy bonus; returns diagnostics as aux."""

    def __init__(
        self,
        policy: ActorCritic,
        clip_coef: float,
        vf_coef: float,
        ent_coef: float,
        clip_vloss: bool,
        norm_adv: bool,
    ) -> None:
        super().__init__()
        self.policy = policy
        self.clip_coef = clip_coef
        self.vf_coef = vf_coef
        self.ent_coef = ent_coef
        self.clip_vloss = clip_vloss
        self.norm_adv = norm_adv

    def construct(
        self, obs: Tensor, actions: Tensor, old_logp: Tensor, adv: Tensor, returns: Tensor, old_values: Tensor
    ) -> tuple[Tensor, Tensor]:
        logp, entropy, value = self.policy.evaluate_actions(obs, actions)
        log_ratio = logp - old_logp
        ratio = ops.exp(log_ratio)
        approx_kl = ((ratio - 1.0) - log_ratio).mean()
        clipfrac = (ops.abs(ratio - 1.0) > self.clip_coef).astype("float32").mean()
        if self.norm_adv:
            adv = (adv - adv.mean()) / (adv.std() + 1e-8)
        pg_loss = ops.maximum(-adv * ratio, -adv * ops.clamp(ratio, 1.0 - self.clip_coef, 1.0 + self.clip_coef)).mean()
        if self.clip_vloss:
            v_clipped = old_values + ops.clamp(value - old_values, -self.clip_coef, self.clip_coef)
            v_loss = 0.5 * ops.maximum((value - returns) ** 2, (v_clipped - returns) ** 2).mean()
        else:
            v_loss = 0.5 * ((value - returns) ** 2).mean()
        ent = entropy.mean()
        loss = pg_loss - self.ent_coef * ent + self.vf_coef * v_loss
        aux = ops.stack((pg_loss, v_loss, ent, ops.stop_gradient(approx_kl), ops.stop_gradient(clipfrac)))
        return loss, aux


class PPOTrainStep(nn.Cell):
    """``updates_per_call`` minibatch updates in one compiled call (``idx`` is ``[updates, minibatch]``).

    Each update reads the Parameters the previous one wrote (MindSpore orders the side effects; measured
    bitwise equal to one call per minibatch), and fewer calls cut the per-launch overhead (~30% here).
    The rollout tensors stay the same objects for a whole iteration. Returns the summed metrics.
    """

    def __init__(
        self, loss_net: PPOLoss, optimizer: nn.Optimizer, max_grad_norm: float, updates_per_call: int = 1
    ) -> None:
        super().__init__()
        self.loss_net = loss_net
        self.optimizer = optimizer
        self.max_grad_norm = max_grad_norm
        self.updates_per_call = updates_per_call
        self.grad_fn = ms.value_and_grad(loss_net, None, optimizer.parameters, has_aux=True)

    def construct(
        self,
        obs: Tensor,
        actions: Tensor,
        logp: Tensor,
        adv: Tensor,
        returns: Tensor,
        values: Tensor,
        idx: Tensor,
    ) -> Tensor:
        total = self.update(obs, actions, logp, adv, returns, values, idx[0])
        for i in range(1, self.updates_per_call):
            total = total + self.update(obs, actions, logp, adv, returns, values, ops.depend(idx[i], total))
        return total

    def update(
        self, obs: Tensor, actions: Tensor, logp: Tensor, adv: Tensor, returns: Tensor, values: Tensor, idx: Tensor
    ) -> Tensor:
        (loss, aux), grads = self.grad_fn(
            ops.gather(obs, idx, 0),
            ops.gather(actions, idx, 0),
            ops.gather(logp, idx, 0),
            ops.gather(adv, idx, 0),
            ops.gather(returns, idx, 0),
            ops.gather(values, idx, 0),
        )
        grads = clip_by_global_norm(grads, self.max_grad_norm)
        loss = ops.depend(loss, self.optimizer(grads))
        return ops.concat((loss.reshape(1), aux))
