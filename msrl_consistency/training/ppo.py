"""PPO loss and the compiled train step (CleanRL's update, as MindSpore Cells).

The train step is an ``nn.Cell`` run in GRAPH_MODE: value_and_grad → global-norm clip →
optimizer, with minibatch indices gathered inside the graph so there is one shape and one compile.

On MindSpore's CPU backend every kernel launch costs ~15-30 µs whatever its size, so a PPO update of
these small MLPs costs what its kernel count costs. Work that does not change within a call is done once
per call, not once per minibatch: observation normalisation (its statistics are frozen for the whole
iteration), one-hot actions, and the per-minibatch advantage normalisation of all minibatches of the call
(unbiased std, as ``torch.std`` in CleanRL). For the same reason the loss's own gradients (w.r.t. the policy's
logits or mean, log_std and value) are written out in the PPO heads instead of left to autodiff; autodiff
runs through the MLPs only.

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

from msrl_consistency.agent import distributions as D
from msrl_consistency.agent.policy import ActorCritic
from msrl_consistency.training.update_precision import LossScale, ScaledLoss

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
    step computes them once per call. Autodiff runs through the policy's MLPs only; the loss's own gradients
    are written out in the head (``GaussianPPOHead`` / ``CategoricalPPOHead``).
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
        self.discrete = policy.discrete
        head = CategoricalPPOHead if policy.discrete else GaussianPPOHead
        self.head = head(clip_coef, vf_coef, ent_coef, clip_vloss)
        self.compute_dtype = compute_dtype  # None: float32 (see training/update_precision.py)

    def construct(
        self, x: Tensor, actions: Tensor, old_logp: Tensor, adv: Tensor, returns: Tensor, old_values: Tensor
    ) -> tuple[Tensor, Tensor]:
        param, value = self.policy.trunks(x, self.compute_dtype)
        if self.discrete:
            out = self.head(param, actions, value, old_logp, adv, returns, old_values)
        else:
            out = self.head(param, self.policy.log_std, actions, value, old_logp, adv, returns, old_values)
        return out[0], ops.stop_gradient(out[1])


class _PPOHead(nn.Cell):
    """PPO's loss from the policy's outputs, with its gradient w.r.t. those outputs computed in the same pass.

    On MindSpore's CPU backend each kernel has a fixed cost, and autodiff of these few lines costs ~60 small
    kernels per minibatch update (clamp and maximum differentiate into compare/select chains, the log-probability
    again into a dozen). Written out, the gradients reuse the forward's tensors: Pendulum's update went from 210
    to 172 kernels. ``construct`` returns (loss, aux, gradients w.r.t. the differentiable inputs) and ``bprop``
    only scales those by the loss's incoming gradient (1, or the fp16 loss scale). Ties follow autodiff: inside
    the clip range both surrogate terms are equal and together give the unclipped term's gradient, and the clamp
    passes gradient at its bounds. Tested against autodiff of the textbook loss (``tests/test_ppo_loss.py``).
    """

    def __init__(self, clip_coef: float, vf_coef: float, ent_coef: float, clip_vloss: bool) -> None:
        super().__init__()
        self.clip_coef = clip_coef
        self.vf_coef = vf_coef
        self.ent_coef = ent_coef
        self.clip_vloss = clip_vloss
        self.zeros = ops.ZerosLike()  # a primitive: functional ops fail to compile inside bprop (MindSpore 2.10)

    def policy_loss(self, logp: Tensor, old_logp: Tensor, adv: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """(clipped surrogate loss, approx_kl, clipfrac, d loss / d logp)."""
        log_ratio = logp - old_logp
        ratio = ops.exp(log_ratio)
        approx_kl = ((ratio - 1.0) - log_ratio).mean()
        clipfrac = (ops.abs(ratio - 1.0) > self.clip_coef).astype("float32").mean()
        unclipped = -adv * ratio
        clipped = -adv * ops.maximum(ops.minimum(ratio, 1.0 + self.clip_coef), 1.0 - self.clip_coef)
        pg_loss = ops.maximum(unclipped, clipped).mean()
        # d/d logp of mean(max(-A r, -A clip(r))) with r = exp(logp - old): -A r where the unclipped term counts.
        d_logp = ops.select(unclipped >= clipped, unclipped, self.zeros(unclipped)) * (1.0 / logp.shape[0])
        return pg_loss, approx_kl, clipfrac, d_logp

    def value_loss(self, value: Tensor, returns: Tensor, old_values: Tensor) -> tuple[Tensor, Tensor]:
        """(value loss, d (vf_coef · value loss) / d value)."""
        err = value - returns
        scale = self.vf_coef / value.shape[0]
        if not self.clip_vloss:
            return 0.5 * (err * err).mean(), err * scale
        delta = value - old_values
        err_clipped = (old_values + ops.maximum(ops.minimum(delta, self.clip_coef), -self.clip_coef)) - returns
        sq, sq_clipped = err * err, err_clipped * err_clipped
        inside = ops.abs(delta) <= self.clip_coef
        grad_clipped = ops.select(inside, err_clipped, self.zeros(err))
        return 0.5 * ops.maximum(sq, sq_clipped).mean(), ops.select(sq >= sq_clipped, err, grad_clipped) * scale

    def total(
        self, pg_loss: Tensor, v_loss: Tensor, entropy: Tensor, approx_kl: Tensor, clipfrac: Tensor
    ) -> tuple[Tensor, Tensor]:
        """(loss, the ``STEP_METRICS`` row)."""
        loss = pg_loss - self.ent_coef * entropy + self.vf_coef * v_loss
        return loss, ops.stack((loss, pg_loss, v_loss, entropy, approx_kl, clipfrac))


class GaussianPPOHead(_PPOHead):
    """PPO loss of a diagonal Gaussian policy (state-independent log_std)."""

    def construct(
        self, mean: Tensor, log_std: Tensor, actions: Tensor, value: Tensor,
        old_logp: Tensor, adv: Tensor, returns: Tensor, old_values: Tensor,
    ) -> tuple[Tensor, ...]:  # fmt: skip
        logp, dlogp_dmean, dlogp_dlogstd = D.gaussian_log_prob_grad(mean, log_std, actions)
        # d entropy / d log_std = 1. Averaged over the rows, the same for each: summing log_std alone reduces to a
        # scalar reshape when there is one action, which graph-kernel fusion names differently in every process
        # (compat.graph_kernel_fusion), so its kernel was rebuilt at every start (~3 s).
        entropy = D.gaussian_entropy(ops.broadcast_to(log_std, mean.shape)).mean()
        pg_loss, approx_kl, clipfrac, d_logp = self.policy_loss(logp, old_logp, adv)
        v_loss, d_value = self.value_loss(value, returns, old_values)
        loss, aux = self.total(pg_loss, v_loss, entropy, approx_kl, clipfrac)
        d_logp = d_logp.expand_dims(-1)
        d_log_std = (d_logp * dlogp_dlogstd).sum(0)
        if self.ent_coef != 0.0:
            d_log_std = d_log_std - self.ent_coef
        return loss, aux, d_logp * dlogp_dmean, d_log_std, d_value

    def bprop(self, mean, log_std, actions, value, old_logp, adv, returns, old_values, out, dout):  # noqa: ANN001, ANN201
        s, z = dout[0], self.zeros
        return s * out[2], s * out[3], z(actions), s * out[4], z(old_logp), z(adv), z(returns), z(old_values)


class CategoricalPPOHead(_PPOHead):
    """PPO loss of a categorical policy (``actions`` one-hot)."""

    def construct(
        self, logits: Tensor, actions: Tensor, value: Tensor,
        old_logp: Tensor, adv: Tensor, returns: Tensor, old_values: Tensor,
    ) -> tuple[Tensor, ...]:  # fmt: skip
        logp, dlogp_dlogits, log_probs, probs = D.categorical_log_prob_grad(logits, actions)
        entropy, dent_dlogits = D.categorical_entropy_grad(log_probs, probs)
        entropy = entropy.mean()
        pg_loss, approx_kl, clipfrac, d_logp = self.policy_loss(logp, old_logp, adv)
        v_loss, d_value = self.value_loss(value, returns, old_values)
        loss, aux = self.total(pg_loss, v_loss, entropy, approx_kl, clipfrac)
        d_logits = d_logp.expand_dims(-1) * dlogp_dlogits
        if self.ent_coef != 0.0:
            d_logits = d_logits - dent_dlogits * (self.ent_coef / logits.shape[0])
        return loss, aux, d_logits, d_value

    def bprop(self, logits, actions, value, old_logp, adv, returns, old_values, out, dout):  # noqa: ANN001, ANN201
        s, z = dout[0], self.zeros
        return s * out[2], z(actions), s * out[3], z(old_logp), z(adv), z(returns), z(old_values)


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
        corrects: bool = False,
    ) -> None:
        super().__init__()
        self.loss_net = loss_net
        self.corrects = corrects  # another engine acted: each row's advantage is weighted by its importance weight
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
        is_weights: Tensor,
        idx: Tensor,
    ) -> Tensor:
        x, actions, mb_adv = self.prepare(obs, actions, adv, idx, is_weights)
        rows = [self.update(x, actions, logp, mb_adv[0], returns, values, idx[0])]
        for i in range(1, self.updates_per_call):
            rows.append(self.update(x, actions, logp, mb_adv[i], returns, values, ops.depend(idx[i], rows[-1])))
        return ops.stack(rows)

    def prepare(
        self, obs: Tensor, actions: Tensor, adv: Tensor, idx: Tensor, is_weights: Tensor
    ) -> tuple[Tensor, Tensor, Tensor]:
        """(normalised observations, prepared actions, per-minibatch normalised advantages ``[updates, minibatch]``).

        With ``corrects``, each row's normalised advantage is multiplied by its truncated importance weight (never
        negative): the clipped surrogate ``max(-wA r, -wA clip(r))`` is then ``w`` times the row's PPO term, the
        decoupled PPO objective, with the heads' hand-written gradients unchanged."""
        x = ops.stop_gradient(self.normalizer(obs))
        actions = self.loss_net.policy.prepare_actions(actions)
        mb_adv = ops.gather(adv, idx, 0)  # [updates, minibatch]
        if self.norm_adv and self.adv_all_reduce is None:
            mb_adv = (mb_adv - mb_adv.mean(axis=1, keep_dims=True)) / (mb_adv.std(axis=1, ddof=1, keepdims=True) + 1e-8)
        elif self.norm_adv:
            mb_adv = self.normalize_across_ranks(mb_adv)
        if self.corrects:
            mb_adv = mb_adv * ops.gather(is_weights, idx, 0)
        return x, actions, mb_adv

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
        batch = self.minibatch(x, actions, logp, adv, returns, values, idx)
        if self.loss_scale is not None:
            return self.scaled_update(batch)
        (_, aux), grads = self.grad_fn(*batch)
        return ops.depend(aux, self.apply(grads))

    def minibatch(
        self, x: Tensor, actions: Tensor, logp: Tensor, adv: Tensor, returns: Tensor, values: Tensor, idx: Tensor
    ) -> tuple[Tensor, ...]:
        """The loss's inputs for the rows ``idx`` (``adv`` is already this minibatch's)."""
        gather = ops.gather
        return (gather(x, idx, 0), gather(actions, idx, 0), gather(logp, idx, 0), adv, gather(returns, idx, 0),
                gather(values, idx, 0))  # fmt: skip

    def apply(self, grads: tuple[Tensor, ...]) -> Tensor:
        """Average over ranks (data parallel), clip to the global norm, one Adam step."""
        if self.grad_reducer is not None:
            grads = self.grad_reducer(grads)
        return self.optimizer(clip_by_global_norm(grads, self.max_grad_norm))

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


