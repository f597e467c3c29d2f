"""The PPO training loop, top to bottom: set-up → (rollout → GAE → update → merge ranks → log → check → checkpoint)*.

A ``Trainer`` is one process, or one rank of a data-parallel run (``training/distributed.py``). Each rank
collects its own rollouts with its own envs and noise; the compiled train step averages the gradients of all
ranks (AllReduce), so every rank applies the same update to the same weights. Once per iteration the ranks
exchange what must agree (observation statistics) or what rank 0 logs (episodes, metrics). With one process
there is no exchange and no collective at all.

All randomness is explicit and recorded: rank r's env i resets with ``seed + r * num_envs + i``, weights come
from ``seed`` (identical on every rank), sampling noise and minibatch shuffles come from NumPy generators
seeded from ``[seed, stream]`` (rank 0, and a single process) or ``[seed, stream, rank]``. Together with
``resume.state`` this makes a resumed run bitwise-equal to an uninterrupted one.
"""

from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import mindspore as ms
import numpy as np
from mindspore import Tensor, nn

from inference.errors import INTERRUPTS, UsageError
from msrl_consistency import compat
from msrl_consistency.agent import ActorCritic, DeterministicPolicy, PolicySpec, RolloutPolicy
from msrl_consistency.agent.policy import unpack_rollout
from msrl_consistency.agent.preprocess import NORM_EPS, RunningMeanStd, batch_moments, merge_moments
from msrl_consistency.artifacts import run_dir as rd
from msrl_consistency.artifacts.checkpoint import restore_parameters
from msrl_consistency.artifacts.provenance import git_commit, versions
from msrl_consistency.config import TrainConfig
from msrl_consistency.envs import EnvInfo, describe_env, make_env
from msrl_consistency.envs.engines import make_training_envs, resolve_backend
from msrl_consistency.training import affinity
from msrl_consistency.training import distributed as dist
from msrl_consistency.training import precision as mp
from msrl_consistency.training.compile_cache import CompileCache
from msrl_consistency.training.gae import compute_gae
from msrl_consistency.training.ppo import STEP_METRICS, PPOLoss, PPOTrainStep, SplitUpdate
from msrl_consistency.training.profile import PROFILE_JSON, Profile, format_table, peak_rss_mb

METRIC_FIELDS = [
    "iteration", "global_step", "episodes", "return_mean", "length_mean", "learning_rate",
    *STEP_METRICS, "explained_variance", "sps", "wall_time",
]  # fmt: skip
EPISODE_FIELDS = ["global_step", "env", "return", "length"]
EVAL_FIELDS = ["iteration", "global_step", "return_mean", "return_min", "episodes", "seconds", "cpu_seconds"]
LOG_FIELDS = {"metrics": METRIC_FIELDS, "episodes": EPISODE_FIELDS, "evals": EVAL_FIELDS}
NOISE_STREAM, SHUFFLE_STREAM, RESUME_RESET_STREAM = 1, 2, 3
REWARD_CLIP = 10.0  # --normalize-reward clips the normalised rewards, as CleanRL's wrapper does
# Rows of an evaluation act call: episodes evaluated in lockstep (a MindSpore call's cost is flat in the batch).
EVAL_BATCH = 16


def stream_entropy(seed: int, stream: int, rank: int = 0) -> list[int]:
    """Seed material of one NumPy stream; rank 0's is the single-process one, so one worker changes nothing."""
    return [seed, stream] if rank == 0 else [seed, stream, rank]


def seed_streams(seed: int, rank: int = 0) -> tuple[np.random.Generator, np.random.Generator]:
    """Independent generators for sampling noise and minibatch shuffling, both derived from ``seed`` (and rank)."""
    return (
        np.random.default_rng(stream_entropy(seed, NOISE_STREAM, rank)),
        np.random.default_rng(stream_entropy(seed, SHUFFLE_STREAM, rank)),
    )


def seed_plan(cfg: TrainConfig, world_size: int) -> dict[str, Any]:
    """Every seed a run uses, per rank (recorded in run.json)."""
    n, s = cfg.num_envs, cfg.seed
    plan: dict[str, Any] = {
        "seed": s,
        "env_reset": f"seed + rank * num_envs + env_index ({s}..{s + world_size * n - 1})",
        "weights": s,
        "noise": stream_entropy(s, NOISE_STREAM),
        "shuffle": stream_entropy(s, SHUFFLE_STREAM),
        "eval": f"seed + 10000 + k ({s + 10_000}..)",
    }
    if world_size > 1:
        plan["ranks"] = [
            {"rank": r, "env_reset": [s + r * n, s + r * n + n - 1], "noise": stream_entropy(s, NOISE_STREAM, r),
             "shuffle": stream_entropy(s, SHUFFLE_STREAM, r)}
            for r in range(world_size)
        ]  # fmt: skip
    return plan


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


