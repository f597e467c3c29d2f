"""The PPO training loop, top to bottom like CleanRL's ``ppo_continuous_action.py``: set-up, then per iteration
collect (rollout and GAE) → update → merge ranks → log → evaluate → checkpoint.

A ``Trainer`` is one process, or one rank of a data-parallel run (``training/distributed/``). Each rank
collects its own rollouts with its own envs and noise; the compiled train step averages the gradients of all
ranks (AllReduce), so every rank applies the same update to the same weights. Once per iteration the ranks
exchange what must agree (observation statistics) or what rank 0 logs (episodes, metrics). With one process
there is no exchange and no collective at all.

Each step has its own module: the seeds (``seeds.py``), the Cells and the update (``learner.py``), the rollout
(``rollout.py``), evaluation (``evaluate.py``), the exchange and consistency check (``distributed.py``), and what a
checkpoint takes and ``--resume`` gives back (``training/run_state.py``).
"""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import mindspore as ms
import numpy as np
from mindspore import Tensor

from inference.errors import INTERRUPTS, UsageError
from msrl_consistency import compat
from msrl_consistency.agent.preprocess import RunningMeanStd
from msrl_consistency.artifacts import run_dir as rd
from msrl_consistency.artifacts.provenance import git_commit, versions
from msrl_consistency.config import TrainConfig
from msrl_consistency.envs import describe_env
from msrl_consistency.envs.engines import resolve_backend
from msrl_consistency.training import affinity, lowering
from msrl_consistency.training import distributed as dist
from msrl_consistency.training.compile_cache import CompileCache
from msrl_consistency.training.evaluate import Evaluator
from msrl_consistency.training.gae import compute_gae
from msrl_consistency.training.learner import Updater, build_spec, learner_for_run, release
from msrl_consistency.training.ppo import STEP_METRICS
from msrl_consistency.training.profile import Profile, format_table, write_report
from msrl_consistency.training.rollout import Rollout, engines, reward_factor
from msrl_consistency.training.run_state import RunState
from msrl_consistency.training.seeds import env_seed, seed_streams

METRIC_FIELDS = [
    "iteration", "global_step", "episodes", "return_mean", "length_mean", "learning_rate",
    *STEP_METRICS, "explained_variance", "sps", "wall_time",
]  # fmt: skip
STOPPING = "stopping: this iteration finishes and is checkpointed (a second Ctrl-C exits at once)"
EPISODE_FIELDS = ["global_step", "env", "return", "length"]
EVAL_FIELDS = ["iteration", "global_step", "return_mean", "return_min", "episodes", "seconds", "cpu_seconds"]
LOG_FIELDS = {"metrics": METRIC_FIELDS, "episodes": EPISODE_FIELDS, "evals": EVAL_FIELDS}
IterationHook = Callable[["Trainer"], None]


