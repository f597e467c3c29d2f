"""One training run from a config to its run directory: what ``python -m msrl_consistency.train`` does, and
``msrl_consistency.train_policy(config)`` from Python.

    from msrl_consistency import train_policy
    from msrl_consistency.config import TrainConfig
    result = train_policy(TrainConfig(env_id="CartPole-v1", total_steps=20_000, run_dir="runs/cartpole"))
    print(result.checkpoint, result.eval_return)

Module-level imports stay light (no MindSpore): the CLI imports this module before it knows it will train.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from inference.errors import UsageError
from msrl_consistency.config import TrainConfig, explicit_flags, from_dict

if TYPE_CHECKING:
    from msrl_consistency.agent import PolicySpec
    from msrl_consistency.training.distributed import Comm
    from msrl_consistency.training.loop import IterationHook

# What --resume may change: the step budget, a target to stop at, progress, profile, env threads, the rendezvous.
RESUME_MAY_CHANGE = {"resume", "total_steps", "progress", "master_addr", "master_port", "workers", "profile",
                     "env_threads", "compile_cache", "stop_at_return"}  # fmt: skip


@dataclass(frozen=True)
class RunResult:
    """Where a finished run is and how it ended (run.json holds the rest)."""

    run_dir: Path
    checkpoint: Path  # the deployable policy: ``export --ckpt`` takes it
    policy_spec: PolicySpec  # rebuilds the policy Cell (``artifacts.checkpoint.load_policy``)
    iteration: int
    global_step: int
    episodes: int
    eval_returns: list[float]  # the final deterministic evaluation's, in episode order (empty without one)
    stopped_at_return: dict[str, Any] | None  # the evaluation that reached --stop-at-return, if one did
    resume_exact: bool  # False when resumed envs had to restart their episodes
    env_backend: str
    world_size: int
    rank_checksums: list[str]

    @property
    def eval_return(self) -> float | None:
        """The final evaluation's mean return (None without one)."""
        return sum(self.eval_returns) / len(self.eval_returns) if self.eval_returns else None


def train_policy(config: TrainConfig, *, on_iteration: IterationHook | None = None) -> RunResult:
    """Train PPO in this process as the CLI does and write ``config.run_dir`` (or continue ``config.resume``).

    ``config`` is the CLI's config (``config.parse_config`` builds one from flags) and is not modified. A resumed run
    keeps its stored config but for ``progress`` and ``profile``. Data parallel runs from the CLI (``--workers N``
    starts its processes under msrun). ``on_iteration`` is called with the Trainer as each iteration starts.
    ``UsageError`` for bad input (nothing written); ``KeyboardInterrupt`` after a Ctrl-C, with the iteration it
    interrupted checkpointed.
    """
    from msrl_consistency.training import distributed as dist

    cfg = dataclasses.replace(config, hidden_sizes=list(config.hidden_sizes))
    if not cfg.resume:
        if not cfg.run_dir:
            raise UsageError("train_policy(config) needs config.run_dir (or config.resume)")
        cfg.validate()
        _one_process(cfg)
    with _one_run_at_a_time():
        cfg, run_dir, state = prepare_run(cfg, [])
        _one_process(cfg)  # a resumed run's world size is its stored one
        return run_training(cfg, run_dir, state, dist.SingleProcess(), on_iteration)


_running: threading.Thread | None = None  # the thread whose train_policy call is in progress
_running_lock = threading.Lock()


@contextlib.contextmanager
def _one_run_at_a_time() -> Iterator[None]:
    """One ``train_policy`` at a time in a process: MindSpore 2.10's runtime serves one thread's graphs, and two runs
    stepping at once from two threads died inside it (``RuntimeError: The pointer[runtime_info] is null``), leaving
    the first run's state undefined. The second call is refused before it writes anything. A call from the running
    thread itself (an ``on_iteration`` hook) is not concurrent: it runs inside the first one's iteration."""
    global _running
    me = threading.current_thread()
    with _running_lock:
        outer = _running
        if outer is not None and outer is not me:
            raise UsageError(f"train_policy is already running in this process (thread {outer.name!r}): MindSpore "
                             "trains one run at a time per process; start this one after it returns, or in another "
                             "process (python -m msrl_consistency.train)")  # fmt: skip
        _running = me
    try:
        yield
    finally:
        with _running_lock:
            _running = outer


