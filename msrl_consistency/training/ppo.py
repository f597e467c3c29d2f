"""PPO loss and the compiled train step (CleanRL's update, as MindSpore Cells).

The train step is an ``nn.Cell`` run in GRAPH_MODE: value_and_grad → global-norm clip →
optimizer, with minibatch indices gathered inside the graph so there is one shape and one compile.

On MindSpore's CPU backend every kernel launch costs ~15-30 µs whatever its size, so a PPO update of
these small MLPs costs what its kernel count costs. Work that does not change within a call is done once
per call, not once per minibatch: observation normalisation (its statistics are frozen for the whole
iteration), one-hot actions, and the per-minibatch advantage normalisation of all minibatches of the call
(unbiased std, as ``torch.std`` in CleanRL).

Data parallel (``world_size > 1``): each rank runs this step on its own rollout; gradients are averaged over
all ranks by a fused AllReduce (``nn.DistributedGradReducer``) before clipping, so every rank clips the same
global gradient and applies the same update. Advantages are normalised over the union of all ranks' minibatches
(two small AllReduces per call: the sum, then the squared deviations), so W ranks x n/W envs run the same
algorithm as one process with n envs; ``adv_norm_scope="rank"`` normalises each rank's share on its own instead.
With one process none of this is in the graph.
"""

from __future__ import annotations

import mindspore as ms
from mindspore import Tensor, amp, nn, ops

from msrl_consistency.agent.policy import ActorCritic
from msrl_consistency.training.precision import LossScale, ScaledLoss

# Order of the scalars returned by ``PPOTrainStep``.
STEP_METRICS = ("loss", "pg_loss", "v_loss", "entropy", "approx_kl", "clipfrac")  # one row per update
_half_sq_norm = ops.L2Loss()  # sum(g ** 2) / 2 as one kernel (Square + ReduceSum would be two)


def clip_by_global_norm(grads: tuple[Tensor, ...], max_norm: float) -> tuple[Tensor, ...]:
    """Scale gradients so their global L2 norm is at most ``max_norm`` (PyTorch's ``clip_grad_norm_`` rule).

    Written out because ``ops.clip_by_global_norm`` is deprecated since MindSpore 2.9.
    """
    total = ops.sqrt(2.0 * ops.addn([_half_sq_norm(g) for g in grads]))  # one L2Loss kernel per gradient
    scale = ops.minimum(max_norm / (total + 1e-6), 1.0)
    return tuple(g * scale for g in grads)


class PPOLoss(nn.Cell):
    """Clipped surrogate + (optionally clipped) value loss − entropy bonus; aux is the ``STEP_METRICS`` row.

    Takes normalised observations, prepared actions and per-minibatch normalised advantages: the train
    step computes them once per call.
    """

    def __init__(
        self,
        policy: ActorCritic,
        clip_coef: float,
        vf_coef: float,
        ent_coef: float,
        clip_vloss: bool,
        compute_dtype: ms.dtype | None = None,
    ) -> None:
        super().__init__()
        self.policy = policy
        self.clip_coef = clip_coef
        self.vf_coef = vf_coef
        self.ent_coef = ent_coef
        self.clip_vloss = clip_vloss
        self.compute_dtype = compute_dtype  # None: float32 (see training/precision.py)

    def construct(
        self, x: Tensor, actions: Tensor, old_logp: Tensor, adv: Tensor, returns: Tensor, old_values: Tensor
    ) -> tuple[Tensor, Tensor]:
        if self.compute_dtype is None:
            logp, entropy, value = self.policy.evaluate_actions(x, actions)
        else:
            logp, entropy, value = self.policy.evaluate_actions_as(x, actions, self.compute_dtype)
        log_ratio = logp - old_logp
        ratio = ops.exp(log_ratio)
        approx_kl = ((ratio - 1.0) - log_ratio).mean()
        clipfrac = (ops.abs(ratio - 1.0) > self.clip_coef).astype("float32").mean()
        pg_loss = ops.maximum(-adv * ratio, -adv * ops.clamp(ratio, 1.0 - self.clip_coef, 1.0 + self.clip_coef)).mean()
        if self.clip_vloss:
            v_clipped = old_values + ops.clamp(value - old_values, -self.clip_coef, self.clip_coef)
            v_loss = 0.5 * ops.maximum(ops.square(value - returns), ops.square(v_clipped - returns)).mean()
        else:
            v_loss = 0.5 * ops.square(value - returns).mean()
        ent = entropy.mean()
        if self.ent_coef == 0.0:
            ent = ops.stop_gradient(ent)  # logged only: no backward kernels for a zero-weight term
        loss = pg_loss - self.ent_coef * ent + self.vf_coef * v_loss
        aux = ops.stack((loss, pg_loss, v_loss, ent, approx_kl, clipfrac))
        return loss, ops.stop_gradient(aux)