class SplitUpdate:
    """A minibatch update as two small graphs, ``PPOTrainStep``'s own code cut at the gradients.

    MindSpore 2.10's CPU runtime runs a graph in the calling thread when it has at most 100 kernels and one actor
    thread (ours: ``threads = 1``); larger graphs go through its actor thread pool, where each kernel is a message
    between threads (``GraphScheduler::CheckSingleThreadRunningCondition``; ``bench/kernel_cost.py``: ~30-40% more
    per kernel above the limit). One update of a 64-64 actor-critic is ~150-200 kernels; its gradients (~85-90) and
    its clip + Adam (~35-50) each fit. Per iteration: one ``prepare`` call (normalised observations, prepared
    actions, every minibatch's normalised advantages), then two calls per minibatch update. The same updates as
    ``PPOTrainStep`` up to last-bit rounding (``tests/test_training.py``). One process, fp32.
    """

    def __init__(self, step: PPOTrainStep) -> None:
        if step.loss_scale is not None or step.grad_reducer is not None or step.adv_all_reduce is not None:
            raise ValueError("a split update runs one process in fp32")
        self.prepare = _Prepare(step)
        self.gradients = _Gradients(step)
        self.apply = _Apply(step)


class _Prepare(nn.Cell):
    def __init__(self, step: PPOTrainStep) -> None:
        super().__init__(auto_prefix=False)  # wrapping must not rename the step's Parameters (checkpoints use names)
        self.step = step

    def construct(
        self, obs: Tensor, actions: Tensor, adv: Tensor, idx: Tensor, is_weights: Tensor
    ) -> tuple[Tensor, Tensor, Tensor]:
        return self.step.prepare(obs, actions, adv, idx, is_weights)


class _Gradients(nn.Cell):
    """(the ``STEP_METRICS`` row, gradients...) of minibatch ``u`` (``mb_adv`` and ``idx`` hold every minibatch)."""

    def __init__(self, step: PPOTrainStep) -> None:
        super().__init__(auto_prefix=False)  # wrapping must not rename the step's Parameters (checkpoints use names)
        self.step = step

    def construct(
        self, x: Tensor, actions: Tensor, logp: Tensor, mb_adv: Tensor, returns: Tensor, values: Tensor,
        idx: Tensor, u: Tensor,
    ) -> tuple[Tensor, ...]:  # fmt: skip
        batch = self.step.minibatch(x, actions, logp, ops.gather(mb_adv, u, 0), returns, values, ops.gather(idx, u, 0))
        (_, aux), grads = self.step.grad_fn(*batch)
        return (aux, *grads)


class _Apply(nn.Cell):
    def __init__(self, step: PPOTrainStep) -> None:
        super().__init__(auto_prefix=False)  # wrapping must not rename the step's Parameters (checkpoints use names)
        self.step = step

    def construct(self, *grads: Tensor) -> Tensor:
        return self.step.apply(grads)