class Trainer(RunState):
    """Owns the envs, the compiled Cells and the logs of one run (or of one rank of it).

    ``on_iteration`` is called with the Trainer as each iteration starts (``iteration`` = iterations done): a way
    in for code that wraps a run, such as the tests' fault injection (``tests/fault_train.py``).
    """

    def __init__(
        self,
        cfg: TrainConfig,
        run_dir: Path,
        resume_state: dict[str, Any] | None = None,
        comm: dist.Comm | None = None,
        on_iteration: IterationHook | None = None,
    ) -> None:
        self.profile = Profile()
        self.profile.mark_rss("after imports")
        self.cfg, self.run_dir, self.on_iteration = cfg, run_dir, on_iteration
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

        # Resolved before the learner: its train step weights the rows when another engine acts.
        cfg.rollout_engine, self.rollout_engine_reason = engines.resolve(cfg.rollout_engine, cfg.lower, cfg.device)
        self.learner = learner = learner_for_run(cfg, self.spec, self.world_size)
        self._released = False
        self.policy, self.optimizer, self.train_step = learner.policy, learner.optimizer, learner.train_step
        noise_rng, shuffle_rng = seed_streams(cfg.seed, self.rank)
        self.updater = Updater(cfg, learner, shuffle_rng, self.profile)
        self.rms = RunningMeanStd.zeros(self.spec.obs_dim)
        self.ret_rms = RunningMeanStd.zeros(1)  # --normalize-reward: statistics of every env's discounted return
        cache = engines.export_cache(cfg.to_dict(), self.spec.to_dict(), self.world_size)
        acting = engines.make_engine(cfg.rollout_engine, learner.rollout_net, self.spec, cfg.num_envs, cache)
        self.correction = engines.Correction(self.policy, self.profile) if acting.corrects else None
        self.mismatch: dict[str, float] = {}  # the last rollout's, when another engine acted (log fields)
        self.mismatch_worst: dict[str, float] = {}
        self.rollout = Rollout(cfg, self.spec, acting, noise_rng, env_seed(cfg, self.rank), self.backend.name,
                               self.world_size, self.profile)  # fmt: skip
        self.evaluator = Evaluator(cfg.env_id, cfg.seed, self.spec, learner.evaluation, self.comm, self.profile)
        self.iteration, self.global_step, self.episodes = 0, 0, 0
        self.resume_exact = True
        self.reached_return: dict[str, Any] | None = None  # set when --stop-at-return ends the run early
        self.rank_checksums: list[str] = []
        # Once per run: git spawns subprocesses, and reading 4 packages' metadata took ~6 ms (a third of a checkpoint).
        self.git_commit = git_commit() if self.rank == 0 else None
        engine = ["envpool"] * (self.backend.name == "envpool")
        self.versions = versions("mindspore", "gymnasium", "numpy", *engine) if self.rank == 0 else {}
        self.lowered_cost: dict[str, float] = {}  # --lower: the lowered actor against its fp32 shadow (log fields)
        self.shadow = lowering.Shadow(self.policy.actor) if cfg.lower != "fp32" else None
        self.started_from: dict[str, Any] | None = None  # --init-from: the run it started from
        if resume_state is None:
            self.rollout.reset()
            keep = None
            if cfg.init_from:
                self.rms, self.started_from = lowering.init_from(self.policy, cfg.init_from)
        else:
            self.restore(resume_state)
            keep = self.global_step
        extra = list(lowering.LOG_FIELDS if cfg.lower != "fp32" else []) + (engines.MISMATCH_FIELDS * acting.corrects)
        fields = {**LOG_FIELDS, "metrics": METRIC_FIELDS + extra}
        self.recorder: rd.RunRecorder | rd.NullRecorder = (
            rd.RunRecorder(run_dir, fields, keep, evals=cfg.eval_every > 0) if self.rank == 0 else rd.NullRecorder()
        )
        # After the envs exist (their worker processes keep every CPU) and before the graphs compile.
        env_threads = getattr(self.rollout.envs, "num_threads", 1)
        self.pinning = affinity.pin(cfg.cpu_pin, self.comm.local_rank, self.world_size,
                                    affinity.auto_reason(cfg.device, cfg.threads, env_threads))  # fmt: skip
        self._cache: CompileCache | None = None
        # Whether this run's graphs come from the compile cache (``use_compile_cache``) or an earlier run in this
        # process (``learner_for_run``), for run.json and the profile.
        self.compile_cache: dict[str, Any] = (
            {"state": "reused", "reason": "the graphs of an earlier run in this process (same graph key)"}
            if learner.reused
            else {"state": "off", "reason": "not opened for this process"}
        )
        self.profile.add("setup", time.perf_counter() - self.profile.start)
        self.profile.mark_rss("after setup")

    # -- the loop -------------------------------------------------------------------------------------------------
    def run(self, progress: Any = None, stop_at: int | None = None) -> None:
        """Train to the end of the run, or only up to iteration ``stop_at`` (to resume later).

        A first Ctrl-C (or SIGTERM) lets the current iteration finish, checkpoints it and then raises
        ``KeyboardInterrupt``; a second one exits at once (``inference.errors.Interrupts``), keeping the last
        complete checkpoint.
        """
        with INTERRUPTS.deferred(STOPPING):
            self._run(progress, stop_at)

    def _run(self, progress: Any, stop_at: int | None) -> None:
        cfg = self.cfg
        start_time, start_step = time.perf_counter(), self.global_step
        eval_time = 0.0  # periodic evaluations are not training time: excluded from SPS and wall_time
        self.compile_graphs()  # training time, like the first calls that compiled them before
        self.push_weights()
        last = cfg.num_iterations if stop_at is None else min(stop_at, cfg.num_iterations)
        if cfg.lower == "int8" and self.iteration == 0:  # ranges from the states the policy visits before it trains
            lowering.calibrate(self.policy, self.rollout.collect(reward_factor(cfg, self.ret_rms))["obs"])
        while self.iteration < last:
            if self.on_iteration is not None:
                self.on_iteration(self)
            lr = cfg.learning_rate * (1.0 - self.iteration / cfg.num_iterations if cfg.anneal_lr else 1.0)
            self.optimizer.learning_rate.set_data(Tensor(lr, ms.float32))
            first_step = self.global_step
            buf = self.collect()  # rollout, then advantages
            stats = self.update(buf)
            if cfg.lower != "fp32":  # what the numerics cost, on the rollout just trained on
                self.lowered_cost = lowering.shadow_mismatch(self.policy, self.shadow, buf["obs"], buf["actions"])
            merged = self.merge_ranks(buf, stats)
            self.update_statistics(merged)
            self.push_weights()
            if cfg.lower == "int8":
                lowering.calibrate(self.policy, buf["obs"])
            self.iteration += 1
            self.episodes += len(merged["finished"])
            elapsed = time.perf_counter() - start_time - eval_time
            self.log(lr, first_step, merged, (self.global_step - start_step) / max(elapsed, 1e-9), elapsed, progress)
            if cfg.eval_every and self.iteration % cfg.eval_every == 0:
                eval_time += self.periodic_evaluation()
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

    def collect(self) -> dict[str, np.ndarray]:
        """A rollout with this iteration's frozen statistics and its advantages: what ``update`` trains on."""
        cfg = self.cfg
        buf = self.rollout.collect(reward_factor(cfg, self.ret_rms))
        self.global_step += cfg.num_steps * cfg.num_envs * self.world_size
        self.correct(buf)
        self.advantages(buf)
        return buf

    def correct(self, buf: dict[str, np.ndarray]) -> None:
        """Another engine acted: the learner's own log-probabilities and the truncated importance weights
        (``rollout.engines``), the mismatch logged and warned about; else every weight is 1."""
        if self.correction is None:
            buf["is_weights"] = np.ones_like(buf["logp"])
            return
        self.mismatch = self.correction.apply(buf)
        engines.keep_worst(self.mismatch_worst, self.mismatch)
        why = engines.unhealthy(self.mismatch)
        if why and self.rank == 0:
            print(f"warning: iteration {self.iteration + 1}: the {self.cfg.rollout_engine} rollouts act as another "
                  f"policy than the learner's ({why})", file=sys.stderr)  # fmt: skip

    def push_weights(self) -> None:
        """The learner's Parameters (weights and observation statistics) to the engine that acts."""
        with self.profile.section("weight push"):
            self.rollout.engine.push()

    def advantages(self, buf: dict[str, np.ndarray]) -> None:
        """GAE advantages and returns, bootstrapped from the value of the observations the rollout ended on."""
        cfg = self.cfg
        with self.profile.section("GAE"):
            buf["advantages"], buf["returns"] = compute_gae(
                buf["rewards"], buf["values"], buf["dones"], buf["last_value"], cfg.gamma, cfg.gae_lambda
            )

    def update(self, buf: dict[str, np.ndarray]) -> dict[str, float]:
        """The PPO update of one iteration; the means of the train step's metrics."""
        try:
            return self.updater.update(buf)
        except RuntimeError as exc:
            if self.world_size == 1:
                raise
            raise dist.lost_rank(exc, f"updating at iteration {self.iteration + 1}") from None

    def merge_ranks(self, buf: dict[str, np.ndarray], stats: dict[str, float]) -> dict[str, Any]:
        return dist.exchange(self.comm, self.cfg, self.spec.obs_dim, buf, stats, self.profile)

    def update_statistics(self, merged: dict[str, Any]) -> None:
        """Fold the iteration's merged observation (and return) moments into the running statistics."""
        if self.cfg.normalize_obs:
            # Statistics change only between iterations, so a rollout and its update see the same graph.
            t0 = time.perf_counter()
            self.rms.update_from_moments(*merged["moments"])
            self.rms.copy_to(self.policy.normalizer)
            self.profile.add("normaliser statistics", time.perf_counter() - t0, 0)
        if self.cfg.normalize_reward:
            self.ret_rms.update_from_moments(*merged["ret_moments"])

    def log(self, lr: float, first_step: int, merged: dict[str, Any], sps: float, elapsed: float,
            progress: Any) -> None:  # fmt: skip
        """The iteration's metrics.csv row and finished episodes (rank 0 writes them), and the progress bar."""
        finished = merged["finished"]
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
            **self.lowered_cost,
            **self.mismatch,
        }
        n, world = self.cfg.num_envs, self.world_size
        episodes = [
            {"global_step": first_step + (int(t) + 1) * n * world, "env": int(rank) * n + int(i),
             "return": float(ret), "length": int(length)}
            for t, i, ret, length, rank in finished
        ]  # fmt: skip
        with self.profile.section("logging"):
            self.recorder.iteration(row, episodes)
            if progress is not None:
                progress.update(self.cfg.global_batch_size)
                if len(finished):
                    progress.set_postfix(ret=f"{row['return_mean']:.1f}", sps=f"{sps:.0f}")

    def periodic_evaluation(self) -> float:
        """Evaluate, log it to evals.csv and note a reached --stop-at-return; the wall seconds it took."""
        returns, seconds, cpu_seconds = self.evaluator.timed(self.cfg.eval_episodes)
        mean = float(np.mean(returns))
        self.recorder.evaluation(
            {"iteration": self.iteration, "global_step": self.global_step, "return_mean": mean,
             "return_min": float(np.min(returns)), "episodes": len(returns), "seconds": round(seconds, 3),
             "cpu_seconds": round(cpu_seconds, 3)}
        )  # fmt: skip
        # Every rank evaluates the same weights on the same seeds, so every rank stops here alike.
        if self.cfg.stop_at_return and mean >= float(self.cfg.stop_at_return):
            self.reached_return = {"return_mean": mean, "global_step": self.global_step, "iteration": self.iteration}
        return seconds

    # -- evaluation, agreement between ranks, checkpoints ----------------------------------------------------------
    def evaluate(self, episodes: int) -> list[float]:
        """Deterministic episodes on seeds ``seed + 10_000 + k``; every rank gets all returns in episode order."""
        return self.evaluator.evaluate(episodes)

    def named_state(self) -> dict[str, np.ndarray]:
        return dist.named_state(self.train_step.get_parameters(), self.rms, self.ret_rms)

    def check_consistency(self, named: dict[str, np.ndarray] | None = None) -> list[str]:
        """Compare every rank's state checksum; stop the run on any difference, naming ranks and parameter.
        ``named``: this rank's ``named_state()`` when the caller already holds it."""
        self.rank_checksums = dist.check_consistency(
            self.comm, self.named_state() if named is None else named, self.iteration
        )
        return self.rank_checksums

    def checkpoint(self, eval_returns: list[float] | None = None) -> None:
        """Check the ranks agree, gather every rank's own state, and let rank 0 write the checkpoint."""
        with self.profile.section("checkpoints"):
            named = self.named_state()  # one copy of the Parameters for the check and the checkpoint
            self.check_consistency(named)
            ranks = self.comm.gather(self.local_state())
            if self.rank == 0:
                state = {**self.shared_state(named), "ranks": ranks}
                self.recorder.checkpoint(self.policy, state, self.run_info(eval_returns))

    # -- compiled graphs ------------------------------------------------------------------------------------------
    def use_compile_cache(self) -> None:
        """Load and save this run's graphs through the compile cache (``training/compile_cache.py``). A process's
        entry point calls it before the run's first compile; ``close`` publishes what was compiled. A run that took
        over an earlier run's graphs opens no cache: it has no compiles of its own for the cache to number in order."""
        if self.learner.reused:
            return
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
        if "act" in self.profile.compiled:
            return
        t0 = time.perf_counter()
        with compat.gc_frozen():  # MindSpore collects garbage before each compile: only new objects are looked at
            if self.cfg.graph_kernel and (blocker := compat.graph_kernel_blocker()):
                raise UsageError(f"--graph-kernel true: {blocker}")  # checked first: a compile's errors stay theirs
            with compat.graph_kernel_fusion() if self.cfg.graph_kernel else contextlib.nullcontext():
                graphs = self.rollout.compile() + self.updater.compile(self.spec)
                if self.correction is not None:
                    graphs += self.correction.compile(self.cfg.batch_size, self.spec)
            if self.cfg.eval_episodes > 0 and not self.evaluator.compiled:
                graphs += self.evaluator.compile()
        self.profile.compiled.update({"act", "train", "learner_logp"})
        self.learner.compiled = True
        self.profile.add("compile", time.perf_counter() - t0, graphs)
        self.profile.mark_rss("after compile")

    # -- profile and teardown -------------------------------------------------------------------------------------
    def profile_report(self) -> dict[str, Any]:
        """profile.json's content (see ``training/profile.py``)."""
        cfg = self.cfg
        return self.profile.report(self.global_step, {
            "env_id": cfg.env_id, "env_backend": self.backend.to_dict(), "env_steppers": self.rollout.steppers(),
            "num_envs": cfg.num_envs,
            "num_steps": cfg.num_steps, "hidden_sizes": list(cfg.hidden_sizes), "world_size": self.world_size,
            "iterations": self.iteration, "act_calls_per_env_step": round(1 / cfg.num_envs, 4),
            "compile_cache": self.compile_cache["state"], "cpu_pin": self.pinning.describe(),
            "rollout_engine": {**self.rollout.engine.describe(), "reason": self.rollout_engine_reason,
                               "mismatch_worst": dict(self.mismatch_worst)},
        })  # fmt: skip

    def write_profile(self) -> str:
        """Write profile.json (rank 0) and return the table to print."""
        report = self.profile_report()
        return write_report(self.run_dir, report) if self.rank == 0 else format_table(report)

    def close(self) -> None:
        """End the run: its Cells and their graphs go to the next run with the same graph key in this process
        (``learner_for_run``), so ``policy`` and the other Cells are not this run's to read after this."""
        if self._cache is not None:
            self._cache.close()
        self.recorder.close()
        self.rollout.close()
        self.pinning.restore()  # a caller that goes on in this process gets its CPUs back
        if not self._released:  # once: a second close must not offer Cells another run may have taken since
            self._released = True
            release(self.learner)

    # -- what benchmarks reach into: bench/scale.py times a real Trainer's act calls and env steps ----------------
    @property
    def envs(self) -> Any:
        return self.rollout.envs

    @property
    def _act(self) -> Callable[[np.ndarray, np.ndarray], np.ndarray]:
        return self.rollout.act

    @_act.setter
    def _act(self, act: Callable[[np.ndarray, np.ndarray], np.ndarray]) -> None:
        self.rollout.act = act  # type: ignore[method-assign]  # the rollout calls whatever is set here


def explained_variance(values: np.ndarray, returns: np.ndarray) -> float:
    var_ret = float(np.var(returns))
    return float("nan") if var_ret == 0 else 1.0 - float(np.var(returns - values)) / var_ret
