"""A team's own env with camera frames: CartPole-v1's dynamics seen as 16x16 RGB uint8 images.

Red marks the cart's position on the bottom rows, green the pole's angle on the top rows, and the first row
carries a small instrument strip (the four state values as pixel intensities, since one frame cannot show
velocities). Seeded resets reproduce the same frames.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np

SIZE = 16


def render(state: np.ndarray) -> np.ndarray:
    """The 16x16x3 uint8 frame of a CartPole state (x, x_dot, theta, theta_dot)."""
    frame = np.zeros((SIZE, SIZE, 3), np.uint8)
    x, _, theta, _ = (float(v) for v in state)
    cart = int(np.clip((x + 2.4) / 4.8 * (SIZE - 1), 0, SIZE - 1))
    pole = int(np.clip((theta + 0.21) / 0.42 * (SIZE - 1), 0, SIZE - 1))
    frame[12:, cart, 0] = 255
    frame[2:12, pole, 1] = 255
    strip = np.clip(128 + 60 * np.repeat(np.asarray(state, np.float64), 4), 0, 255)
    frame[0, :, 2] = strip.astype(np.uint8)
    return frame


class PixelCartPole(gym.Wrapper):
    def __init__(self) -> None:
        super().__init__(gym.make("CartPole-v1"))
        self.observation_space = gym.spaces.Box(0, 255, (SIZE, SIZE, 3), np.uint8)

    def reset(self, **kwargs):  # noqa: ANN003, ANN201 - gymnasium's signature
        obs, info = self.env.reset(**kwargs)
        return render(obs), info

    def step(self, action):  # noqa: ANN001, ANN201
        obs, reward, terminated, truncated, info = self.env.step(action)
        return render(obs), reward, terminated, truncated, info


def make_env() -> PixelCartPole:
    return PixelCartPole()
