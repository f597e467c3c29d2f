"""Seeded episode replay in lockstep (after Gymnasium's ``utils/env_match.py``).

K episodes run as one batch: env ``k`` is reset with ``seed + k`` and, in stochastic mode, step ``t``
uses noise row ``noise[t, k]`` drawn once from a seeded generator, so every runtime sees identical
randomness. Finished episodes are masked, not reset.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import gymnasium as gym
import numpy as np

from inference.bundle import Bundle

EPISODE_NOISE_STREAM = 13
Policy = Callable[[np.ndarray, np.ndarray | None], np.ndarray]  # (obs batch, noise batch | None) -> env actions


@dataclass
class EpisodeTrace:
    """Lockstep traces of K episodes; arrays are ``[T, K, ...]`` with ``alive[t, k]`` marking real steps."""

    obs: np.ndarray
    actions: np.ndarray
    rewards: np.ndarray
    alive: np.ndarray

    @property
    def returns(self) -> np.ndarray:
        return (self.rewards * self.alive).sum(0)

    @property
    def lengths(self) -> np.ndarray:
        return self.alive.sum(0)


def episode_noise(bundle: Bundle, episodes: int, max_steps: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng([seed, EPISODE_NOISE_STREAM])
    return bundle.sample_noise(rng, max_steps * episodes).reshape(max_steps, episodes, -1)


def max_episode_steps(env_id: str, default: int = 1000) -> int:
    spec = gym.spec(env_id)
    return int(spec.max_episode_steps or default)


def run_episodes(
    env_id: str, policy: Policy, episodes: int, seed: int, noise: np.ndarray | None, discrete: bool
) -> EpisodeTrace:
    """Each env ``k`` reset with ``seed + k``; ``policy`` acts on the whole batch each step."""
    envs = [gym.make(env_id) for _ in range(episodes)]
    horizon = noise.shape[0] if noise is not None else max_episode_steps(env_id)
    obs = np.stack([env.reset(seed=seed + k)[0] for k, env in enumerate(envs)]).astype(np.float32)
    obs_log, act_log, rew_log, alive_log = [], [], [], []
    alive = np.ones(episodes, bool)
    for t in range(horizon):
        if not alive.any():
            break
        actions = np.asarray(policy(obs, None if noise is None else noise[t]))
        obs_log.append(obs.copy())
        act_log.append(actions.copy())
        alive_log.append(alive.copy())
        rewards = np.zeros(episodes)
        next_obs = obs.copy()
        for k in np.flatnonzero(alive):
            a = int(actions[k]) if discrete else actions[k]
            o, r, term, trunc, _ = envs[k].step(a)
            next_obs[k], rewards[k] = o, r
            if term or trunc:
                alive[k] = False
        rew_log.append(rewards)
        obs = next_obs
    for env in envs:
        env.close()
    return EpisodeTrace(np.asarray(obs_log), np.asarray(act_log), np.asarray(rew_log), np.asarray(alive_log))


def check_env_determinism(env_id: str, seed: int, steps: int = 200) -> str | None:
    """Same seed and action sequence twice must give the same trajectory; returns why not, or None."""
    traces = []
    for _ in range(2):
        env = gym.make(env_id)
        env.action_space.seed(seed)
        obs, _ = env.reset(seed=seed)
        trace = [np.asarray(obs, np.float64).copy()]
        for _ in range(steps):
            obs, reward, term, trunc, _ = env.step(env.action_space.sample())
            trace.append(np.append(np.asarray(obs, np.float64), reward))
            if term or trunc:
                obs, _ = env.reset()
                trace.append(np.asarray(obs, np.float64).copy())
        env.close()
        traces.append(trace)
    for t, (a, b) in enumerate(zip(*traces, strict=False)):
        if a.shape != b.shape or not np.array_equal(a, b, equal_nan=True):
            return f"{env_id} is not deterministic under a fixed seed: trajectories differ at step {t}"
    return None


def action_differences(ref: EpisodeTrace, got: EpisodeTrace, discrete: bool, atol: float) -> dict:
    """Per-step action difference over the steps both traces are alive; first divergent step per episode.

    Also the first step at which the *observations* differ at all: when it comes before the first divergent
    action, the env amplified sub-tolerance action differences (chaotic dynamics), which is not a policy fault.
    """
    steps = min(len(ref.actions), len(got.actions))
    both = ref.alive[:steps] & got.alive[:steps]
    a, b = ref.actions[:steps], got.actions[:steps]
    if discrete:
        diff = (a != b).astype(np.float64)
    else:
        diff = np.abs(a.astype(np.float64) - b.astype(np.float64)).reshape(steps, a.shape[1], -1).max(-1)
    diff = np.where(both, diff, 0.0)
    diverged = diff > (0.5 if discrete else atol)
    obs_differ = np.any(ref.obs[:steps] != got.obs[:steps], axis=-1) & both
    episodes = diff.shape[1]
    first = [int(np.argmax(diverged[:, k])) if diverged[:, k].any() else None for k in range(episodes)]
    drift = [int(np.argmax(obs_differ[:, k])) if obs_differ[:, k].any() else None for k in range(episodes)]
    amplified = [f is not None and d is not None and d < f for f, d in zip(first, drift, strict=True)]
    length_mismatch = ref.lengths != got.lengths
    return {
        "per_step_max": diff.max(1),
        "differing_steps": int(diverged.sum()),
        "first_divergent_step": first,
        "first_observation_drift": drift,
        "amplified": amplified,
        "episodes_diverged": int(
            sum(f is not None for f in first) + int(np.sum(length_mismatch & np.array([f is None for f in first])))
        ),
        "return_delta": (got.returns - ref.returns),
    }