def build_learner(cfg: TrainConfig, spec: PolicySpec, world_size: int = 1) -> Learner:
    """``world_size > 1`` adds the gradient AllReduce (and, with ``adv_norm_scope=global``, the advantage one)."""
    policy = ActorCritic(spec, seed=cfg.seed)
    optimizer = nn.Adam(policy.trainable_params(), learning_rate=cfg.learning_rate, eps=1e-5)
    dtype = mp.compute_dtype(cfg.update_precision)
    loss = PPOLoss(policy, cfg.clip_coef, cfg.vf_coef, cfg.ent_coef, cfg.clip_vloss, dtype)
    train_step = PPOTrainStep(
        loss,
        optimizer,
        cfg.max_grad_norm,
        cfg.train_call_updates,
        cfg.norm_adv,
        grad_reducer=compat.grad_reducer(optimizer.parameters, world_size) if world_size > 1 else None,
        adv_world_size=world_size if cfg.adv_norm_scope == "global" else 1,
        loss_scale=mp.LossScale() if mp.needs_loss_scale(cfg.update_precision) else None,
    )
    return Learner(policy, RolloutPolicy(policy), optimizer, train_step)


@dataclass
class TrainResult:
    run_dir: Path
    global_step: int
    eval_returns: list[float] = field(default_factory=list)


