"""Tiny deterministic environments for tests (registered under the ``msrl/`` namespace)."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np


class ChainEnv(gym.Env):
    """Deterministic chain: reward ``1`` per step, episode terminates after ``length`` steps.

    Observation is ``[t, 1]``; useful for checking GAE by hand and for fast end-to-end tests.
    """

    metadata: dict[str, Any] = {"render_modes": []}

    def __init__(self, length: int = 5, continuous: bool = False) -> None:
        self.length = length
        self.observation_space = gym.spaces.Box(-np.inf, np.inf, shape=(2,), dtype=np.float32)
        if continuous:
            self.action_space = gym.spaces.Box(-2.0, 2.0, shape=(1,), dtype=np.float32)
        else:
            self.action_space = gym.spaces.Discrete(2)
        self.t = 0

    def _obs(self) -> np.ndarray:
        return np.array([self.t, 1.0], dtype=np.float32)

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        self.t = 0
        return self._obs(), {}

    def step(self, action):
        self.t += 1
        return self._obs(), 1.0, self.t >= self.length, False, {}


gym.register("msrl/Chain-v0", entry_point=ChainEnv, max_episode_steps=50)
gym.register("msrl/ChainContinuous-v0", entry_point=ChainEnv, kwargs={"continuous": True}, max_episode_steps=50)
