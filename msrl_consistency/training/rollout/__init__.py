"""Collecting experience: one rank's training envs, stepped ``num_steps`` times with the rollout graph's actions.

The rollout graph normalises observations with statistics frozen for the iteration, samples with host-side noise
(the only randomness when acting) and returns the critic's values, so a rollout is one act call per vector step.
Episodes cut by a time limit are bootstrapped with the value of their true final observation.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from msrl_consistency.agent import PolicySpec
from msrl_consistency.agent.policy import unpack_rollout
from msrl_consistency.agent.preprocess import NORM_EPS, RunningMeanStd
from msrl_consistency.config import TrainConfig
from msrl_consistency.envs.engines import make_training_envs
from msrl_consistency.training.profile import Profile

REWARD_CLIP = 10.0  # --normalize-reward clips the normalised rewards, as CleanRL's wrapper does


def reward_factor(cfg: TrainConfig, ret_rms: RunningMeanStd) -> float:
    """What rewards are multiplied by in this iteration's rollout: ``reward_scale``, divided by the running std
    of the discounted return with --normalize-reward (frozen for the iteration, like the observation statistics)."""
    if not cfg.normalize_reward:
        return cfg.reward_scale
    return cfg.reward_scale / float(np.sqrt(ret_rms.var[0] + NORM_EPS))


class Rollout:
    """A rank's envs and what lives alongside them: the current observations, the noise stream, unfinished
    episodes' returns and lengths, and (--normalize-reward) each env's discounted return."""

    def __init__(
        self, cfg: TrainConfig, spec: PolicySpec, engine: Any, noise_rng: np.random.Generator,
        env_seed: int, backend: str, world_size: int, profile: Profile,
    ) -> None:  # fmt: skip
        """``engine``: what acts (``rollout_engine``: the learner's compiled graph, or ONNX Runtime)."""
        self.cfg, self.spec, self.backend, self.profile = cfg, spec, backend, profile
        self.noise_rng, self.env_seed = noise_rng, env_seed  # env i resets with env_seed + i
        self.engine = engine
        self.disc_return = np.zeros(cfg.num_envs)
        self.envs = make_training_envs(cfg.env_id, cfg.num_envs, backend, cfg.async_envs, cfg.env_threads,
                                       world_size)  # fmt: skip
        self.ep_return = np.zeros(cfg.num_envs)
        self.ep_length = np.zeros(cfg.num_envs, dtype=np.int64)
        self.obs: np.ndarray = np.zeros((cfg.num_envs, spec.obs_dim), np.float32)

    def reset(self, seed: int | None = None) -> None:
        """Start every env's first episode (env i with ``seed + i``; default the run's env seed)."""
        self.obs, _ = self.envs.reset(seed=self.env_seed if seed is None else seed)

    def collect(self, reward_factor: float) -> dict[str, np.ndarray]:
        """Run ``num_steps`` vector steps; bootstrap truncated episodes.

        ``finished`` rows are ``(step, env, return, length)`` of the episodes that ended; ``last_value`` is the
        critic's value of the observations the rollout ends on (GAE's bootstrap).
        """
        cfg, spec = self.cfg, self.spec
        n, t_max = cfg.num_envs, cfg.num_steps
        act_shape = () if spec.discrete else (spec.action_dim,)
        buf = {
            "obs": np.zeros((t_max, n, spec.obs_dim), np.float32),
            "actions": np.zeros((t_max, n, *act_shape), np.float32),
            "logp": np.zeros((t_max, n), np.float32),
            "values": np.zeros((t_max, n), np.float32),
            "rewards": np.zeros((t_max, n), np.float32),
            "dones": np.zeros((t_max, n), np.bool_),
        }
        finished: list[tuple[int, int, float, int]] = []
        returns_seen = np.zeros((t_max, n)) if cfg.normalize_reward else None
        clock, prof = time.perf_counter, self.profile
        start, env_time, act_before = clock(), 0.0, prof.seconds["acting"] + prof.seconds["compile"]
        for t in range(t_max):
            noise = spec.sample_noise(self.noise_rng, n)
            raw, env_action, logp, value = unpack_rollout(self.act(self.obs, noise), spec)
            t0 = clock()
            next_obs, reward, terminated, truncated, infos = self.envs.step(env_action)
            env_time += clock() - t0
            buf["obs"][t], buf["actions"][t], buf["logp"][t], buf["values"][t] = self.obs, raw, logp, value
            done = terminated | truncated
            scaled = reward.astype(np.float32) * reward_factor
            if returns_seen is not None:
                self.disc_return = self.disc_return * cfg.gamma + reward
                returns_seen[t] = self.disc_return
                self.disc_return[done] = 0.0
                scaled = np.clip(scaled, -REWARD_CLIP, REWARD_CLIP)
            bootstrap = truncated & ~terminated
            if bootstrap.any():
                final_obs = next_obs.copy()
                final_obs[bootstrap] = np.stack(infos["final_obs"][bootstrap])
                scaled[bootstrap] += cfg.gamma * self.values(final_obs)[bootstrap]
            buf["rewards"][t], buf["dones"][t] = scaled, done
            self.ep_return += reward
            self.ep_length += 1
            for i in np.flatnonzero(done):
                finished.append((t, int(i), float(self.ep_return[i]), int(self.ep_length[i])))
                self.ep_return[i], self.ep_length[i] = 0.0, 0
            self.obs = next_obs
        buf["last_value"] = self.values(self.obs)
        buf["finished"] = np.array(finished, np.float64).reshape(-1, 4)
        if returns_seen is not None:
            buf["returns_seen"] = returns_seen
        acting = prof.seconds["acting"] + prof.seconds["compile"] - act_before
        prof.add("env stepping", env_time, t_max)
        prof.add("rollout bookkeeping", clock() - start - env_time - acting, t_max)
        return buf

    def act(self, obs: np.ndarray, noise: np.ndarray) -> np.ndarray:
        """The rollout graph's packed output for ``obs`` (see ``unpack_rollout``)."""
        t0 = time.perf_counter()
        out = self.engine.act(obs, noise)
        self.profile.graph_call("act", "acting", time.perf_counter() - t0)
        return out

    def values(self, obs: np.ndarray) -> np.ndarray:
        """Critic values through the rollout graph (same batch shape, so no recompilation)."""
        noise = np.full((len(obs), self.spec.noise_dim), 0.5, np.float32)
        return unpack_rollout(self.act(obs, noise), self.spec)[3]

    def compile(self) -> int:
        """Compile the rollout graph on dummy inputs (nothing stateful runs); how many MindSpore graphs that was."""
        cfg, spec = self.cfg, self.spec
        self.engine.act(np.zeros((cfg.num_envs, spec.obs_dim), np.float32),
                        np.full((cfg.num_envs, spec.noise_dim), 0.5, np.float32))  # fmt: skip
        return self.engine.graphs

    def steppers(self) -> dict[str, Any]:
        """How the envs step: EnvPool threads, or gymnasium processes (this one and helpers, with the helpers' peak
        RSS, which ``peak_rss_mb`` of this process does not count)."""
        if self.backend == "envpool":
            return {"threads": self.envs.num_threads}
        helpers = [round(m, 1) for m in getattr(self.envs, "helpers_peak_rss_mb", list)()]
        return {"processes": getattr(self.envs, "num_workers", 1), "helpers_peak_rss_mb": helpers}

    def close(self) -> None:
        self.envs.close()