class Trainer:
    """Owns the envs, the compiled Cells and the logs of one run (or of one rank of it)."""

    def __init__(
        self,
        cfg: TrainConfig,
        run_dir: Path,
        resume_state: dict[str, Any] | None = None,
        comm: dist.Comm | None = None,
    ) -> None:
        self.profile = Profile()
        self.profile.mark_rss("after imports")
        self.cfg, self.run_dir = cfg, run_dir
        self.comm = comm or dist.SingleProcess()
        self.rank, self.world_size = self.comm.rank, self.comm.world_size
        self.info = describe_env(cfg.env_id)
        # ``auto`` is resolved once and stored resolved (run.json's config), so a resume uses the same engine.
        self.backend = resolve_backend(cfg.env_id, cfg.env_backend, cfg.async_envs)
        cfg.env_backend = self.backend.name
        self.spec = build_spec(cfg, self.info)
        compat.set_device(cfg.device, dist.device_id_for(cfg.device, self.comm.local_rank))
        compat.set_threads(cfg.threads)
        compat.use_graph_mode()

        learner = build_learner(cfg, self.spec, self.world_size)
        self.policy, self.rollout_net = learner.policy, learner.rollout_net
        self.optimizer, self.train_step = learner.optimizer, learner.train_step
        # Hot-path calls skip Cell.__call__'s per-call bookkeeping (see compat.CompiledCall).
        self._train_call = compat.CompiledCall(self.train_step)
        self._rollout_call = compat.CompiledCall(self.rollout_net)
        self._split: SplitUpdate | None = SplitUpdate(self.train_step) if cfg.update_graphs == "split" else None
        if self._split is not None:
            self._split_calls = [compat.CompiledCall(c) for c in (self._split.prepare, self._split.gradients,
                                                                  self._split.apply)]  # fmt: skip
            self._minibatch = [Tensor(u, ms.int32) for u in range(cfg.iteration_updates)]
        self.rms = RunningMeanStd.zeros(self.spec.obs_dim)
        # --normalize-reward: running statistics of every env's discounted return (raw rewards), and the returns.
        self.ret_rms = RunningMeanStd.zeros(1)
        self.disc_return = np.zeros(cfg.num_envs)
        self.noise_rng, self.shuffle_rng = seed_streams(cfg.seed, self.rank)
        self.env_seed = cfg.seed + self.rank * cfg.num_envs  # env i resets with env_seed + i

        self.envs = make_training_envs(cfg.env_id, cfg.num_envs, self.backend.name, cfg.async_envs, cfg.env_threads,
                                       self.world_size)  # fmt: skip
        self._compiled: set[str] = set()  # graphs whose first (compiling) call is done
        self.iteration, self.global_step, self.episodes = 0, 0, 0
        self.ep_return = np.zeros(cfg.num_envs)
        self.ep_length = np.zeros(cfg.num_envs, dtype=np.int64)
        self.resume_exact = True
        self.reached_return: dict[str, Any] | None = None  # set when --stop-at-return ends the run early
        self.rank_checksums: list[str] = []
        # Once per run: git spawns subprocesses, and reading 4 packages' metadata took ~6 ms (a third of a checkpoint).
        self.git_commit = git_commit() if self.rank == 0 else None
        engine = ["envpool"] * (self.backend.name == "envpool")
        self.versions = versions("mindspore", "gymnasium", "numpy", *engine) if self.rank == 0 else {}
        self.fault = dist.injected_fault()
        if resume_state is None:
            self.obs, _ = self.envs.reset(seed=self.env_seed)
            keep = None
        else:
            self.restore(resume_state)
            keep = self.global_step
        self.recorder: rd.RunRecorder | rd.NullRecorder = (
            rd.RunRecorder(run_dir, LOG_FIELDS, keep, evals=cfg.eval_every > 0) if self.rank == 0 else rd.NullRecorder()
        )
        # After the envs exist (their worker processes keep every CPU) and before the graphs compile.
        env_threads = getattr(self.envs, "num_threads", 1)
        self.pinning = affinity.pin(cfg.cpu_pin, self.comm.local_rank, self.world_size,
                                    affinity.auto_reason(cfg.device, cfg.threads, env_threads))  # fmt: skip
        self._deterministic: compat.CompiledCall | None = None  # compiled once, on the first evaluation
        self._cache: CompileCache | None = None
        # Whether this run's graphs come from the compile cache (``use_compile_cache``), for run.json and the profile.
        self.compile_cache: dict[str, Any] = {"state": "off", "reason": "not opened for this process"}
        self.profile.add("setup", time.perf_counter() - self.profile.start)
        self.profile.mark_rss("after setup")

    # -- one iteration ------------------------------------------------------------------------------
    def collect(self) -> dict[str, np.ndarray]:
        """Run ``num_steps`` vector steps with frozen normalisation; bootstrap truncated episodes.

        ``finished`` rows are ``(step, env, return, length)`` of the episodes that ended.
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
        reward_factor = self.reward_factor()
        clock = time.perf_counter
        start, env_time, act_before = clock(), 0.0, self.profile.seconds["acting"] + self.profile.seconds["compile"]
        for t in range(t_max):
            noise = spec.sample_noise(self.noise_rng, n)
            raw, env_action, logp, value = unpack_rollout(self._act(self.obs, noise), spec)
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
                scaled[bootstrap] += cfg.gamma * self._values(final_obs)[bootstrap]
            buf["rewards"][t], buf["dones"][t] = scaled, done
            self.ep_return += reward
            self.ep_length += 1
            self.global_step += n * self.world_size
            for i in np.flatnonzero(done):
                finished.append((t, int(i), float(self.ep_return[i]), int(self.ep_length[i])))
                self.ep_return[i], self.ep_length[i] = 0.0, 0
            self.obs = next_obs
        last_value = self._values(self.obs)
        t0 = clock()
        adv, ret = compute_gae(buf["rewards"], buf["values"], buf["dones"], last_value, cfg.gamma, cfg.gae_lambda)
        gae_time = clock() - t0
        buf["advantages"], buf["returns"] = adv, ret
        buf["finished"] = np.array(finished, np.float64).reshape(-1, 4)
        if returns_seen is not None:
            buf["returns_seen"] = returns_seen
        acting = self.profile.seconds["acting"] + self.profile.seconds["compile"] - act_before
        prof = self.profile
        prof.add("env stepping", env_time, t_max)
        prof.add("GAE", gae_time)
        prof.add("rollout bookkeeping", clock() - start - env_time - gae_time - acting, t_max)
        return buf

    def update(self, buf: dict[str, np.ndarray]) -> dict[str, float]:
        """``update_epochs`` passes of shuffled minibatches through the compiled train step (means of its rows)."""
        cfg = self.cfg
        batch = cfg.batch_size
        flat = [
            Tensor(buf[k].reshape(batch, *buf[k].shape[2:]))
            for k in ("obs", "actions", "logp", "advantages", "returns", "values")
        ]
        sums = np.zeros(len(STEP_METRICS))
        count = 0
        per_call = self.train_step.updates_per_call
        # Every epoch's shuffle, drawn in order; a call's minibatches may span an epoch boundary.
        perms = np.stack([self.shuffle_rng.permutation(batch) for _ in range(cfg.update_epochs)]).astype(np.int32)
        if self._split is not None:
            return self._split_update(flat, perms.reshape(-1, cfg.minibatch_size))
        for idx in perms.reshape(-1, per_call, cfg.minibatch_size):
            t0 = time.perf_counter()
            sums += self._train_call(*flat, Tensor(idx)).asnumpy().sum(axis=0)
            self._timed("train", "update", time.perf_counter() - t0)
            count += per_call
        return dict(zip(STEP_METRICS, (sums / count).tolist(), strict=True))

    def _split_update(self, flat: list[Tensor], idx: np.ndarray) -> dict[str, float]:
        """``update`` as ``SplitUpdate``'s graphs: one prepare call, then gradients and apply per minibatch."""
        prepare, gradients, apply = self._split_calls
        obs, actions, logp, adv, returns, values = flat
        idx_t = Tensor(idx)
        t0 = time.perf_counter()
        x, actions, mb_adv = prepare(obs, actions, adv, idx_t)
        sums = np.zeros(len(STEP_METRICS))
        for u in range(len(idx)):
            aux, *grads = gradients(x, actions, logp, mb_adv, returns, values, idx_t, self._minibatch[u])
            apply(*grads)
            sums += aux.asnumpy()
        self._timed("train", "update", time.perf_counter() - t0)
        return dict(zip(STEP_METRICS, (sums / len(idx)).tolist(), strict=True))

    def merge_ranks(self, buf: dict[str, np.ndarray], stats: dict[str, float]) -> dict[str, Any]:
        """The one per-iteration exchange: every rank gets every rank's statistics, episodes and metrics.

        Merged in rank order with the same arithmetic on every rank; for one process it is the identity (same
        floats as before data parallel existed).
        """
        t0 = time.perf_counter()
        moments = batch_moments(buf["obs"], self.spec.obs_dim) if self.cfg.normalize_obs else None
        ret_moments = batch_moments(buf["returns_seen"], 1) if self.cfg.normalize_reward else None
        self.profile.add("normaliser statistics", time.perf_counter() - t0)
        report = {
            "moments": moments,
            "ret_moments": ret_moments,
            "finished": buf["finished"],
            "stats": stats,
            "values": buf["values"].ravel(),
            "returns": buf["returns"].ravel(),
            "stop": INTERRUPTS.requested,  # Ctrl-C on any rank stops every rank after this same iteration
        }
        with self.profile.section("rank exchange"):
            reports = self.comm.gather(report)
        finished = np.concatenate(
            [np.column_stack([r["finished"], np.full(len(r["finished"]), rank)]) for rank, r in enumerate(reports)]
        )
        finished = finished[np.lexsort((finished[:, 1], finished[:, 4], finished[:, 0]))]  # by step, rank, env
        t0 = time.perf_counter()
        moments = merge_moments([r["moments"] for r in reports]) if self.cfg.normalize_obs else None
        ret_moments = merge_moments([r["ret_moments"] for r in reports]) if self.cfg.normalize_reward else None
        self.profile.add("normaliser statistics", time.perf_counter() - t0, 0)
        return {
            "moments": moments,
            "ret_moments": ret_moments,
            "finished": finished,  # step, env, return, length, rank
            "stats": {k: sum(r["stats"][k] for r in reports) / len(reports) for k in STEP_METRICS},
            "values": np.concatenate([r["values"] for r in reports]),
            "returns": np.concatenate([r["returns"] for r in reports]),
            "stop": any(r["stop"] for r in reports),
        }

    def run(self, progress: Any = None, stop_at: int | None = None) -> None:
        """Train to the end of the run, or only up to iteration ``stop_at`` (to resume later).

        A first Ctrl-C (or SIGTERM) lets the current iteration finish, checkpoints it and then raises
        ``KeyboardInterrupt``; a second one exits at once (``inference.errors.Interrupts``), keeping the last
        complete checkpoint.
        """
        with INTERRUPTS.deferred():
            self._run(progress, stop_at)

    def _run(self, progress: Any, stop_at: int | None) -> None:
        cfg = self.cfg
        start_time, start_step = time.perf_counter(), self.global_step
        eval_time = 0.0  # periodic evaluations are not training time: excluded from SPS and wall_time
        self.compile_graphs()  # training time, like the first calls that compiled them before
        last = cfg.num_iterations if stop_at is None else min(stop_at, cfg.num_iterations)
        while self.iteration < last:
            self._inject_fault()
            lr = cfg.learning_rate * (1.0 - self.iteration / cfg.num_iterations if cfg.anneal_lr else 1.0)
            self.optimizer.learning_rate.set_data(Tensor(lr, ms.float32))
            first_step = self.global_step
            buf = self.collect()
            try:
                stats = self.update(buf)
            except RuntimeError as exc:
                if self.world_size == 1:
                    raise
                raise dist.lost_rank(exc, f"updating at iteration {self.iteration + 1}") from None
            merged = self.merge_ranks(buf, stats)
            if cfg.normalize_obs:
                # Statistics change only between iterations, so a rollout and its update see the same graph.
                t0 = time.perf_counter()
                self.rms.update_from_moments(*merged["moments"])
                self.rms.copy_to(self.policy.normalizer)
                self.profile.add("normaliser statistics", time.perf_counter() - t0, 0)
            if cfg.normalize_reward:
                self.ret_rms.update_from_moments(*merged["ret_moments"])
            self.iteration += 1
            finished = merged["finished"]
            self.episodes += len(finished)
            elapsed = time.perf_counter() - start_time - eval_time
            sps = (self.global_step - start_step) / max(elapsed, 1e-9)
            row = {
                "iteration": self.iteration,
                "global_step": self.global_step,
                "episodes": self.episodes,
                "return_mean": float(finished[:, 2].mean()) if len(finished) else "",
                "length_mean": float(finished[:, 3].mean()) if len(finished) else "",
                "learning_rate": lr,
                **merged["stats"],
                "explained_variance": explained_variance(merged["values"], merged["returns"]),
                "sps": round(sps, 1),
                "wall_time": round(elapsed, 3),
            }
            n = cfg.num_envs
            episodes = [
                {"global_step": first_step + (int(t) + 1) * n * self.world_size, "env": int(rank) * n + int(i),
                 "return": float(ret), "length": int(length)}
                for t, i, ret, length, rank in finished
            ]  # fmt: skip
            with self.profile.section("logging"):
                self.recorder.iteration(row, episodes)
                if progress is not None:
                    progress.update(cfg.global_batch_size)
                    if len(finished):
                        progress.set_postfix(ret=f"{row['return_mean']:.1f}", sps=f"{sps:.0f}")
            if cfg.eval_every and self.iteration % cfg.eval_every == 0:
                seconds, mean = self._periodic_eval()
                eval_time += seconds
                # Every rank evaluates the same weights on the same seeds, so every rank stops here alike.
                if cfg.stop_at_return and mean >= float(cfg.stop_at_return):
                    self.reached_return = {"return_mean": mean, "global_step": self.global_step,
                                           "iteration": self.iteration}  # fmt: skip
            done = self.reached_return is not None
            if (self.iteration % cfg.checkpoint_every == 0 or self.iteration == cfg.num_iterations or merged["stop"]
                    or done):  # fmt: skip
                self.checkpoint()  # checks consistency first
            elif self.iteration % cfg.check_every == 0:
                with self.profile.section("checkpoints"):
                    self.check_consistency()
            if merged["stop"]:
                raise KeyboardInterrupt(f"interrupted after iteration {self.iteration}")
            if done:
                return

    # -- agreement between ranks ------------------------------------------------------------------------
    def named_state(self) -> dict[str, np.ndarray]:
        """What every rank must hold bit for bit: all train-step Parameters and the host statistics."""
        state = {p.name: p.asnumpy() for p in self.train_step.get_parameters()}
        state["host.obs_mean"], state["host.obs_var"] = self.rms.mean, self.rms.var
        state["host.obs_count"] = np.float64(self.rms.count)
        state["host.return_mean"], state["host.return_var"] = self.ret_rms.mean, self.ret_rms.var
        state["host.return_count"] = np.float64(self.ret_rms.count)
        return state

    def check_consistency(self, named: dict[str, np.ndarray] | None = None) -> list[str]:
        """Compare every rank's state checksum; stop the run on any difference, naming ranks and parameter.
        ``named``: this rank's ``named_state()`` when the caller already holds it."""
        per_rank = self.comm.gather(dist.state_digests(self.named_state() if named is None else named))
        problem = dist.find_divergence(per_rank)
        if problem:
            raise dist.RankDivergence(f"at iteration {self.iteration}: {problem}")
        self.rank_checksums = [dist.checksum(d) for d in per_rank]
        return self.rank_checksums

    # -- evaluation -----------------------------------------------------------------------------------
    def evaluate(self, episodes: int) -> list[float]:
        """Deterministic episodes (argmax / mean action) on seeds ``seed + 10_000 + k``, shared out over ranks.

        Touches no training RNG stream or env, so evaluating during a run leaves its training bitwise unchanged.
        Rank r plays episodes k = r, r + W, ..., up to ``EVAL_BATCH`` of them at a time in lockstep; every rank
        returns all returns in episode order.
        """
        if self._deterministic is None:
            t0 = time.perf_counter()
            self._compile_deterministic()
            self.profile.add("compile", time.perf_counter() - t0)
        with self.profile.section("evaluation"):
            ks = list(range(self.rank, episodes, self.world_size))
            mine: dict[int, float] = {}
            for start in range(0, len(ks), EVAL_BATCH):
                chunk = ks[start : start + EVAL_BATCH]
                mine.update(zip(chunk, self._eval_episodes(chunk), strict=True))
            merged: dict[int, float] = {}
            for part in self.comm.gather(mine):
                merged.update(part)
        return [merged[k] for k in range(episodes)]

    def _compile_deterministic(self) -> None:
        self._deterministic = compat.CompiledCall(DeterministicPolicy(self.policy))
        with compat.gc_frozen():  # no state, no RNG
            self._deterministic(Tensor(np.zeros((EVAL_BATCH, self.spec.obs_dim), np.float32)))

    def _eval_episodes(self, ks: list[int]) -> list[float]:
        """Episodes ``ks`` (at most ``EVAL_BATCH``), each in its own env, with one act call per step for all of them.

        Every call has ``EVAL_BATCH`` rows; a finished episode's row (and an unused one) holds a stale observation
        whose action is dropped. The batch is fixed because MindSpore's CPU matmul rounds a row's last bits
        differently for different batch sizes (a row does not depend on the other rows), so an episode's return
        does not depend on how many episodes, or ranks, evaluate.
        """
        envs = [make_env(self.cfg.env_id) for _ in ks]
        obs = np.zeros((EVAL_BATCH, self.spec.obs_dim), np.float32)
        for i, (env, k) in enumerate(zip(envs, ks, strict=True)):
            obs[i] = env.reset(seed=self.cfg.seed + 10_000 + k)[0]
        totals, live = [0.0] * len(ks), [True] * len(ks)
        while any(live):
            actions = self._deterministic(Tensor(obs))[0].asnumpy()
            for i, env in enumerate(envs):
                if live[i]:
                    obs[i], reward, terminated, truncated, _ = env.step(
                        int(actions[i]) if self.spec.discrete else actions[i]
                    )
                    totals[i] += float(reward)
                    live[i] = not (terminated or truncated)
        for env in envs:
            env.close()
        return totals

    def _periodic_eval(self) -> tuple[float, float]:
        """``evaluate`` during training, logged to evals.csv with its wall and CPU seconds (so that benchmarks can
        take both out of the training's figures); returns (wall seconds, mean return)."""
        start, cpu_start = time.perf_counter(), time.process_time()
        returns = self.evaluate(self.cfg.eval_episodes)
        seconds, cpu_seconds = time.perf_counter() - start, time.process_time() - cpu_start
        self.recorder.evaluation(
            {"iteration": self.iteration, "global_step": self.global_step, "return_mean": float(np.mean(returns)),
             "return_min": float(np.min(returns)), "episodes": len(returns), "seconds": round(seconds, 3),
             "cpu_seconds": round(cpu_seconds, 3)}
        )  # fmt: skip
        return seconds, float(np.mean(returns))

    # -- persistence (the files themselves: artifacts/run_dir.py) ------------------------------------------
    def shared_state(self, named: dict[str, np.ndarray]) -> dict[str, Any]:
        """What every rank holds identically (``named``: the ``named_state()`` that ``check_consistency`` checked)."""
        return {
            "env_id": self.cfg.env_id,
            "world_size": self.world_size,
            "iteration": self.iteration,
            "global_step": self.global_step,
            "episodes": self.episodes,
            "params": {p.name: named[p.name] for p in self.train_step.get_parameters()},
            "rms": (self.rms.mean, self.rms.var, self.rms.count),
            "ret_rms": (self.ret_rms.mean, self.ret_rms.var, self.ret_rms.count),
        }

    def local_state(self) -> dict[str, Any]:
        """What this rank alone owns: its RNG streams, envs and unfinished episodes."""
        blobs = self.envs.get_attr("state_blob")
        return {
            "noise_rng": self.noise_rng.bit_generator.state,
            "shuffle_rng": self.shuffle_rng.bit_generator.state,
            "obs": self.obs,
            "env_blobs": None if any(b is None for b in blobs) else list(blobs),
            "ep_return": self.ep_return,
            "ep_length": self.ep_length,
            "disc_return": self.disc_return,
        }

    def checkpoint(self, eval_returns: list[float] | None = None) -> None:
        """Check the ranks agree, gather every rank's own state, and let rank 0 write the checkpoint."""
        with self.profile.section("checkpoints"):
            named = self.named_state()  # one copy of the Parameters for the check and the checkpoint
            self.check_consistency(named)
            ranks = self.comm.gather(self.local_state())
            if self.rank == 0:
                state = {**self.shared_state(named), "ranks": ranks}
                self.recorder.checkpoint(self.policy, state, self.run_info(eval_returns))

    def restore(self, state: dict[str, Any]) -> None:
        """Continue from a ``resume.state`` (see ``rd.load_resume_state``) with the same world size."""
        rd.check_world_size(self.run_dir, state["world_size"], self.world_size)
        restore_parameters({p.name: p for p in self.train_step.get_parameters()}, state["params"], "resume state")
        self.rms = RunningMeanStd(*state["rms"])
        self.rms.copy_to(self.policy.normalizer)
        if "ret_rms" in state:  # resume states from before --normalize-reward hold neither
            self.ret_rms = RunningMeanStd(*state["ret_rms"])
        self.iteration, self.global_step, self.episodes = state["iteration"], state["global_step"], state["episodes"]
        mine = state["ranks"][self.rank]
        self.noise_rng.bit_generator.state = mine["noise_rng"]
        self.shuffle_rng.bit_generator.state = mine["shuffle_rng"]
        self.ep_return, self.ep_length = mine["ep_return"], mine["ep_length"]
        self.disc_return = mine.get("disc_return", np.zeros(self.cfg.num_envs))
        if mine["env_blobs"] is not None:
            self.envs.set_attr("state_blob", mine["env_blobs"])
            self.obs = mine["obs"]
        else:
            # Envs holding C handles cannot be snapshotted: restart their episodes from a derived seed.
            self.resume_exact = False
            self.obs, _ = self.envs.reset(seed=self.env_seed + RESUME_RESET_STREAM * 1_000_003 + self.iteration)
            self.ep_return[:], self.ep_length[:] = 0.0, 0
            self.disc_return[:] = 0.0

    def run_info(self, eval_returns: list[float] | None = None) -> dict[str, Any]:
        cfg = self.cfg
        scale = self.train_step.loss_scale
        return rd.run_info(
            cfg=cfg.to_dict(),
            env=self.info.to_dict(),
            policy_spec=self.spec.to_dict(),
            normalization={
                "mean": self.rms.mean.tolist(),
                "var": self.rms.var.tolist(),
                "count": self.rms.count,
                "clip": cfg.clip_obs,
                "enabled": cfg.normalize_obs,
                "reward": {"enabled": cfg.normalize_reward, "return_var": float(self.ret_rms.var[0]),
                           "count": self.ret_rms.count, "factor": self.reward_factor(), "clip": REWARD_CLIP},
            },
            seeds=seed_plan(cfg, self.world_size),
            progress={
                "iteration": self.iteration,
                "global_step": self.global_step,
                "episodes": self.episodes,
                "resume_exact": self.resume_exact,
                "env_backend": self.backend.to_dict(),
                "env_steppers": self.env_steppers(),
                "stopped_at_return": self.reached_return,
                "peak_rss_mb": round(peak_rss_mb(), 1),
                "rss_mb": self.profile.rss_marks(),
                "private_rss_mb": self.profile.private_rss_marks(),
                "cpu_pin": self.pinning.describe(),
            },
            distributed={
                "world_size": self.world_size,
                "rank_checksums": list(self.rank_checksums),
                "data_parallel": None
                if self.world_size == 1
                else {
                    "backend": compat.collective_backend(cfg.device),
                    "gradients": f"AllReduce mean in the train step, fused ({compat.ALLREDUCE_FUSION_MB} MB buckets)",
                    "advantage_normalisation": cfg.adv_norm_scope,
                    "observation_statistics": "merged over ranks every iteration (count, mean, M2)",
                    "envs_per_rank": cfg.num_envs,
                },
            },  # fmt: skip
            precision={
                "update": cfg.update_precision,
                "master_weights": "fp32",
                "rollouts": "fp32",
                "loss_scale": None if scale is None else float(scale.scale.asnumpy()),
                "skipped_updates": None if scale is None else int(scale.skipped.asnumpy()),
            },
            versions=self.versions,
            compile_cache=self.compile_cache,
            git_commit=self.git_commit,
            eval_returns=eval_returns,
        )

    # -- compiled graphs -------------------------------------------------------------------------------
    def use_compile_cache(self) -> None:
        """Load and save this run's graphs through the compile cache (``training/compile_cache.py``). A process's
        entry point calls it before the run's first compile; ``close`` publishes what was compiled."""
        self._cache = CompileCache.open(self.cfg.to_dict(), self.spec.to_dict(), self.world_size)
        self.compile_cache = self._cache.describe()

    def compile_graphs(self) -> None:
        """Compile the run's graphs now, in one fixed order: act, train step, then the evaluation policy if the run
        evaluates. The compile cache numbers a process's graphs by compile order (``training/compile_cache.py``),
        so the order must not depend on how a run goes (a resumed finished run would evaluate before it acts).
        Nothing changes state: act and evaluation run on dummy inputs, the train step is compiled without running.
        With ``graph_kernel`` the act and train-step graphs are fused; the evaluation policy is not (it is what
        export and verify compute).
        """
        if "act" in self._compiled:
            return
        t0 = time.perf_counter()
        with compat.gc_frozen():  # MindSpore collects garbage before each compile: only new objects are looked at
            if self.cfg.graph_kernel:
                if blocker := compat.graph_kernel_blocker():  # checked first: a compile's own errors stay as they are
                    raise UsageError(f"--graph-kernel true: {blocker}")
                with compat.graph_kernel_fusion():
                    self._compile_training_graphs()
            else:
                self._compile_training_graphs()
            graphs = 2 if self._split is None else 4
            if self.cfg.eval_episodes > 0 and self._deterministic is None:
                self._compile_deterministic()
                graphs += 1
        self._compiled.update({"act", "train"})
        self.profile.add("compile", time.perf_counter() - t0, graphs)
        self.profile.mark_rss("after compile")

    def _compile_training_graphs(self) -> None:
        cfg, spec = self.cfg, self.spec
        self._rollout_call(Tensor(np.zeros((cfg.num_envs, spec.obs_dim), np.float32)),
                           Tensor(np.full((cfg.num_envs, spec.noise_dim), 0.5, np.float32)))  # fmt: skip
        rows, per_call = cfg.batch_size, self.train_step.updates_per_call
        act_shape = () if spec.discrete else (spec.action_dim,)
        shapes = [(rows, spec.obs_dim), (rows, *act_shape), (rows,), (rows,), (rows,), (rows,)]  # as in ``update``
        zeros = [Tensor(np.zeros(shape, np.float32)) for shape in shapes]
        if self._split is None:
            self.train_step.compile(*zeros, Tensor(np.zeros((per_call, cfg.minibatch_size), np.int32)))
        else:  # prepare, gradients, apply: each run once on zeros would change Adam's state, so compile only
            obs, actions, logp, adv, returns, values = zeros
            idx = Tensor(np.zeros((cfg.iteration_updates, cfg.minibatch_size), np.int32))
            x, acts, mb_adv = self._split_calls[0](obs, actions, adv, idx)  # stateless: running it is harmless
            self._split.gradients.compile(x, acts, logp, mb_adv, returns, values, idx, self._minibatch[0])
            self._split.apply.compile(*(Tensor(np.zeros(p.shape, np.float32)) for p in self.optimizer.parameters))

    def reward_factor(self) -> float:
        """What rewards are multiplied by in this iteration's rollout: ``reward_scale``, divided by the running std
        of the discounted return with --normalize-reward (frozen for the iteration, like the observation
        statistics)."""
        if not self.cfg.normalize_reward:
            return self.cfg.reward_scale
        return self.cfg.reward_scale / float(np.sqrt(self.ret_rms.var[0] + NORM_EPS))

    # -- hot-path helpers -----------------------------------------------------------------------------
    def _act(self, obs: np.ndarray, noise: np.ndarray) -> np.ndarray:
        t0 = time.perf_counter()
        out = self._rollout_call(Tensor(obs.astype(np.float32, copy=False)), Tensor(noise)).asnumpy()
        self._timed("act", "acting", time.perf_counter() - t0)
        return out

    def _timed(self, graph: str, section: str, seconds: float) -> None:
        """Book a compiled call under ``section``, or under ``compile`` if it was the graph's first call."""
        if graph in self._compiled:
            self.profile.add(section, seconds)
        else:
            self._compiled.add(graph)
            self.profile.add("compile", seconds)

    def env_steppers(self) -> dict[str, Any]:
        """How the training envs step: EnvPool threads, or gymnasium processes (this one and helpers, with the
        helpers' peak RSS, which ``peak_rss_mb`` of this process does not count)."""
        if self.backend.name == "envpool":
            return {"threads": self.envs.num_threads}
        helpers = [round(m, 1) for m in getattr(self.envs, "helpers_peak_rss_mb", list)()]
        return {"processes": getattr(self.envs, "num_workers", 1), "helpers_peak_rss_mb": helpers}

    def profile_report(self) -> dict[str, Any]:
        """profile.json's content (see ``training/profile.py``)."""
        cfg = self.cfg
        return self.profile.report(self.global_step, {
            "env_id": cfg.env_id, "env_backend": self.backend.to_dict(), "env_steppers": self.env_steppers(),
            "num_envs": cfg.num_envs,
            "num_steps": cfg.num_steps, "hidden_sizes": list(cfg.hidden_sizes), "world_size": self.world_size,
            "iterations": self.iteration, "act_calls_per_env_step": round(1 / cfg.num_envs, 4),
            "compile_cache": self.compile_cache["state"], "cpu_pin": self.pinning.describe(),
        })  # fmt: skip

    def write_profile(self) -> str:
        """Write profile.json (rank 0) and return the table to print."""
        report = self.profile_report()
        if self.rank == 0:
            from inference.files import write_json_atomic

            write_json_atomic(self.run_dir / PROFILE_JSON, report)
        return format_table(report)

    def _values(self, obs: np.ndarray) -> np.ndarray:
        """Critic values through the rollout graph (same batch shape, so no recompilation)."""
        noise = np.full((len(obs), self.spec.noise_dim), 0.5, np.float32)
        return unpack_rollout(self._act(obs, noise), self.spec)[3]

    def _inject_fault(self) -> None:
        """``MSRL_TRAIN_FAULT`` (tests only, see ``distributed.injected_fault``)."""
        fault = self.fault
        if fault is None or fault.rank != self.rank or fault.iteration != self.iteration:
            return
        if fault.kind == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        elif fault.kind == "perturb":
            weight = self.policy.actor.layers[0].weight
            weight.set_data(Tensor(weight.asnumpy() + np.float32(1e-3)))
        else:
            raise UsageError(f"{dist.FAULT_ENV}: unknown fault kind {fault.kind!r}")

    def close(self) -> None:
        if self._cache is not None:
            self._cache.close()
        self.recorder.close()
        self.envs.close()
        self.pinning.restore()  # a caller that goes on in this process gets its CPUs back


def explained_variance(values: np.ndarray, returns: np.ndarray) -> float:
    var_ret = float(np.var(returns))
    return float("nan") if var_ret == 0 else 1.0 - float(np.var(returns - values)) / var_ret
