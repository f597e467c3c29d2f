"""``python -m msrl_consistency.train``: train PPO and write a run directory that ``export`` consumes.

One process by default. ``--workers N`` launches N data-parallel ranks on this machine under msrun and waits
for them (``training/distributed/launch.py``). When msrun starts this module (ours, or a user's own msrun across
machines) it runs as msrun's scheduler or as one rank, whichever msrun says (``MS_ROLE``).

Exit codes: 0 success, 1 the ranks diverged or lost one another, 2 bad input (nothing half-written),
130 interrupted (last checkpoint kept). With ``--workers N``: the worst rank's code (128 + the signal for a rank
killed by one).

From Python, ``msrl_consistency.train_policy(config)`` trains as this command does and returns a ``RunResult``
(``training/run.py``).
"""

from __future__ import annotations

import os
import socket
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from inference.errors import MsrlError, UsageError, first_line, run_cli
from msrl_consistency.config import TrainConfig, parse_config
from msrl_consistency.training.run import RunResult, prepare_run

if TYPE_CHECKING:
    from msrl_consistency.training.loop import IterationHook


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
        from msrl_consistency.training.distributed.launch import RANK_COMMAND, run_workers

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
    from msrl_consistency.training.run import run_training

    lead = comm.rank == 0  # rank 0 alone prints the summary
    try:
        result = run_training(cfg, run_dir, state, comm, on_iteration)
    except KeyboardInterrupt:
        if lead:
            print(f"interrupted; resume with: --resume {run_dir} (from step {_stored_step(run_dir)})", file=sys.stderr)
        return 130
    print(summary(cfg, result) if lead else f"rank {comm.rank}: done, checksum {result.rank_checksums[comm.rank]}")
    return 0


def summary(cfg: TrainConfig, result: RunResult) -> str:
    """The line a finished run ends with."""
    workers = f" with {result.world_size} workers" if result.world_size > 1 else ""
    line = f"trained {cfg.env_id} for {result.global_step} steps{workers} → {result.run_dir}"
    if result.stopped_at_return is not None:
        reached = result.stopped_at_return["return_mean"]
        line += f" (stopped early: an evaluation reached {reached:.1f} ≥ {cfg.stop_at_return})"
    if result.eval_returns:
        line += f"; deterministic eval return {result.eval_return:.1f} over {len(result.eval_returns)} ep"
    if result.world_size > 1:
        line += f"; rank checksums equal ({result.rank_checksums[0]})"
    return line


def _stored_step(run_dir: Path) -> int | str:
    from msrl_consistency.artifacts import run_dir as rd

    try:
        return rd.read_run_json(run_dir)["global_step"]
    except UsageError:
        return "?"


if __name__ == "__main__":
    run_cli(main)