def _one_process(cfg: TrainConfig) -> None:
    if cfg.workers > 1:
        raise UsageError(f"train_policy(config) runs one process; a run with {cfg.workers} workers runs from the CLI: "
                         f"python -m msrl_consistency.train --workers {cfg.workers}")  # fmt: skip


def prepare_run(cfg: TrainConfig, argv: list[str], world_size: int | None = None) -> tuple[TrainConfig, Path, Any]:
    """Every check that can fail on bad input, then the run dir: ``(config, run dir, resume state or None)``.

    ``argv``: the command line, whose explicit flags decide what a resume changes. ``world_size`` is msrun's when
    running as a rank (``None``: this process decides, from ``--workers``).
    """
    from msrl_consistency.artifacts import run_dir as rd
    from msrl_consistency.envs import describe_env
    from msrl_consistency.envs.engines import resolve_backend
    from msrl_consistency.training import distributed as dist

    if cfg.resume:
        cfg, run_dir, state = _resume_config(cfg, argv, world_size)
    else:
        run_dir, state = Path(cfg.run_dir), None
        if world_size is not None:
            given = explicit_flags(argv).get("workers")
            if given is not None and given != world_size:
                raise UsageError(f"--workers {given} disagrees with msrun's world size {world_size}")
            cfg.workers = world_size
        describe_env(cfg.env_id)  # unknown ids and unsupported spaces fail before anything is written
    # An unavailable or unsupported engine fails here too; a resumed run keeps the engine it recorded.
    cfg.env_backend = resolve_backend(cfg.env_id, cfg.env_backend, cfg.async_envs).name
    from msrl_consistency import compat

    launcher = world_size is None and cfg.workers > 1  # starts the ranks but does not train itself
    try:
        compat.check_device(cfg.device)
        if world_size is None and not launcher:
            compat.set_device(cfg.device)  # a rank's device is already set (device_id = local rank)
        if cfg.update_precision != "fp32" and not (launcher and cfg.device.lower() != "cpu"):
            compat.check_compute_dtype(cfg.update_precision)  # on the training device (the launcher: CPU only)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    if os.environ.get(dist.STATUS_DIR_ENV) is None:  # our own launcher already holds the lock for its ranks
        rd.lock_run_dir(run_dir)  # before anything is read or written: two trainings never share a run dir
    if state is None:
        rd.prepare_new_run_dir(run_dir)
    else:
        rd.remove_stale_temp_files(run_dir)  # an interrupted atomic write's leftovers, never a checkpoint
    return cfg, run_dir, state


