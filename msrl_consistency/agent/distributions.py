"""Closed-form log-probabilities, entropies and noise-driven sampling (no ``nn.probability``).

Sampling takes its randomness as an input so that every runtime reproduces it bit for bit:
Gumbel-max from uniform noise for Categorical, ``mean + std * eps`` for the diagonal Gaussian.
"""

from __future__ import annotations

import math

from mindspore import Tensor, ops
from mindspore.common import dtype as mstype

from inference.bundle.policy_math import UNIFORM_EPS as _POLICY_UNIFORM_EPS

LOG_2PI = math.log(2.0 * math.pi)
# Keep uniform noise away from 0 and 1 so that -log(-log(u)) stays finite in float32: the deploy side's bound, one home
# (``inference.bundle.policy_math``). Not 1e-7: MindSpore 2.10's CPU log returns exactly 0 for 1 - 1.2e-7 (its error
# near 1 is ~1e-7), which made the Gumbel noise +inf there.
UNIFORM_EPS = float(_POLICY_UNIFORM_EPS)


def categorical_log_prob(logits: Tensor, one_hot: Tensor) -> Tensor:
    return (ops.log_softmax(logits, -1) * one_hot).sum(-1)


def categorical_entropy(logits: Tensor) -> Tensor:
    logp = ops.log_softmax(logits, -1)
    return -(ops.exp(logp) * logp).sum(-1)


# The PPO loss (training/ppo.py) differentiates these by hand: one formula each, next to the log-probabilities.
def categorical_log_prob_grad(logits: Tensor, one_hot: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """(log-prob, its gradient w.r.t. the logits, log-softmax, probabilities): d log p_a / d logits = onehot − p."""
    log_probs = ops.log_softmax(logits, -1)
    probs = ops.exp(log_probs)
    return (log_probs * one_hot).sum(-1), one_hot - probs, log_probs, probs


def categorical_entropy_grad(log_probs: Tensor, probs: Tensor) -> tuple[Tensor, Tensor]:
    """(entropy, its gradient w.r.t. the logits): d H / d logits = −p · (log p + H)."""
    entropy = -(probs * log_probs).sum(-1)
    return entropy, -probs * (log_probs + entropy.expand_dims(-1))


def gumbel_argmax(logits: Tensor, uniform: Tensor) -> Tensor:
    """argmax(logits + Gumbel(u)) is a sample from softmax(logits); returns int32 indices.

    The transform runs in float32 whatever the logits' dtype: in fp16 the clamp ``1 - 1e-6`` is 1.0 and the top
    ~2.4e-4 of uniform draws would become infinite Gumbel samples (fp16 exports keep their noise float32).
    """
    u = ops.clamp(uniform.astype(mstype.float32), UNIFORM_EPS, 1.0 - UNIFORM_EPS)
    gumbel = -ops.log(-ops.log(u))
    return argmax_int32(logits.astype(mstype.float32) + gumbel)


def argmax_int32(x: Tensor) -> Tensor:
    """Last-axis argmax as int32 (what Lite returns). ``mint.argmax`` has no PyNative CPU kernel in 2.10."""
    return ops.argmax(x, dim=-1).astype("int32")


def gaussian_log_prob(mean: Tensor, log_std: Tensor, x: Tensor) -> Tensor:
    z = (x - mean) * ops.exp(-log_std)
    return (-0.5 * z * z - log_std - 0.5 * LOG_2PI).sum(-1)


def gaussian_log_prob_grad(mean: Tensor, log_std: Tensor, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """(``gaussian_log_prob``, its gradient w.r.t. the mean, w.r.t. log_std), the gradients per element.

    With z = (x − mean) / std: d log p / d mean = z / std and d log p / d log_std = z² − 1.
    """
    inv_std = ops.exp(-log_std)
    z = (x - mean) * inv_std
    zz = z * z
    return (-0.5 * zz - log_std - 0.5 * LOG_2PI).sum(-1), z * inv_std, zz - 1.0


def gaussian_entropy(log_std: Tensor) -> Tensor:
    return (log_std + 0.5 * (1.0 + LOG_2PI)).sum(-1)


def gaussian_sample(mean: Tensor, log_std: Tensor, normal: Tensor) -> Tensor:
    # std broadcast through ``log_std + 0 * mean``: the ``exp(log_std) * ones_like(mean)`` form hung
    # MindSpore Lite's Predict when std is also a graph output.
    return mean + ops.exp(log_std + 0.0 * mean) * normal
