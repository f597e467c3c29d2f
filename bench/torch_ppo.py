"""Lean CleanRL-style PyTorch PPO: the yardstick our MindSpore PPO is measured against.

It runs the same algorithm with the same hyperparameter names and defaults as ``msrl_consistency``
(separate 64x64 tanh actor and critic, orthogonal init, running observation normalisation frozen during
a rollout, GAE, clipped surrogate + clipped value loss, entropy bonus, per-minibatch advantage
normalisation, global grad-norm clip, linear learning-rate annealing, SAME_STEP autoreset with the
value of the final observation bootstrapped on truncation). An SPS ratio then compares the frameworks,
not two different algorithms. One op thread, like ours, so both get the same share of the machine.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from torch import nn
from torch.distributions import Categorical, Distribution, Normal

from msrl_consistency.config import TrainConfig  # the defaults only: no MindSpore import

# Argument validation costs more than the tiny MLPs on every call; the inputs here are always valid.
Distribution.set_default_validate_args(False)

# Run-management keys of a preset that do not change the algorithm; accepted and ignored.
IGNORED_KEYS = {"env_id", "total_steps", "seed", "run_dir", "resume", "device", "threads", "async_envs",
                "checkpoint_every", "eval_episodes", "eval_every", "progress", "env_backend", "env_threads", "profile",
                "updates_per_call", "update_graphs", "graph_kernel"}  # fmt: skip


_DEFAULTS = TrainConfig()


@dataclass
class HParams:
    """The algorithm's knobs, named like ``msrl_consistency.config.TrainConfig`` and defaulted from it."""

    num_envs: int = _DEFAULTS.num_envs
    num_steps: int = _DEFAULTS.num_steps
    learning_rate: float = _DEFAULTS.learning_rate
    anneal_lr: bool = _DEFAULTS.anneal_lr
    gamma: float = _DEFAULTS.gamma
    gae_lambda: float = _DEFAULTS.gae_lambda
    num_minibatches: int = _DEFAULTS.num_minibatches
    update_epochs: int = _DEFAULTS.update_epochs
    norm_adv: bool = _DEFAULTS.norm_adv
    clip_coef: float = _DEFAULTS.clip_coef
    clip_vloss: bool = _DEFAULTS.clip_vloss
    ent_coef: float = _DEFAULTS.ent_coef
    vf_coef: float = _DEFAULTS.vf_coef
    max_grad_norm: float = _DEFAULTS.max_grad_norm
    hidden_sizes: tuple[int, ...] = tuple(_DEFAULTS.hidden_sizes)
    activation: str = _DEFAULTS.activation
    normalize_obs: bool = _DEFAULTS.normalize_obs
    clip_obs: float = _DEFAULTS.clip_obs
    action_postprocess: str = _DEFAULTS.action_postprocess
    init_log_std: float = _DEFAULTS.init_log_std
    reward_scale: float = _DEFAULTS.reward_scale

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> HParams:
        """Reject unknown keys (typos) but skip run-management ones, so a preset TOML can be passed as is."""
        known = {f.name for f in fields(cls)}
        unknown = set(values) - known - IGNORED_KEYS
        if unknown:
            raise ValueError(f"unknown hyperparameter(s): {sorted(unknown)}")
        hp = cls(**{k: v for k, v in values.items() if k in known})
        hp.hidden_sizes = tuple(hp.hidden_sizes)
        return hp


def layer(fan_in: int, fan_out: int, gain: float) -> nn.Linear:
    """CleanRL's ``layer_init``: orthogonal weights, zero bias."""
    linear = nn.Linear(fan_in, fan_out)
    nn.init.orthogonal_(linear.weight, gain)
    nn.init.zeros_(linear.bias)
    return linear


def mlp(in_dim: int, hidden: tuple[int, ...], out_dim: int, activation: str, out_gain: float) -> nn.Sequential:
    mods: list[nn.Module] = []
    for width in hidden:
        mods += [layer(in_dim, width, float(np.sqrt(2.0))), nn.Tanh() if activation == "tanh" else nn.ReLU()]
        in_dim = width
    return nn.Sequential(*mods, layer(in_dim, out_dim, out_gain))


