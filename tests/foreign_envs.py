"""Envs teams build around CartPole-v1's dynamics (deterministic under a seed), for policies of several shapes:
an action with two heads (``MultiDiscrete``) and a ``Dict`` observation (a vector plus a camera frame)."""

from __future__ import annotations

import gymnasium as gym
import numpy as np

FORCES = (5.0, 10.0, 15.0)


class TwoHeadCartPole(gym.Wrapper):
    """Actions ``[direction, strength]``: push left/right (2) with a force of 5, 10 or 15 (3)."""

    def __init__(self) -> None:
        super().__init__(gym.make("CartPole-v1"))
        self.action_space = gym.spaces.MultiDiscrete([2, 3])

    def step(self, action):  # noqa: ANN001, ANN201
        direction, strength = (int(a) for a in np.asarray(action).ravel())
        self.env.unwrapped.force_mag = FORCES[strength]
        return self.env.step(direction)


def frame(state: np.ndarray) -> np.ndarray:
    """An 8x8x3 uint8 camera frame: the cart's position (red) and the pole's angle (green)."""
    image = np.zeros((8, 8, 3), np.uint8)
    cart = int(np.clip((float(state[0]) + 2.4) / 4.8 * 7, 0, 7))
    pole = int(np.clip((float(state[2]) + 0.21) / 0.42 * 7, 0, 7))
    image[6:, cart, 0] = 255
    image[:6, pole, 1] = 255
    return image


class DictCartPole(gym.Wrapper):
    """Observations ``{"vec": the state, "img": a camera frame}``."""

    def __init__(self) -> None:
        super().__init__(gym.make("CartPole-v1"))
        self.observation_space = gym.spaces.Dict({
            "vec": self.env.observation_space, "img": gym.spaces.Box(0, 255, (8, 8, 3), np.uint8)})  # fmt: skip

    def _observe(self, state: np.ndarray) -> dict[str, np.ndarray]:
        return {"vec": np.asarray(state, np.float32), "img": frame(state)}

    def reset(self, **kwargs):  # noqa: ANN003, ANN201
        state, info = self.env.reset(**kwargs)
        return self._observe(state), info

    def step(self, action):  # noqa: ANN001, ANN201
        state, reward, terminated, truncated, info = self.env.step(action)
        return self._observe(state), reward, terminated, truncated, info


def make_two_head() -> TwoHeadCartPole:
    return TwoHeadCartPole()


def make_dict() -> DictCartPole:
    return DictCartPole()
