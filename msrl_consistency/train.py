"""``python -m msrl_consistency.train``: train PPO and write a run directory that ``export`` consumes.

One process by default. ``--workers N`` launches N data-parallel ranks on this machine under msrun and waits
for them (``training/launch.py``). When msrun starts this module (ours, or a user's own msrun across machines)
it runs as msrun's scheduler or as one rank, whichever msrun says (``MS_ROLE``).

Exit codes: 0 success, 1 the ranks diverged or lost one another, 2 bad input (nothing half-written),
130 interrupted (last checkpoint kept). With ``--workers N``: the worst rank's code (128 + the signal for a rank
killed by one).
"""

from __future__ import annotations

import os
import socket
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from inference.errors import MsrlError, UsageError, first_line, run_cli
from msrl_consistency.config import TrainConfig, explicit_flags, from_dict, parse_config

if TYPE_CHECKING:
    from msrl_consistency.training.loop import IterationHook

RESUME_MAY_CHANGE = {"resume", "total_steps", "progress", "master_addr", "master_port", "workers", "profile",
                     "env_threads", "compile_cache", "stop_at_return"}


def _resume_config(cfg_cli: TrainConfig, argv: list[str], world_size: int | None) -> tuple[TrainConfig, Path, dict]:
    """The resumed run keeps its stored config and world size; only what leaves the training stream alone may change
    (``RESUME_MAY_CHANGE``: the step budget, a target to stop at, progress, profile, env threads, the rendezvous)."""
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


def prepare_run(cfg: TrainConfig, argv: list[str], world_size: int | None = None) -> tuple[TrainConfig, Path, Any]:
    """Every check that can fail on bad input, then the run dir: ``(config, run dir, resume state or None)``.

    ``world_size`` is msrun's when running as a rank (``None``: this process decides, from ``--workers``).
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


def main(
    argv: list[str] | None = None,
    on_iteration: IterationHook | None = None,
    rank_command: Sequence[str] | None = None,
) -> int:
    """The command. ``on_iteration`` goes to this process's Trainer (see ``Trainer``); ``rank_command`` is what
    ``--workers N`` runs as each rank after ``python`` (default ``-m msrl_consistency.train``): a program that wraps
    this ``main`` with a hook of its own names itself there, so that its ranks run the hook too."""
    argv = list(sys.argv[1:] if argv is None else argv)
    cfg = parse_config(argv)

    from msrl_consistency import compat
    from msrl_consistency.training import distributed as dist

    role = compat.cluster_role()
    if role == compat.SCHEDULER_ROLE:
        return dist.run_scheduler()
    if role == compat.WORKER_ROLE:
        return _run_rank(cfg, argv, on_iteration)
    cfg, run_dir, state = prepare_run(cfg, argv)
    if cfg.workers > 1:
        from msrl_consistency.training.launch import RANK_COMMAND, run_workers

        return run_workers(cfg, run_dir, argv, rank_command or RANK_COMMAND)
    return _train(cfg, run_dir, state, dist.SingleProcess(), on_iteration)


def _run_rank(cfg: TrainConfig, argv: list[str], on_iteration: IterationHook | None) -> int:
    """One rank under msrun: join the cluster, agree on the run with rank 0, train, report the exit code."""
    from msrl_consistency.training import distributed as dist

    try:
        comm = dist.join_cluster(rank_device(cfg))
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    dist.write_rank_status(comm.rank, pid=os.getpid(), host=socket.gethostname())
    try:
        # Rank 0 alone reads and writes the run dir: it checks and prepares, then every rank gets its verdict, so
        # a bad input stops all ranks with the same error instead of leaving them waiting in a collective.
        verdict: tuple[str | None, Any] = (None, None)
        if comm.rank == 0:
            try:
                verdict = (None, prepare_run(cfg, argv, comm.world_size))
            except UsageError as exc:
                verdict = (str(exc), None)
        error, prepared = comm.broadcast(verdict)
        if error is not None:
            raise UsageError(error)
        code = _train(*prepared, comm, on_iteration)
    except MsrlError as exc:
        dist.write_rank_status(comm.rank, exit_code=exc.exit_code, error=str(exc))
        raise
    except KeyboardInterrupt:
        dist.write_rank_status(comm.rank, exit_code=130, error="interrupted")
        raise
    except BaseException as exc:
        dist.write_rank_status(comm.rank, exit_code=1, error=f"{type(exc).__name__}: {first_line(exc)}")
        raise
    dist.write_rank_status(comm.rank, exit_code=code)
    return code


def rank_device(cfg: TrainConfig) -> str:
    """The device a rank joins the cluster on, before rank 0 has read the run: a resumed run's own (its run.json),
    not the command line's default. A rank that cannot see the run dir (another machine) keeps the command line's."""
    if cfg.resume:
        from msrl_consistency.artifacts import run_dir as rd

        try:
            return str(rd.read_run_json(Path(cfg.resume))["config"].get("device", cfg.device))
        except UsageError:
            pass  # rank 0's prepare_run reports a missing or corrupt run dir to every rank
    return cfg.device


def _train(cfg: TrainConfig, run_dir: Path, state: Any, comm: Any, on_iteration: IterationHook | None) -> int:
    from tqdm import tqdm

    from msrl_consistency.artifacts import run_dir as rd
    from msrl_consistency.artifacts.plots import plot_reward_curve
    from msrl_consistency.training.loop import Trainer

    trainer = Trainer(cfg, run_dir, state, comm, on_iteration)
    trainer.use_compile_cache()  # this process's first compiles are the run's
    lead = comm.rank == 0  # rank 0 alone shows progress and writes the run dir
    total = cfg.num_iterations * cfg.global_batch_size
    bar = tqdm(
        total=total,
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
        if lead:
            print(f"interrupted; resume with: --resume {run_dir} (from step {_stored_step(run_dir)})", file=sys.stderr)
        return 130
    finally:
        trainer.close()
        if lead:
            plot_reward_curve(run_dir / rd.EPISODES_CSV, run_dir / rd.REWARD_PLOT, f"PPO on {cfg.env_id}")
    workers = f" with {comm.world_size} workers" if comm.world_size > 1 else ""
    summary = f"trained {cfg.env_id} for {trainer.global_step} steps{workers} → {run_dir}"
    if trainer.reached_return is not None:
        reached = trainer.reached_return["return_mean"]
        summary += f" (stopped early: an evaluation reached {reached:.1f} ≥ {cfg.stop_at_return})"
    if eval_returns:
        summary += (
            f"; deterministic eval return {sum(eval_returns) / len(eval_returns):.1f} over {len(eval_returns)} ep"
        )
    if comm.world_size > 1:
        summary += f"; rank checksums equal ({trainer.rank_checksums[0]})"
    print(summary if lead else f"rank {comm.rank}: done, checksum {trainer.rank_checksums[comm.rank]}")
    return 0


def _stored_step(run_dir: Path) -> int | str:
    from msrl_consistency.artifacts import run_dir as rd

    try:
        return rd.read_run_json(run_dir)["global_step"]
    except UsageError:
        return "?"


if __name__ == "__main__":
    run_cli(main)
