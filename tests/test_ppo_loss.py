"""The PPO loss's hand-written gradients (``training/ppo.py`` heads) equal autodiff of the textbook loss.

The reference below is CleanRL's loss written the obvious way and differentiated by MindSpore; both run compiled
(GRAPH_MODE) on the same policy, batch and Parameters, with ratios and values far enough from the old ones that
the clipped branches are taken.
"""

from __future__ import annotations

import mindspore as ms
import numpy as np
import pytest
from mindspore import Tensor, nn, ops

from msrl_consistency import compat
from msrl_consistency.agent import ActorCritic, PolicySpec
from msrl_consistency.agent import distributions as D
from msrl_consistency.training.ppo import PPOLoss
from msrl_consistency.training.update_precision import ScaledLoss

BATCH = 64
CLIP = 0.2
SPECS = {
    "discrete": PolicySpec(obs_dim=4, action_kind="discrete", action_dim=3),
    "box": PolicySpec(
        obs_dim=3, action_kind="box", action_dim=2, action_low=[-2.0, -1.0], action_high=[2.0, 1.0], init_log_std=-0.5
    ),  # fmt: skip
}


class TextbookOutputs(nn.Cell):
    """Log-probability, entropy and value of ``ActorCritic``, the obvious way."""

    def __init__(self, policy: ActorCritic) -> None:
        super().__init__()
        self.policy = policy

    def construct(self, x, actions):  # noqa: ANN001, ANN201
        param, value = self.policy.actor(x), self.policy.critic(x).squeeze(-1)
        if self.policy.discrete:
            return D.categorical_log_prob(param, actions), D.categorical_entropy(param), value
        log_std = self.policy.log_std + 0.0 * param
        return D.gaussian_log_prob(param, log_std, actions), D.gaussian_entropy(log_std), value


class TextbookLoss(nn.Cell):
    """CleanRL's PPO loss on ``ActorCritic``'s outputs, left to autodiff."""

    def __init__(self, policy: ActorCritic, vf_coef: float, ent_coef: float, clip_vloss: bool) -> None:
        super().__init__()
        self.outputs = TextbookOutputs(policy)
        self.vf_coef, self.ent_coef, self.clip_vloss = vf_coef, ent_coef, clip_vloss

    def construct(self, x, actions, old_logp, adv, returns, old_values):  # noqa: ANN001, ANN201
        logp, entropy, value = self.outputs(x, actions)
        log_ratio = logp - old_logp
        ratio = ops.exp(log_ratio)
        approx_kl = ((ratio - 1.0) - log_ratio).mean()
        clipfrac = (ops.abs(ratio - 1.0) > CLIP).astype("float32").mean()
        pg_loss = ops.maximum(-adv * ratio, -adv * ops.clamp(ratio, 1.0 - CLIP, 1.0 + CLIP)).mean()
        if self.clip_vloss:
            v_clipped = old_values + ops.clamp(value - old_values, -CLIP, CLIP)
            v_loss = 0.5 * ops.maximum(ops.square(value - returns), ops.square(v_clipped - returns)).mean()
        else:
            v_loss = 0.5 * ops.square(value - returns).mean()
        ent = entropy.mean()
        loss = pg_loss - self.ent_coef * ent + self.vf_coef * v_loss
        return loss, ops.stop_gradient(ops.stack((loss, pg_loss, v_loss, ent, approx_kl, clipfrac)))


class Gradients(nn.Cell):
    """(loss, aux, gradients w.r.t. the policy's Parameters), compiled like the train step."""

    def __init__(self, loss_net: nn.Cell, params: list, scale: float | None = None) -> None:
        super().__init__()
        self.scale = scale
        net = loss_net if scale is None else ScaledLoss(loss_net)
        self.grad_fn = ms.value_and_grad(net, None, params, has_aux=True)

    def construct(self, *batch):  # noqa: ANN002, ANN201
        if self.scale is None:
            (loss, aux), grads = self.grad_fn(*batch)
        else:
            (loss, aux), grads = self.grad_fn(*batch, Tensor(self.scale, ms.float32))
        return loss, aux, grads


def batch_for(policy: ActorCritic, rng: np.random.Generator) -> tuple[Tensor, ...]:
    """Normalised obs, prepared actions, and old log-probs/values perturbed so that clipping is exercised."""
    spec = policy.spec
    x = Tensor(rng.standard_normal((BATCH, spec.obs_dim)).astype(np.float32))
    if spec.discrete:
        actions = policy.prepare_actions(Tensor(rng.integers(0, spec.action_dim, BATCH).astype(np.float32)))
    else:
        actions = Tensor(rng.standard_normal((BATCH, spec.action_dim)).astype(np.float32))
    logp, _, value = (t.asnumpy() for t in TextbookOutputs(policy)(x, actions))
    old_logp = (logp + rng.normal(0.0, 0.3, BATCH)).astype(np.float32)
    old_values = (value + rng.normal(0.0, 0.3, BATCH)).astype(np.float32)
    adv, returns = (rng.standard_normal(BATCH).astype(np.float32) for _ in range(2))
    return x, actions, Tensor(old_logp), Tensor(adv), Tensor(returns), Tensor(old_values)


@pytest.mark.slow
@pytest.mark.parametrize(
    "kind,clip_vloss,ent_coef",
    [("box", True, 0.0), ("box", False, 0.01), ("discrete", True, 0.01), ("discrete", False, 0.0)],
)
def test_hand_written_gradients_equal_autodiff_of_the_textbook_loss(kind, clip_vloss, ent_coef):
    compat.use_graph_mode()
    policy = ActorCritic(SPECS[kind], seed=3)
    params = policy.trainable_params()
    batch = batch_for(policy, np.random.default_rng(7))
    ours = Gradients(PPOLoss(policy, CLIP, 0.5, ent_coef, clip_vloss), params)(*batch)
    ref = Gradients(TextbookLoss(policy, 0.5, ent_coef, clip_vloss), params)(*batch)

    aux = ref[1].asnumpy()
    assert 0.1 < aux[5] < 0.9, "the batch must take both the clipped and the unclipped branches"
    np.testing.assert_allclose(ours[1].asnumpy(), aux, rtol=1e-6, atol=1e-7)
    for param, g, g_ref in zip(params, ours[2], ref[2], strict=True):
        assert np.abs(g_ref.asnumpy()).max() > 0, param.name
        np.testing.assert_allclose(g.asnumpy(), g_ref.asnumpy(), rtol=1e-5, atol=1e-7, err_msg=param.name)


@pytest.mark.slow
def test_hand_written_gradients_follow_the_loss_scale():
    """fp16 updates scale the loss; the heads' backward must scale their gradients the same way."""
    compat.use_graph_mode()
    policy = ActorCritic(SPECS["box"], seed=4)
    params = policy.trainable_params()
    batch = batch_for(policy, np.random.default_rng(8))
    loss_net = PPOLoss(policy, CLIP, 0.5, 0.0, True)
    plain = Gradients(loss_net, params)(*batch)[2]
    scaled = Gradients(loss_net, params, scale=1024.0)(*batch)[2]
    for g, g_scaled in zip(plain, scaled, strict=True):
        np.testing.assert_allclose(g_scaled.asnumpy() / 1024.0, g.asnumpy(), rtol=1e-6, atol=1e-9)