class Agent(nn.Module):
    """Actor and critic on normalised observations; Categorical or diagonal-Gaussian head."""

    def __init__(self, env: gym.vector.VectorEnv, hp: HParams) -> None:
        super().__init__()
        obs_dim = int(np.prod(env.single_observation_space.shape))
        space = env.single_action_space
        self.discrete = isinstance(space, gym.spaces.Discrete)
        act_dim = int(space.n) if self.discrete else int(np.prod(space.shape))
        self.hp = hp
        self.register_buffer("obs_mean", torch.zeros(obs_dim))
        self.register_buffer("obs_var", torch.ones(obs_dim))
        self.actor = mlp(obs_dim, hp.hidden_sizes, act_dim, hp.activation, 0.01)
        self.critic = mlp(obs_dim, hp.hidden_sizes, 1, hp.activation, 1.0)
        if not self.discrete:
            self.log_std = nn.Parameter(torch.full((act_dim,), float(hp.init_log_std)))
            low, high = torch.as_tensor(space.low), torch.as_tensor(space.high)
            self.register_buffer("act_center", (high + low) / 2)
            self.register_buffer("act_half", (high - low) / 2)

    def normalize(self, obs: torch.Tensor) -> torch.Tensor:
        if not self.hp.normalize_obs:
            return obs
        x = (obs - self.obs_mean) / torch.sqrt(self.obs_var + 1e-8)
        return x.clamp(-self.hp.clip_obs, self.hp.clip_obs)

    def dist(self, x: torch.Tensor) -> Distribution:
        param = self.actor(x)
        if self.discrete:
            return Categorical(logits=param)
        return Normal(param, self.log_std.exp().expand_as(param))

    def value(self, obs: torch.Tensor) -> torch.Tensor:
        return self.critic(self.normalize(obs)).squeeze(-1)

    def act(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Sampled raw action, its log-prob and the state value (rollout only: no autograd)."""
        x = self.normalize(obs)
        d = self.dist(x)
        action = d.sample()
        return action, self.log_prob(d, action), self.critic(x).squeeze(-1)

    def evaluate(self, obs: torch.Tensor, actions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Log-prob of stored actions, entropy and value: the inputs of the PPO loss."""
        x = self.normalize(obs)
        d = self.dist(x)
        entropy = d.entropy() if self.discrete else d.entropy().sum(-1)
        return self.log_prob(d, actions), entropy, self.critic(x).squeeze(-1)

    def log_prob(self, d: Distribution, actions: torch.Tensor) -> torch.Tensor:
        return d.log_prob(actions) if self.discrete else d.log_prob(actions).sum(-1)

    def to_env(self, raw: torch.Tensor) -> np.ndarray:
        """Raw sample → env action: integer index, or clip/tanh to [-1, 1] then rescale to the bounds."""
        if self.discrete:
            return raw.numpy()
        squashed = raw.tanh() if self.hp.action_postprocess == "tanh" else raw.clamp(-1.0, 1.0)
        return (self.act_center + self.act_half * squashed).numpy()

    @torch.no_grad()
    def deterministic(self, obs: np.ndarray) -> np.ndarray:
        param = self.actor(self.normalize(torch.as_tensor(obs, dtype=torch.float32)[None]))
        return self.to_env(param.argmax(-1) if self.discrete else param)[0]

    def env_action(self, obs: np.ndarray) -> Any:
        """The deterministic action as the env takes it (a Python int for Discrete)."""
        action = self.deterministic(obs)
        return int(action) if self.discrete else action


class RunningMeanStd:
    """Host running mean/variance (float64, Chan et al. merge), as in ``msrl_consistency``."""

    def __init__(self, dim: int) -> None:
        self.mean, self.var, self.count = np.zeros(dim), np.ones(dim), 1e-4

    def update(self, batch: np.ndarray) -> None:
        b_mean, b_var, b_count = batch.mean(0), batch.var(0), batch.shape[0]
        delta, total = b_mean - self.mean, self.count + b_count
        self.mean = self.mean + delta * b_count / total
        self.var = (self.var * self.count + b_var * b_count + delta**2 * self.count * b_count / total) / total
        self.count = total


def gae(
    rewards: np.ndarray, values: np.ndarray, dones: np.ndarray, last_value: np.ndarray, gamma: float, lam: float
) -> tuple[np.ndarray, np.ndarray]:
    """Advantages and returns; ``dones[t]`` stops the bootstrap (truncation value is already in the reward)."""
    adv = np.zeros_like(rewards)
    last = np.zeros_like(last_value)
    for t in reversed(range(len(rewards))):
        next_value = last_value if t == len(rewards) - 1 else values[t + 1]
        not_done = 1.0 - dones[t]
        last = rewards[t] + gamma * next_value * not_done - values[t] + gamma * lam * not_done * last
        adv[t] = last
    return adv, adv + values


def evaluate(act: Callable[[np.ndarray], Any], env_id: str, seed: int, episodes: int) -> list[float]:
    """Deterministic episodes of ``act`` (obs → env action) on seeds ``seed + 10_000 + k``, the seeds our Trainer
    evaluates on; shared by every framework in the benchmark."""
    returns = []
    for k in range(episodes):
        env = gym.make(env_id)
        obs, _ = env.reset(seed=seed + 10_000 + k)
        total, done = 0.0, False
        while not done:
            obs, reward, terminated, truncated, _ = env.step(act(obs))
            total += float(reward)
            done = terminated or truncated
        env.close()
        returns.append(total)
    return returns


def minibatch_update(
    agent: Agent, optimizer: torch.optim.Optimizer, hp: HParams, rollout: tuple[torch.Tensor, ...], idx: torch.Tensor
) -> None:
    """One PPO minibatch update (CleanRL's): clipped surrogate + value loss − entropy, clip grad norm, Adam."""
    b_obs, b_act, b_logp, b_adv, b_ret, b_val = rollout
    new_logp, entropy, new_value = agent.evaluate(b_obs[idx], b_act[idx])
    ratio = (new_logp - b_logp[idx]).exp()
    mb_adv = b_adv[idx]
    if hp.norm_adv:
        mb_adv = (mb_adv - mb_adv.mean()) / (mb_adv.std() + 1e-8)
    pg_loss = torch.max(-mb_adv * ratio, -mb_adv * ratio.clamp(1 - hp.clip_coef, 1 + hp.clip_coef)).mean()
    if hp.clip_vloss:
        v_clipped = b_val[idx] + (new_value - b_val[idx]).clamp(-hp.clip_coef, hp.clip_coef)
        v_loss = 0.5 * torch.max((new_value - b_ret[idx]) ** 2, (v_clipped - b_ret[idx]) ** 2).mean()
    else:
        v_loss = 0.5 * ((new_value - b_ret[idx]) ** 2).mean()
    loss = pg_loss - hp.ent_coef * entropy.mean() + hp.vf_coef * v_loss
    optimizer.zero_grad()
    loss.backward()
    nn.utils.clip_grad_norm_(agent.parameters(), hp.max_grad_norm)
    optimizer.step()


def train(
    env_id: str,
    total_steps: int,
    seed: int,
    eval_episodes: int = 10,
    eval_every: int = 0,
    eval_every_episodes: int = 5,
    stop_at_eval: float | None = None,
    give_up_at: int | None = None,
    give_up_after_s: float | None = None,
    **hparams: Any,
) -> dict[str, Any]:
    """Train PPO; return wall and CPU time (training loop only), SPS, per-episode ``(global_step, return)`` and eval.

    ``eval_every`` > 0 also runs ``eval_every_episodes`` deterministic episodes every that many iterations
    (``evals``: ``(global_step, mean return)``); their time is excluded from the timings. ``stop_at_eval`` ends
    training at the first of them whose mean reaches it, ``give_up_at`` after that many env steps without (the learning
    rate still anneals over ``total_steps``), ``give_up_after_s`` after that many training wall seconds without (a
    race: another framework's wall to the target).
    """
    hp = HParams.from_dict(hparams)
    torch.set_num_threads(1)
    torch.manual_seed(seed)
    n, t_max = hp.num_envs, hp.num_steps
    batch = n * t_max
    minibatch = batch // hp.num_minibatches
    iterations = max(1, total_steps // batch)
    envs = gym.vector.SyncVectorEnv(
        [lambda: gym.make(env_id) for _ in range(n)], autoreset_mode=gym.vector.AutoresetMode.SAME_STEP
    )
    agent = Agent(envs, hp)
    optimizer = torch.optim.Adam(agent.parameters(), lr=hp.learning_rate, eps=1e-5)
    rms = RunningMeanStd(agent.obs_mean.numel())
    obs_dim = agent.obs_mean.numel()
    act_shape = () if agent.discrete else envs.single_action_space.shape

    obs_buf = np.zeros((t_max, n, obs_dim), np.float32)
    act_buf = np.zeros((t_max, n, *act_shape), np.float32)
    logp_buf, val_buf, rew_buf, done_buf = (np.zeros((t_max, n), np.float32) for _ in range(4))
    episodes: list[tuple[int, float]] = []
    ep_return = np.zeros(n)
    global_step = 0
    obs, _ = envs.reset(seed=seed)
    evals: list[tuple[int, float]] = []
    progress: list[tuple[int, float]] = []  # (global_step, training wall seconds) after every iteration
    eval_wall = eval_cpu = 0.0
    start, cpu_start = time.perf_counter(), time.process_time()
    first_iter_end = start
    for it in range(iterations):
        if hp.anneal_lr:
            optimizer.param_groups[0]["lr"] = hp.learning_rate * (1.0 - it / iterations)

        # Rollout: the normalisation statistics stay frozen until the update is done.
        for t in range(t_max):
            obs_t = torch.from_numpy(obs.astype(np.float32, copy=False))
            with torch.no_grad():
                action, logp, value = agent.act(obs_t)
            next_obs, reward, terminated, truncated, infos = envs.step(agent.to_env(action))
            obs_buf[t], act_buf[t], logp_buf[t], val_buf[t] = obs, action.numpy(), logp.numpy(), value.numpy()
            scaled = reward.astype(np.float32) * hp.reward_scale
            bootstrap = truncated & ~terminated
            if bootstrap.any():
                final_obs = torch.as_tensor(np.stack(infos["final_obs"][bootstrap]), dtype=torch.float32)
                with torch.no_grad():
                    scaled[bootstrap] += hp.gamma * agent.value(final_obs).numpy()
            rew_buf[t], done_buf[t] = scaled, terminated | truncated
            ep_return += reward
            global_step += n
            for i in np.flatnonzero(terminated | truncated):
                episodes.append((global_step, float(ep_return[i])))
                ep_return[i] = 0.0
            obs = next_obs
        with torch.no_grad():
            last_value = agent.value(torch.from_numpy(obs.astype(np.float32, copy=False))).numpy()
        adv, ret = gae(rew_buf, val_buf, done_buf, last_value, hp.gamma, hp.gae_lambda)

        # Update: ``update_epochs`` passes of shuffled minibatches.
        b_obs = torch.from_numpy(obs_buf.reshape(batch, obs_dim))
        b_act = torch.from_numpy(act_buf.reshape(batch, *act_shape))
        b_logp, b_adv, b_ret, b_val = (torch.from_numpy(a.reshape(batch)) for a in (logp_buf, adv, ret, val_buf))
        rollout = (b_obs, b_act, b_logp, b_adv, b_ret, b_val)
        for _ in range(hp.update_epochs):
            perm = torch.randperm(batch)
            for s in range(0, batch, minibatch):
                minibatch_update(agent, optimizer, hp, rollout, perm[s : s + minibatch])

        if hp.normalize_obs:
            rms.update(obs_buf.reshape(batch, obs_dim).astype(np.float64))
            agent.obs_mean.copy_(torch.as_tensor(rms.mean, dtype=torch.float32))
            agent.obs_var.copy_(torch.as_tensor(rms.var, dtype=torch.float32))
        if it == 0:
            first_iter_end = time.perf_counter()
        progress.append((global_step, time.perf_counter() - start - eval_wall))
        if eval_every and (it + 1) % eval_every == 0:
            t0, c0 = time.perf_counter(), time.process_time()
            evals.append((global_step, float(np.mean(evaluate(agent.env_action, env_id, seed, eval_every_episodes)))))
            eval_wall, eval_cpu = eval_wall + time.perf_counter() - t0, eval_cpu + time.process_time() - c0
            if stop_at_eval is not None and evals[-1][1] >= stop_at_eval:
                break
        if give_up_at is not None and global_step >= give_up_at:
            break
        if give_up_after_s is not None and progress[-1][1] >= give_up_after_s:
            break
    end = time.perf_counter() - eval_wall
    wall, cpu = end - start, time.process_time() - cpu_start - eval_cpu
    envs.close()
    steady = (global_step - batch) / (end - first_iter_end) if global_step > batch else global_step / wall
    return {
        "wall_time": wall,
        "cpu_time": cpu,
        "sps": global_step / wall,
        "sps_steady": steady,
        "global_step": global_step,
        "episodes": episodes,
        "evals": evals,
        "progress": progress,
        "eval_returns": evaluate(agent.env_action, env_id, seed, eval_episodes),
    }


if __name__ == "__main__":
    out = train("CartPole-v1", 20_000, 1)
    print({k: v for k, v in out.items() if k != "episodes"}, "episodes:", len(out["episodes"]))
