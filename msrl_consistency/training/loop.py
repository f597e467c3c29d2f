"""The PPO training loop, top to bottom: set-up → (rollout → GAE → update → stats → checkpoint)*.

All randomness is explicit and recorded: env resets use ``seed + i``, weights come from ``seed``,
sampling noise and minibatch shuffles come from NumPy generators seeded from ``seed``. Together with
``resume.state`` this makes a resumed run bitwise-equal to an uninterrupted one.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import mindspore as ms
import numpy as np
from mindspore import Tensor, nn

from inference.errors import UsageError
from inference.files import write_json_atomic
from msrl_consistency import compat
from msrl_consistency.agent import ActorCritic, DeterministicPolicy, PolicySpec, RolloutPolicy
from msrl_consistency.agent.policy import unpack_rollout
from msrl_consistency.agent.preprocess import RunningMeanStd
from msrl_consistency.artifacts import run_dir as rd
from msrl_consistency.artifacts.checkpoint import save_policy
from msrl_consistency.artifacts.provenance import git_commit, versions
from msrl_consistency.config import TrainConfig
from msrl_consistency.envs import EnvInfo, describe_env, make_env, make_vector_env
from msrl_consistency.training.gae import compute_gae
from msrl_consistency.training.ppo import STEP_METRICS, PPOLoss, PPOTrainStep, updates_per_call

METRIC_FIELDS = [
    "iteration", "global_step", "episodes", "return_mean", "length_mean", "learning_rate",
    *STEP_METRICS, "explained_variance", "sps", "wall_time",
]  # fmt: skip
EPISODE_FIELDS = ["global_step", "env", "return", "length"]
EVAL_FIELDS = ["iteration", "global_step", "return_mean", "return_min", "episodes", "seconds"]
NOISE_STREAM, SHUFFLE_STREAM, RESUME_RESET_STREAM = 1, 2, 3


def seed_streams(seed: int) -> tuple[np.random.Generator, np.random.Generator]:
    """Independent generators for sampling noise and minibatch shuffling, both derived from ``seed``."""
    return np.random.default_rng([seed, NOISE_STREAM]), np.random.default_rng([seed, SHUFFLE_STREAM])


def build_spec(cfg: TrainConfig, info: EnvInfo) -> PolicySpec:
    return PolicySpec.from_env(
        info,
        hidden_sizes=list(cfg.hidden_sizes),
        activation=cfg.activation,
        normalize_obs=cfg.normalize_obs,
        clip_obs=cfg.clip_obs,
        action_postprocess=cfg.action_postprocess,
        init_log_std=cfg.init_log_std,
    )


@dataclass
class Learner:
    """The Cells one PPO run trains with, built from its config (the Trainer's and the benchmarks')."""

    policy: ActorCritic
    rollout_net: RolloutPolicy
    optimizer: nn.Adam
    train_step: PPOTrainStep


def build_learner(cfg: TrainConfig, spec: PolicySpec) -> Learner:
    policy = ActorCritic(spec, seed=cfg.seed)
    optimizer = nn.Adam(policy.trainable_params(), learning_rate=cfg.learning_rate, eps=1e-5)
    loss = PPOLoss(policy, cfg.clip_coef, cfg.vf_coef, cfg.ent_coef, cfg.clip_vloss)
    per_call = updates_per_call(cfg.num_minibatches)
    train_step = PPOTrainStep(loss, optimizer, cfg.max_grad_norm, per_call, cfg.norm_adv)
    return Learner(policy, RolloutPolicy(policy), optimizer, train_step)


@dataclass
class TrainResult:
    run_dir: Path
    global_step: int
    eval_returns: list[float] = field(default_factory=list)


class Trainer:
    """Owns the envs, the compiled Cells and the logs of one run."""

    def __init__(self, cfg: TrainConfig, run_dir: Path, resume_state: dict[str, Any] | None = None) -> None:
        self.cfg, self.run_dir = cfg, run_dir
        self.info = describe_env(cfg.env_id)
        self.spec = build_spec(cfg, self.info)
        compat.set_device(cfg.device)
        compat.set_threads(cfg.threads)
        compat.use_graph_mode()

        learner = build_learner(cfg, self.spec)
        self.policy, self.rollout_net = learner.policy, learner.rollout_net
        self.optimizer, self.train_step = learner.optimizer, learner.train_step
        # Hot-path calls skip Cell.__call__'s per-call bookkeeping (see compat.CompiledCall).
        self._train_call = compat.CompiledCall(self.train_step)
        self._rollout_call = compat.CompiledCall(self.rollout_net)
        self.rms = RunningMeanStd.zeros(self.spec.obs_dim)
        self.noise_rng, self.shuffle_rng = seed_streams(cfg.seed)

        self.envs = make_vector_env(cfg.env_id, cfg.num_envs, cfg.async_envs)
        self.iteration, self.global_step, self.episodes = 0, 0, 0
        self.ep_return = np.zeros(cfg.num_envs)
        self.ep_length = np.zeros(cfg.num_envs, dtype=np.int64)
        self.resume_exact = True
        self.git_commit = git_commit()  # once: it spawns git subprocesses
        if resume_state is None:
            self.obs, _ = self.envs.reset(seed=cfg.seed)
            keep = None
        else:
            self._restore(resume_state)
            keep = self.global_step
        self.metrics = rd.CsvLog(run_dir / rd.METRICS_CSV, METRIC_FIELDS, keep)
        self.episode_log = rd.CsvLog(run_dir / rd.EPISODES_CSV, EPISODE_FIELDS, keep)
        self.eval_log = rd.CsvLog(run_dir / rd.EVALS_CSV, EVAL_FIELDS, keep) if cfg.eval_every else None
        self._deterministic: compat.CompiledCall | None = None  # compiled once, on the first evaluation

    # -- one iteration ------------------------------------------------------------------------------
    def collect(self) -> dict[str, np.ndarray]:
        """Run ``num_steps`` vector steps with frozen normalisation; bootstrap truncated episodes."""
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
        finished: list[tuple[float, int]] = []
        for t in range(t_max):
            noise = spec.sample_noise(self.noise_rng, n)
            raw, env_action, logp, value = unpack_rollout(self._act(self.obs, noise), spec)
            next_obs, reward, terminated, truncated, infos = self.envs.step(env_action)
            buf["obs"][t], buf["actions"][t], buf["logp"][t], buf["values"][t] = self.obs, raw, logp, value
            scaled = reward.astype(np.float32) * cfg.reward_scale
            bootstrap = truncated & ~terminated
            if bootstrap.any():
                final_obs = next_obs.copy()
                final_obs[bootstrap] = np.stack(infos["final_obs"][bootstrap])
                scaled[bootstrap] += cfg.gamma * self._values(final_obs)[bootstrap]
            buf["rewards"][t], buf["dones"][t] = scaled, terminated | truncated
            self.ep_return += reward
            self.ep_length += 1
            self.global_step += n
            for i in np.flatnonzero(terminated | truncated):
                finished.append((float(self.ep_return[i]), int(self.ep_length[i])))
                self.episode_log.write(
                    {"global_step": self.global_step, "env": int(i), "return": float(self.ep_return[i]),
                     "length": int(self.ep_length[i])}
                )  # fmt: skip
                self.ep_return[i], self.ep_length[i] = 0.0, 0
            self.obs = next_obs
        adv, ret = compute_gae(
            buf["rewards"], buf["values"], buf["dones"], self._values(self.obs), cfg.gamma, cfg.gae_lambda
        )
        buf["advantages"], buf["returns"] = adv, ret
        buf["finished"] = np.array(finished, np.float64).reshape(-1, 2)
        return buf

    def update(self, buf: dict[str, np.ndarray]) -> dict[str, float]:
        """``update_epochs`` passes of shuffled minibatches through the compiled train step."""
        cfg = self.cfg
        batch = cfg.batch_size
        flat = [
            Tensor(buf[k].reshape(batch, *buf[k].shape[2:]))
            for k in ("obs", "actions", "logp", "advantages", "returns", "values")
        ]
        sums = np.zeros(len(STEP_METRICS))
        count = 0
        per_call = self.train_step.updates_per_call
        for _ in range(cfg.update_epochs):
            perm = self.shuffle_rng.permutation(batch).astype(np.int32)
            chunks = perm.reshape(cfg.num_minibatches // per_call, per_call, cfg.minibatch_size)
            for idx in chunks:
                sums += self._train_call(*flat, Tensor(idx)).asnumpy().sum(axis=0)
                count += per_call
        stats = dict(zip(STEP_METRICS, (sums / count).tolist(), strict=True))
        values, returns = buf["values"].ravel(), buf["returns"].ravel()
        var_ret = float(np.var(returns))
        stats["explained_variance"] = float("nan") if var_ret == 0 else 1.0 - float(np.var(returns - values)) / var_ret
        return stats

    def run(self, progress: Any = None, stop_at: int | None = None) -> None:
        """Train to the end of the run, or only up to iteration ``stop_at`` (to resume later)."""
        cfg = self.cfg
        start_time, start_step = time.perf_counter(), self.global_step
        eval_time = 0.0  # periodic evaluations are not training time: excluded from SPS and wall_time
        last = cfg.num_iterations if stop_at is None else min(stop_at, cfg.num_iterations)
        while self.iteration < last:
            lr = cfg.learning_rate * (1.0 - self.iteration / cfg.num_iterations if cfg.anneal_lr else 1.0)
            self.optimizer.learning_rate.set_data(Tensor(lr, ms.float32))
            buf = self.collect()
            stats = self.update(buf)
            if cfg.normalize_obs:
                # Statistics change only between iterations, so a rollout and its update see the same graph.
                self.rms.update(buf["obs"].reshape(-1, self.spec.obs_dim))
                self.rms.copy_to(self.policy.normalizer)
            self.iteration += 1
            self.episodes += len(buf["finished"])
            elapsed = time.perf_counter() - start_time - eval_time
            sps = (self.global_step - start_step) / max(elapsed, 1e-9)
            finished = buf["finished"]
            row = {
                "iteration": self.iteration,
                "global_step": self.global_step,
                "episodes": self.episodes,
                "return_mean": float(finished[:, 0].mean()) if len(finished) else "",
                "length_mean": float(finished[:, 1].mean()) if len(finished) else "",
                "learning_rate": lr,
                **stats,
                "sps": round(sps, 1),
                "wall_time": round(elapsed, 3),
            }
            self.metrics.write(row)
            if progress is not None:
                progress.update(cfg.batch_size)
                if len(finished):
                    progress.set_postfix(ret=f"{row['return_mean']:.1f}", sps=f"{sps:.0f}")
            if self.eval_log is not None and self.iteration % cfg.eval_every == 0:
                eval_time += self._periodic_eval()
            if self.iteration % cfg.checkpoint_every == 0 or self.iteration == cfg.num_iterations:
                self.checkpoint()

    # -- evaluation -----------------------------------------------------------------------------------
    def evaluate(self, episodes: int) -> list[float]:
        """Deterministic episodes (argmax / mean action) on seeds ``seed + 10_000 + k``.

        Touches no training RNG stream or env, so evaluating during a run leaves its training bitwise unchanged.
        """
        if self._deterministic is None:
            self._deterministic = compat.CompiledCall(DeterministicPolicy(self.policy))
        det = self._deterministic
        returns = []
        for k in range(episodes):
            env = make_env(self.cfg.env_id)
            obs, _ = env.reset(seed=self.cfg.seed + 10_000 + k)
            total, done = 0.0, False
            while not done:
                action, _ = det(Tensor(obs[None].astype(np.float32)))
                a = action.asnumpy()[0]
                obs, reward, terminated, truncated, _ = env.step(int(a) if self.spec.discrete else a)
                total += float(reward)
                done = terminated or truncated
            env.close()
            returns.append(total)
        return returns

    def _periodic_eval(self) -> float:
        """``evaluate`` during training, logged to evals.csv; returns the seconds it took."""
        start = time.perf_counter()
        returns = self.evaluate(self.cfg.eval_episodes)
        seconds = time.perf_counter() - start
        self.eval_log.write(
            {"iteration": self.iteration, "global_step": self.global_step, "return_mean": float(np.mean(returns)),
             "return_min": float(np.min(returns)), "episodes": len(returns), "seconds": round(seconds, 3)}
        )  # fmt: skip
        return seconds

    # -- persistence ----------------------------------------------------------------------------------
    def run_info(self, eval_returns: list[float] | None = None) -> dict[str, Any]:
        return {
            "schema": rd.RUN_SCHEMA,
            "env_id": self.cfg.env_id,
            "config": self.cfg.to_dict(),
            "env": self.info.to_dict(),
            "policy_spec": self.spec.to_dict(),
            "normalization": {
                "mean": self.rms.mean.tolist(),
                "var": self.rms.var.tolist(),
                "count": self.rms.count,
                "clip": self.cfg.clip_obs,
                "enabled": self.cfg.normalize_obs,
            },
            "seeds": {
                "seed": self.cfg.seed,
                "env_reset": f"seed + env_index ({self.cfg.seed}..{self.cfg.seed + self.cfg.num_envs - 1})",
                "weights": self.cfg.seed,
                "noise": [self.cfg.seed, NOISE_STREAM],
                "shuffle": [self.cfg.seed, SHUFFLE_STREAM],
                "eval": f"seed + 10000 + k ({self.cfg.seed + 10_000}..)",
            },
            "iteration": self.iteration,
            "global_step": self.global_step,
            "episodes": self.episodes,
            "resume_exact": self.resume_exact,
            "eval": {"returns": eval_returns, "mean": float(np.mean(eval_returns))} if eval_returns else None,
            "versions": versions("mindspore", "gymnasium", "numpy"),
            "git_commit": self.git_commit,
        }

    def checkpoint(self, eval_returns: list[float] | None = None) -> None:
        """Resume state first, then the policy, then run.json: each file is replaced atomically."""
        blobs = self.envs.get_attr("state_blob")
        env_blobs = None if any(b is None for b in blobs) else list(blobs)
        state = {
            "env_id": self.cfg.env_id,
            "iteration": self.iteration,
            "global_step": self.global_step,
            "episodes": self.episodes,
            "params": {p.name: p.asnumpy() for p in self.train_step.get_parameters()},
            "rms": (self.rms.mean, self.rms.var, self.rms.count),
            "noise_rng": self.noise_rng.bit_generator.state,
            "shuffle_rng": self.shuffle_rng.bit_generator.state,
            "obs": self.obs,
            "env_blobs": env_blobs,
            "ep_return": self.ep_return,
            "ep_length": self.ep_length,
        }
        rd.save_resume_state(self.run_dir / rd.RESUME_STATE, state)
        save_policy(self.policy, self.run_dir / rd.CHECKPOINT)
        write_json_atomic(self.run_dir / rd.RUN_JSON, self.run_info(eval_returns))

    def _restore(self, state: dict[str, Any]) -> None:
        params = {p.name: p for p in self.train_step.get_parameters()}
        if set(params) != set(state["params"]):
            raise UsageError("resume state does not match this configuration's networks (changed --hidden-sizes?)")
        for name, value in state["params"].items():
            if tuple(params[name].shape) != value.shape:
                raise UsageError(f"resume state: {name} has shape {value.shape}, expected {params[name].shape}")
            params[name].set_data(Tensor(value))
        self.rms = RunningMeanStd(*state["rms"])
        self.rms.copy_to(self.policy.normalizer)
        self.noise_rng.bit_generator.state = state["noise_rng"]
        self.shuffle_rng.bit_generator.state = state["shuffle_rng"]
        self.iteration, self.global_step, self.episodes = state["iteration"], state["global_step"], state["episodes"]
        self.ep_return, self.ep_length = state["ep_return"], state["ep_length"]
        if state["env_blobs"] is not None:
            self.envs.set_attr("state_blob", state["env_blobs"])
            self.obs = state["obs"]
        else:
            # Envs holding C handles cannot be snapshotted: restart their episodes from a derived seed.
            self.resume_exact = False
            self.obs, _ = self.envs.reset(seed=self.cfg.seed + RESUME_RESET_STREAM * 1_000_003 + self.iteration)
            self.ep_return[:], self.ep_length[:] = 0.0, 0

    # -- hot-path helpers -----------------------------------------------------------------------------
    def _act(self, obs: np.ndarray, noise: np.ndarray) -> np.ndarray:
        return self._rollout_call(Tensor(obs.astype(np.float32, copy=False)), Tensor(noise)).asnumpy()

    def _values(self, obs: np.ndarray) -> np.ndarray:
        """Critic values through the rollout graph (same batch shape, so no recompilation)."""
        noise = np.full((len(obs), self.spec.noise_dim), 0.5, np.float32)
        return unpack_rollout(self._act(obs, noise), self.spec)[3]

    def close(self) -> None:
        self.metrics.close()
        self.episode_log.close()
        if self.eval_log is not None:
            self.eval_log.close()
        self.envs.close()
