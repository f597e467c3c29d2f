"""``train --workers N`` on one machine: run N data-parallel ranks under msrun, wait, report the worst rank.

msrun (MindSpore's launcher, run here as ``python -m mindspore.parallel.cluster.run``) starts a scheduler and N
workers, each running this same ``train`` command; the module sees its role in the environment msrun sets.
Every process listens on ``--master-addr`` (default 127.0.0.1, so nothing leaves loopback) and msrun's
scheduler on a free port. Logs go to ``RUN_DIR/logs/launch-K/``: ``worker_R.log`` per rank, ``scheduler.log``,
``msrun.log`` and ``rank_R.json`` (pid, host, exit code and error, written by each rank). Rank 0's output (the
progress bar, the summary) is echoed here.

Faults: msrun polls its workers once a second and SIGKILLs the others when one fails, so a dead rank ends the
run within seconds; its scheduler then waits for MindSpore's heartbeat timeout, which the launcher cuts short
once every worker is gone. The report names the first rank that failed (its own error, or the signal msrun
saw) and the checkpoint to resume from; checkpoints are written atomically, so none is ever half-written.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import msrl_consistency
from msrl_consistency import compat
from msrl_consistency.artifacts import run_dir as rd
from msrl_consistency.config import TrainConfig
from msrl_consistency.training import distributed as dist

POLL_S = 0.2
SCHEDULER_GRACE_S = 2.0  # once every worker is gone, msrun's scheduler gets this long before it is stopped
CLUSTER_TIMEOUT_S = 120  # msrun --cluster_time_out: how long ranks wait for one another to join
_MINDSPORE_LOG_PREFIXES = ("[WARNING]", "[INFO]", "[ERROR]", "[DEBUG]", "[CRITICAL]")
RANK_COMMAND = ("-m", "msrl_consistency.train")  # what each rank runs after ``python``, with the launcher's argv


def free_port(addr: str) -> int:
    """A port nobody listens on at ``addr`` right now (the OS picks it)."""
    family = socket.AF_INET6 if ":" in addr else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.bind((addr, 0))
        return s.getsockname()[1]


def msrun_command(
    workers: int, addr: str, port: int, log_dir: Path, argv: list[str], rank_command: Sequence[str] = RANK_COMMAND
) -> list[str]:
    """msrun with every rank on this machine, joined (msrun waits for them); then the ranks' own command:
    ``python`` with ``rank_command`` (this CLI, or a program wrapping its ``main``) and ``argv``."""
    return [
        sys.executable, "-m", compat.MSRUN_MODULE,
        f"--worker_num={workers}", f"--local_worker_num={workers}",
        f"--master_addr={addr}", f"--master_port={port}",
        f"--log_dir={log_dir}", "--join=True", f"--cluster_time_out={CLUSTER_TIMEOUT_S}",
        f"--tail_worker_log={workers}",  # no rank has this id: msrun tails nothing, we echo rank 0 ourselves
        "python", *rank_command, *argv,
    ]  # fmt: skip


def worker_env(log_dir: Path) -> dict[str, str]:
    """msrun starts plain ``python`` from PATH: this interpreter's, importing this checkout."""
    env = dict(os.environ)
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    root = str(Path(msrl_consistency.__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join([root, *filter(None, [env.get("PYTHONPATH")])])
    env[dist.STATUS_DIR_ENV] = str(log_dir)
    for key, value in compat.FAST_JOIN_ENV.items():
        env.setdefault(key, value)
    return env


def new_log_dir(run_dir: Path) -> Path:
    """``logs/launch-K``, one per launch: a resumed run keeps the logs of the launch that failed."""
    logs = run_dir / rd.LOG_DIR
    logs.mkdir(parents=True, exist_ok=True)
    k = 1 + max((int(p.name.split("-")[1]) for p in logs.glob("launch-*") if p.name.split("-")[1].isdigit()), default=0)
    path = logs / f"launch-{k}"
    path.mkdir()
    return path


def run_workers(cfg: TrainConfig, run_dir: Path, argv: list[str], rank_command: Sequence[str] = RANK_COMMAND) -> int:
    """Launch ``cfg.workers`` ranks, echo rank 0, wait, report; returns the worst rank's exit code."""
    n = cfg.workers
    log_dir = new_log_dir(run_dir)
    port = cfg.master_port or free_port(cfg.master_addr)
    print(f"launching {n} workers with msrun on {cfg.master_addr}:{port}; logs in {log_dir}", flush=True)
    with open(log_dir / "msrun.log", "wb") as msrun_log:
        proc = subprocess.Popen(
            msrun_command(n, cfg.master_addr, port, log_dir, argv, rank_command),
            stdout=msrun_log,
            stderr=subprocess.STDOUT,
            env=worker_env(log_dir),
            start_new_session=True,  # msrun and its scheduler in their own group: stoppable together
        )
    echo = LogEcho(log_dir / "worker_0.log")
    failed_at: float | None = None
    try:
        while proc.poll() is None:
            time.sleep(POLL_S)
            echo.pump()
            if failed_at is None and _failure_seen(log_dir, n):
                failed_at = time.monotonic()
            waited = failed_at is not None and time.monotonic() - failed_at > SCHEDULER_GRACE_S
            if waited and not _live_ranks(log_dir, n):
                _stop(proc, log_dir, n)  # msrun would wait for its scheduler's heartbeat timeout (~30 s)
    except KeyboardInterrupt:
        _stop(proc, log_dir, n)
        echo.pump()
        print(f"interrupted; resume with: --resume {run_dir}{_checkpoint_note(run_dir)}", file=sys.stderr)
        return 130
    echo.pump(final=True)
    outcome = collect_outcome(log_dir, n, proc.returncode)
    for line in outcome.report(run_dir):
        print(line, file=sys.stderr)
    return outcome.exit_code


class LogEcho:
    """Echo a rank's log as it grows, without MindSpore's own log lines or the rank's final ``error:`` line
    (the launcher reports errors itself); tqdm's carriage-return refreshes become lines."""

    def __init__(self, path: Path) -> None:
        self.path, self.offset, self.partial = path, 0, ""

    def pump(self, final: bool = False) -> None:
        if not self.path.exists():
            return
        with open(self.path, "rb") as fh:
            fh.seek(self.offset)
            data = fh.read()
        self.offset += len(data)
        text = self.partial + data.decode("utf-8", "replace").replace("\r", "\n")
        lines = text.split("\n")
        self.partial = "" if final else lines.pop()
        for line in lines:
            if line.strip() and not line.startswith(_MINDSPORE_LOG_PREFIXES) and not line.startswith("error: "):
                print(line, flush=True)


@dataclass
class RankOutcome:
    rank: int
    pid: int | None
    exit_code: int | None  # None: stopped by msrun after another rank failed (or never reported)
    error: str | None = None
    signal: int | None = None


@dataclass
class Outcome:
    ranks: list[RankOutcome]
    msrun_code: int
    log_dir: Path

    @property
    def exit_code(self) -> int:
        codes = [r.exit_code for r in self.ranks if r.exit_code is not None]
        worst = max(codes, default=0)
        if worst == 0 and (self.msrun_code != 0 or len(codes) < len(self.ranks)):
            return 1  # msrun or its scheduler failed without any rank reporting why
        return worst

    def report(self, run_dir: Path) -> list[str]:
        """Error lines naming the rank(s) that failed, and what resumes; nothing when every rank succeeded."""
        if self.exit_code == 0:
            return []
        lines = []
        errors: dict[tuple[int, str], list[int]] = {}  # the same error on several ranks is reported once
        for r in self.ranks:
            if r.signal is not None:
                name = signal.Signals(r.signal).name if r.signal in signal.valid_signals() else str(r.signal)
                lines.append(f"error: rank {r.rank} (pid {r.pid}) was killed by signal {r.signal} ({name}); msrun "
                             "stopped the other ranks")  # fmt: skip
            elif r.exit_code:
                errors.setdefault((r.exit_code, r.error or "see its log"), []).append(r.rank)
        for (code, error), ranks in errors.items():
            who = f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {', '.join(map(str, ranks))}"
            lines.append(f"error: {who} exited with code {code}: {error}")
        if not lines:
            lines.append(f"error: the distributed job failed (msrun exit code {self.msrun_code}) before any rank "
                         "reported an error")  # fmt: skip
        stopped = [str(r.rank) for r in self.ranks if r.exit_code is None and r.signal is None]
        if stopped:
            lines.append(f"ranks stopped because of that: {', '.join(stopped)}")
        lines.append(f"logs: {self.log_dir}")
        note = _checkpoint_note(run_dir)
        if note:
            lines.append(f"resume with: python -m msrl_consistency.train --resume {run_dir}{note}")
        return lines


def collect_outcome(log_dir: Path, workers: int, msrun_code: int) -> Outcome:
    """What each rank reported (``rank_R.json``) and which one msrun saw fail first (a signal, if killed)."""
    msrun_log = log_dir / "msrun.log"
    first = compat.msrun_first_failure(msrun_log.read_text(errors="replace")) if msrun_log.exists() else None
    ranks = []
    for r in range(workers):
        status = _status(log_dir, r)
        pid = status.get("pid")
        outcome = RankOutcome(r, pid, status.get("exit_code"), status.get("error"))
        if outcome.exit_code is None and first is not None and pid == first[0]:
            code = first[1]
            if code < 0:  # killed by a signal: report it like a shell does
                outcome.signal, outcome.exit_code = -code, 128 - code
            else:
                outcome.exit_code = code
        ranks.append(outcome)
    return Outcome(ranks, msrun_code, log_dir)


def _status(log_dir: Path, rank: int) -> dict:
    path = log_dir / f"rank_{rank}.json"
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return {}


def _failure_seen(log_dir: Path, workers: int) -> bool:
    msrun_log = log_dir / "msrun.log"
    if msrun_log.exists() and compat.msrun_first_failure(msrun_log.read_text(errors="replace")):
        return True
    return any(_status(log_dir, r).get("exit_code") not in (None, 0) for r in range(workers))


def _alive(pid: int) -> bool:
    """Running (not a zombie waiting for msrun to reap it)."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def _live_ranks(log_dir: Path, workers: int) -> list[int]:
    pids = [_status(log_dir, r).get("pid") for r in range(workers)]
    return [pid for pid in pids if pid is not None and _alive(pid)]


def _stop(proc: subprocess.Popen, log_dir: Path, workers: int) -> None:
    """Stop msrun and its scheduler (their own process group), then any rank still running (each its own group)."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        if proc.poll() is not None:
            break
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            break
        try:
            proc.wait(timeout=3)
        except subprocess.TimeoutExpired:
            continue
    for pid in _live_ranks(log_dir, workers):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGKILL)  # msrun starts each worker with setsid
    proc.wait()


def _checkpoint_note(run_dir: Path) -> str:
    try:
        info = rd.read_run_json(run_dir)
    except Exception:  # noqa: BLE001 - no usable checkpoint is not an error here
        return ""
    return f" (its last complete checkpoint: iteration {info['iteration']}, step {info['global_step']})"
