"""Generalised Advantage Estimation as a pure NumPy function (tested against a hand-computed case)."""

from __future__ import annotations

import numpy as np


def compute_gae(
    rewards: np.ndarray,
    values: np.ndarray,
    dones: np.ndarray,
    last_value: np.ndarray,
    gamma: float,
    gae_lambda: float,
) -> tuple[np.ndarray, np.ndarray]:
    """Advantages and returns for a ``[T, N]`` rollout.

    ``dones[t]`` is true when the episode ended at step ``t`` (terminated *or* truncated). Truncation is
    handled by the caller adding ``gamma * V(final_obs)`` to ``rewards[t]``, so both cases stop the
    bootstrap here and only termination loses the future value.
    """
    steps = rewards.shape[0]
    advantages = np.zeros_like(rewards, dtype=np.float32)
    last_gae = np.zeros_like(last_value, dtype=np.float32)
    for t in reversed(range(steps)):
        next_value = last_value if t == steps - 1 else values[t + 1]
        not_done = 1.0 - dones[t].astype(np.float32)
        delta = rewards[t] + gamma * next_value * not_done - values[t]
        last_gae = delta + gamma * gae_lambda * not_done * last_gae
        advantages[t] = last_gae
    return advantages, (advantages + values).astype(np.float32)
