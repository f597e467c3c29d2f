"""Training in the device's numerics (``--lower int8|fp16``): the calibration that keeps an int8 actor's activation
ranges on the states the policy visits, what the lowering costs against the fp32 shadow each iteration, and
``--init-from``.

The actor trunk computes lowered in every rollout and update (``agent.lowered``). For int8, each iteration ends by
calibrating its ranges again: ``CALIBRATION_ROWS`` observations spread evenly over the rollout that was just
trained on, normalised with the statistics the next rollout uses, through the trunk's float forward with int8-grid
weights, which is what Lite's MAX_MIN calibration sees when export converts the graph on the same rows. The rows and
ranges are Parameters, so the checkpoint carries both and a rollout and its update always share one set of ranges.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
from mindspore import Tensor, nn

from inference.bundle.policy_math import gaussian_log_prob, log_softmax
from inference.compare.judge.policy_level import mismatch
from inference.errors import UsageError
from msrl_consistency.agent import lowered
from msrl_consistency.agent.policy import CALIBRATION_ROWS, ActorCritic
from msrl_consistency.agent.preprocess import RunningMeanStd, numpy_normalize

LOG_FIELDS = ("lowered_flip_rate", "lowered_exp_abs_log_ratio", "lowered_k3_kl")


def calibration_rows(obs: np.ndarray, count: int = CALIBRATION_ROWS) -> np.ndarray:
    """``count`` observations spread evenly over a rollout's ``(steps, envs, dim)`` observations (no RNG: the same
    rollout gives the same rows)."""
    flat = obs.reshape(-1, obs.shape[-1])
    return flat[np.linspace(0, len(flat) - 1, count).round().astype(int)].astype(np.float32)


def normalise(policy: ActorCritic, obs: np.ndarray) -> np.ndarray:
    """The policy's in-graph observation normalisation (``ObsNormalizer``), in float32 NumPy."""
    norm = policy.normalizer
    if not norm.enabled:
        return obs.astype(np.float32)
    return numpy_normalize(obs, norm.mean.asnumpy(), norm.var.asnumpy(), norm.clip).astype(np.float32)


def trunk_weights(policy: ActorCritic) -> list[tuple[np.ndarray, np.ndarray]]:
    actor = policy.actor
    return [(actor.layers[i].weight.asnumpy(), actor.layers[i].bias.asnumpy()) for i in actor.dense_index]


def calibrate(policy: ActorCritic, obs: np.ndarray) -> None:
    """Set an int8 actor's calibration rows and activation ranges from a rollout's observations."""
    rows = calibration_rows(obs)
    actor = policy.actor
    ranges = lowered.activation_ranges(trunk_weights(policy), normalise(policy, rows), actor.tanh, actor.kept_dense)
    policy.calibration.set_data(Tensor(rows))
    lowered.set_ranges(policy.actor, ranges)


class Shadow(nn.Cell):
    """The actor trunk lowered (as it acts) and its fp32 shadow, on the same normalised observations: one compiled
    call per iteration."""

    def __init__(self, actor: nn.Cell) -> None:
        super().__init__()
        self.actor = actor

    def construct(self, x: Tensor) -> tuple[Tensor, Tensor]:
        return lowered.forward(self.actor, x), self.actor.layers(x)


def shadow_mismatch(policy: ActorCritic, shadow: Shadow, obs: np.ndarray, actions: np.ndarray) -> dict[str, float]:
    """The lowered actor against its fp32 shadow on a rollout's observations and the actions it took: the rate of
    greedy actions that differ (discrete), mean exp|Δ log π| and the k3 KL of the sampled actions."""
    x = normalise(policy, obs.reshape(-1, obs.shape[-1]))
    low, full = (out.asnumpy().astype(np.float64) for out in shadow(Tensor(x)))
    a = actions.reshape(len(x), -1)
    if policy.discrete:
        idx = a[:, 0].astype(int)
        logp_low, logp_full = log_softmax(low)[np.arange(len(x)), idx], log_softmax(full)[np.arange(len(x)), idx]
        flips = float(np.mean(low.argmax(-1) != full.argmax(-1)))
    else:
        std = np.exp(policy.log_std.asnumpy().astype(np.float64))
        logp_low, logp_full = gaussian_log_prob(low, std, a), gaussian_log_prob(full, std, a)
        flips = float("nan")
    m = mismatch(logp_full - logp_low)  # actions drawn from the lowered actor: it is the reference here
    return {"lowered_flip_rate": flips, "lowered_exp_abs_log_ratio": m["mean_exp_abs"], "lowered_k3_kl": m["k3_kl"]}


def init_from(policy: ActorCritic, run_dir: str | Path) -> tuple[RunningMeanStd, dict[str, Any]]:
    """Load another run's last checkpoint into ``policy`` (every Parameter it has; an int8 actor's calibration is
    made afresh), and the observation statistics to continue from. Returns them and what was loaded, for run.json."""
    from msrl_consistency.artifacts import run_dir as rd
    from msrl_consistency.artifacts.checkpoint import policy_parameters, read_checkpoint

    source = Path(run_dir)
    info = rd.read_run_json(source)
    saved = read_checkpoint(rd.checkpoint_path(source))
    own = policy_parameters(policy)
    fresh = {"actor.ranges", "actor.qparams", "calibration"}
    missing = sorted(set(own) - set(saved) - fresh)
    if missing:
        raise UsageError(f"--init-from {source}: its checkpoint lacks {', '.join(missing[:4])} (another architecture?)")
    for name, param in own.items():
        if name in fresh:
            continue
        if tuple(saved[name].shape) != tuple(param.shape):
            raise UsageError(f"--init-from {source}: {name} is {tuple(saved[name].shape)}, this run's policy has "
                             f"{tuple(param.shape)} (another --hidden-sizes?)")  # fmt: skip
        param.set_data(saved[name].value())
    steps = float(info.get("global_step") or 1)
    rms = RunningMeanStd(policy.normalizer.mean.asnumpy().astype(np.float64),
                         policy.normalizer.var.asnumpy().astype(np.float64), steps)  # fmt: skip
    return rms, {"run_dir": str(source), "global_step": info.get("global_step"),
                 "precision": (info.get("policy_spec") or {}).get("lower", "fp32")}  # fmt: skip