def _resume_config(cfg_cli: TrainConfig, argv: list[str], world_size: int | None) -> tuple[TrainConfig, Path, dict]:
    """The resumed run keeps its stored config and world size; only what leaves the training stream alone may change
    (``RESUME_MAY_CHANGE``)."""
    from msrl_consistency.artifacts import run_dir as rd

    run_dir = Path(cfg_cli.resume)
    info = rd.read_run_json(run_dir)
    stored = from_dict({k: v for k, v in info["config"].items() if k in TrainConfig.__dataclass_fields__})
    if "env_backend" not in info["config"]:
        stored.env_backend = "gymnasium"  # runs from before EnvPool was an engine
    flags = explicit_flags(argv)
    given_env = flags.get("env_id")
    if given_env and given_env != stored.env_id:
        raise UsageError(f"{run_dir} is a run of {stored.env_id}, not {given_env}")
    if flags.pop("config", ""):
        raise UsageError("--config cannot be given with --resume: the run keeps its stored config")
    fixed = sorted(k for k in flags if k not in RESUME_MAY_CHANGE and k != "env_id" and flags[k] != getattr(stored, k))
    if fixed:
        names = ", ".join(f"--{k.replace('_', '-')}" for k in fixed)
        raise UsageError(f"{names} cannot change on --resume (the run keeps its stored config); only "
                         f"{', '.join('--' + k.replace('_', '-') for k in sorted(RESUME_MAY_CHANGE))} may")  # fmt: skip
    state = rd.load_resume_state(run_dir / rd.RESUME_STATE)
    if state.get("env_id") != stored.env_id:
        raise UsageError(f"{run_dir}: resume state is for {state.get('env_id')}, run.json for {stored.env_id}")
    requested = world_size if world_size is not None else flags.get("workers", state["world_size"])
    rd.check_world_size(run_dir, state["world_size"], requested)
    stored.total_steps = flags.get("total_steps", stored.total_steps)
    stored.progress, stored.master_addr, stored.master_port = cfg_cli.progress, cfg_cli.master_addr, cfg_cli.master_port
    stored.profile, stored.env_threads = cfg_cli.profile, flags.get("env_threads", stored.env_threads)
    stored.compile_cache = flags.get("compile_cache", stored.compile_cache)
    stored.stop_at_return = flags.get("stop_at_return", stored.stop_at_return)  # e.g. a run given up on, given a goal
    stored.workers = state["world_size"]
    stored.resume, stored.run_dir = str(run_dir), str(run_dir)
    stored.validate()
    return stored, run_dir, state


def run_training(
    cfg: TrainConfig, run_dir: Path, state: Any, comm: Comm, on_iteration: IterationHook | None = None
) -> RunResult:
    """Train a prepared run (``prepare_run``) as this process's rank: checkpoint, train, evaluate, checkpoint.

    Rank 0 alone shows progress, prints the profile table and writes the run dir. A Ctrl-C is re-raised as
    ``KeyboardInterrupt`` once the interrupted iteration is checkpointed and the profile written.
    """
    from tqdm import tqdm

    from msrl_consistency.artifacts import run_dir as rd
    from msrl_consistency.artifacts.plots import plot_reward_curve
    from msrl_consistency.training.loop import Trainer

    trainer = Trainer(cfg, run_dir, state, comm, on_iteration)
    trainer.use_compile_cache()  # this process's first compiles are the run's
    lead = comm.rank == 0
    bar = tqdm(
        total=cfg.num_iterations * cfg.global_batch_size,
        initial=trainer.global_step,
        unit="step",
        disable=not (cfg.progress and lead),
        desc=cfg.env_id,
        mininterval=0.5 if sys.stderr.isatty() else 30.0,  # CI logs get a line every 30 s, not every iteration
    )

    def report_profile() -> None:  # an interrupted run's profile covers the iterations it did
        if cfg.profile:
            table = trainer.write_profile()
            if lead:
                print(table)

    try:
        if state is None:
            trainer.checkpoint()  # a resumable starting point and a valid run.json from the first second
        trainer.run(bar)
        bar.close()
        eval_returns = trainer.evaluate(cfg.eval_episodes) if cfg.eval_episodes > 0 else []
        trainer.checkpoint(eval_returns)  # checks the ranks agree a last time
        report_profile()
    except KeyboardInterrupt:
        bar.close()
        report_profile()
        raise
    finally:
        trainer.close()
        if lead:
            plot_reward_curve(run_dir / rd.EPISODES_CSV, run_dir / rd.REWARD_PLOT, f"PPO on {cfg.env_id}")
    return RunResult(
        run_dir=run_dir,
        checkpoint=run_dir / rd.CHECKPOINT,
        policy_spec=trainer.spec,
        iteration=trainer.iteration,
        global_step=trainer.global_step,
        episodes=trainer.episodes,
        eval_returns=eval_returns,
        stopped_at_return=trainer.reached_return,
        resume_exact=trainer.resume_exact,
        env_backend=trainer.backend.name,
        world_size=comm.world_size,
        rank_checksums=list(trainer.rank_checksums),
    )