class PPOTrainStep(nn.Cell):
    """``updates_per_call`` minibatch updates in one compiled call (``idx`` is ``[updates, minibatch]``).

    ``obs`` are raw observations: they are normalised here, once per call, with the frozen statistics.

    Each update reads the Parameters the previous one wrote (MindSpore orders the side effects; measured
    bitwise equal to one call per minibatch), and fewer calls cut the per-launch overhead (~30% here).
    The Python loop below is unrolled, so each update of a call is compiled again (~0.6 s each on a slow host).
    A graph ``while`` loop over a Tensor counter compiles one body, but MindSpore 2.10 (CPU) then ignores
    Parameters the host sets between calls (the annealed learning rate, a resumed run's state): measured, so
    the loop stays unrolled.
    The rollout tensors stay the same objects for a whole iteration. Returns ``[updates, STEP_METRICS]``.

    ``grad_reducer`` (data parallel) averages gradients over the ranks; ``adv_world_size > 1`` normalises
    advantages over all ranks' minibatches; ``loss_scale`` (fp16) scales the loss, unscales the reduced
    gradients and skips an update whose gradients are not finite.
    """

    def __init__(
        self,
        loss_net: PPOLoss,
        optimizer: nn.Optimizer,
        max_grad_norm: float,
        updates_per_call: int = 1,
        norm_adv: bool = True,
        grad_reducer: nn.Cell | None = None,
        adv_world_size: int = 1,
        loss_scale: LossScale | None = None,
    ) -> None:
        super().__init__()
        self.loss_net = loss_net
        self.normalizer = loss_net.policy.normalizer
        self.norm_adv = norm_adv
        self.optimizer = optimizer
        self.max_grad_norm = max_grad_norm
        self.updates_per_call = updates_per_call
        self.grad_reducer = grad_reducer
        self.adv_world_size = adv_world_size
        self.adv_all_reduce = ops.AllReduce() if adv_world_size > 1 else None
        self.loss_scale = loss_scale
        if loss_scale is not None:
            # Everything an Adam step writes, restored when the step is skipped (see ``scaled_update``).
            written = {id(p): p for p in [*optimizer.parameters, *optimizer.get_parameters()]}
            self.step_state = ms.ParameterTuple([p for p in written.values() if p is not optimizer.learning_rate])
        grad_net = loss_net if loss_scale is None else ScaledLoss(loss_net)
        self.grad_fn = ms.value_and_grad(grad_net, None, optimizer.parameters, has_aux=True)

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
        x = ops.stop_gradient(self.normalizer(obs))
        actions = self.loss_net.policy.prepare_actions(actions)
        mb_adv = ops.gather(adv, idx, 0)  # [updates, minibatch]
        if self.norm_adv and self.adv_all_reduce is None:
            mb_adv = (mb_adv - mb_adv.mean(axis=1, keep_dims=True)) / (mb_adv.std(axis=1, ddof=1, keepdims=True) + 1e-8)
        elif self.norm_adv:
            mb_adv = self.normalize_across_ranks(mb_adv)
        rows = [self.update(x, actions, logp, mb_adv[0], returns, values, idx[0])]
        for i in range(1, self.updates_per_call):
            rows.append(self.update(x, actions, logp, mb_adv[i], returns, values, ops.depend(idx[i], rows[-1])))
        return ops.stack(rows)

    def normalize_across_ranks(self, mb_adv: Tensor) -> Tensor:
        """Per-minibatch normalisation over the union of every rank's minibatch (two-pass, unbiased std)."""
        n = mb_adv.shape[1] * self.adv_world_size
        mean = self.adv_all_reduce(mb_adv.sum(axis=1, keepdims=True)) / n
        centred = mb_adv - mean
        var = self.adv_all_reduce(ops.square(centred).sum(axis=1, keepdims=True)) / (n - 1)
        return centred / (ops.sqrt(var) + 1e-8)

    def update(
        self, x: Tensor, actions: Tensor, logp: Tensor, adv: Tensor, returns: Tensor, values: Tensor, idx: Tensor
    ) -> Tensor:
        batch = (
            ops.gather(x, idx, 0),
            ops.gather(actions, idx, 0),
            ops.gather(logp, idx, 0),
            adv,
            ops.gather(returns, idx, 0),
            ops.gather(values, idx, 0),
        )
        if self.loss_scale is not None:
            return self.scaled_update(batch)
        (_, aux), grads = self.grad_fn(*batch)
        if self.grad_reducer is not None:
            grads = self.grad_reducer(grads)
        grads = clip_by_global_norm(grads, self.max_grad_norm)
        return ops.depend(aux, self.optimizer(grads))

    def scaled_update(self, batch: tuple[Tensor, ...]) -> Tensor:
        """fp16: backward on the scaled loss; average, unscale, and skip the step if any gradient overflowed.

        Every rank sees the same reduced gradients, so every rank makes the same skip decision. The skip is
        branch-free: the optimizer always runs and everything it wrote (weights, moments, beta powers, step) is
        put back when the gradients were not finite. With a graph ``if`` around the optimizer instead, the same
        Parameter values gave different updates depending on whether the host had set them (as a resume does) or
        earlier steps had written them, so a resumed run drifted from an uninterrupted one (MindSpore 2.10, CPU).
        """
        scale = self.loss_scale.scale * 1.0
        (_, aux), grads = self.grad_fn(*batch, scale)
        if self.grad_reducer is not None:
            grads = self.grad_reducer(grads)
        grads = tuple(g / scale for g in grads)
        finite = self.loss_scale.adjust(amp.all_finite(grads))
        before = ()
        for p in self.step_state:
            before += (p + 0,)  # a copy (ops.identity would alias the Parameter and see the update)
        grads = ops.depend(clip_by_global_norm(grads, self.max_grad_norm), before)
        applied = self.optimizer(grads)
        kept = ()
        for p, old in zip(self.step_state, before):  # noqa: B905 - graph mode: no strict= (equal lengths)
            kept += (ops.assign(p, ops.select(finite, ops.depend(p, applied), old)),)
        return ops.depend(aux, kept)
