"""The training run directory: run.json, checkpoint.ckpt, resume.state, metrics.csv, episodes.csv.

``checkpoint.ckpt`` is the deployable policy. ``resume.state`` is a self-contained snapshot of
everything else a bitwise-exact ``--resume`` needs (optimizer moments, RNG states, env states,
running statistics), with a SHA-256 so that a truncated or corrupt file is detected, not loaded.
It holds the state every rank shares (Parameters, statistics, counters) once and, under ``ranks``, what
each data-parallel rank owns (its RNG streams, envs and episode counters).

``RunRecorder`` is the one writer of a run directory. In a data-parallel run only rank 0 has one (the
other ranks get a ``NullRecorder``), so "rank 0 alone writes the run dir" holds by construction.
"""

from __future__ import annotations

import csv
import fcntl
import hashlib
import os
import pickle
from pathlib import Path
from typing import Any

import numpy as np

from inference.bundle.files import read_document, write_bytes_atomic, write_json_atomic
from inference.errors import UsageError

RUN_JSON = "run.json"
CHECKPOINT = "checkpoint.ckpt"
RESUME_STATE = "resume.state"
METRICS_CSV = "metrics.csv"
EPISODES_CSV = "episodes.csv"
EVALS_CSV = "evals.csv"
REWARD_PLOT = "reward_curve.png"
LOG_DIR = "logs"
RUN_SCHEMA = 1
_STATE_MAGIC = b"MSRL-RESUME-1\n"
# What each data-parallel rank owns in resume.state (states written before data parallel hold one set flat).
PER_RANK_KEYS = ("noise_rng", "shuffle_rng", "obs", "env_blobs", "ep_return", "ep_length")


LOCK_FILE = ".lock"
_held_locks: dict[Path, int] = {}  # run dir -> file descriptor: the lock lives as long as this process


def lock_run_dir(run_dir: Path) -> None:
    """Hold an exclusive OS lock on ``run_dir`` for the rest of this process's life (``flock``: released by the
    kernel when the process ends, however it ends). A second training or resume of the same run dir is refused
    with the holder's pid instead of silently overwriting it."""
    run_dir = run_dir.resolve()
    if run_dir in _held_locks:
        return
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        fd = os.open(run_dir / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as exc:
        raise UsageError(f"cannot write to run dir {run_dir}: {exc.strerror or exc}") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "?"
        os.close(fd)
        raise UsageError(f"{run_dir} is in use by another training (pid {holder}); wait for it or choose another "
                         "--run-dir") from None  # fmt: skip
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    _held_locks[run_dir] = fd


def prepare_new_run_dir(run_dir: Path) -> None:
    """Create ``run_dir`` for a fresh run; refuse to overwrite another run or to write where we cannot."""
    if (run_dir / RUN_JSON).exists() or (run_dir / CHECKPOINT).exists():
        raise UsageError(f"{run_dir} already holds a run; pass --resume {run_dir} or choose another --run-dir")
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        probe = run_dir / ".write-test"
        probe.write_text("ok")
        probe.unlink()
    except OSError as exc:
        raise UsageError(f"cannot write to run dir {run_dir}: {exc.strerror or exc}") from None


def read_run_json(run_dir: Path) -> dict[str, Any]:
    path = run_dir / RUN_JSON
    if not path.is_file():
        raise UsageError(f"{run_dir} is not a run directory (no {RUN_JSON})")
    data = read_document(path, "run record", UsageError)
    schema = data.get("schema") if isinstance(data, dict) else None
    if schema != RUN_SCHEMA:
        raise UsageError(f"{path}: unsupported run schema {schema!r} (expected {RUN_SCHEMA})")
    return data


def checkpoint_path(path: Path) -> Path:
    """``--ckpt`` as given to export and verify: a checkpoint file, or a training run directory holding one."""
    if path.is_dir():
        if (path / CHECKPOINT).is_file():
            return path / CHECKPOINT
        raise UsageError(f"{path} is a directory without a {CHECKPOINT}: pass a training run directory or a .ckpt file")
    if not path.is_file():
        raise UsageError(f"file not found: {path}")
    return path


def save_resume_state(path: Path, state: dict[str, Any]) -> None:
    payload = pickle.dumps(state, protocol=pickle.HIGHEST_PROTOCOL)
    write_bytes_atomic(path, _STATE_MAGIC + hashlib.sha256(payload).digest() + payload)


def load_resume_state(path: Path) -> dict[str, Any]:
    """Load a resume snapshot written by this tool, refusing anything truncated or altered."""
    if not path.is_file():
        raise UsageError(f"no resume state at {path}; the run has no checkpoint to continue from")
    blob = path.read_bytes()
    header = len(_STATE_MAGIC) + 32
    if not blob.startswith(_STATE_MAGIC) or len(blob) < header:
        raise UsageError(f"{path} is not a resume state written by msrl-consistency (or is truncated)")
    digest, payload = blob[len(_STATE_MAGIC) : header], blob[header:]
    if hashlib.sha256(payload).digest() != digest:
        raise UsageError(f"{path} is corrupt or truncated (checksum mismatch)")
    state = pickle.loads(payload)
    if "ranks" not in state:  # written by one process before data parallel existed
        state["ranks"] = [{key: state.pop(key) for key in PER_RANK_KEYS}]
    state.setdefault("world_size", len(state["ranks"]))
    return state


def check_world_size(run_dir: Path, stored: int, requested: int) -> None:
    """A run resumes only with the world size it was trained with: each rank owns envs and RNG streams."""
    if stored != requested:
        raise UsageError(
            f"{run_dir} was trained with {stored} worker{'s' if stored != 1 else ''}; resume it with the same "
            f"world size (--workers {stored}), not {requested}"
        )


def remove_stale_temp_files(run_dir: Path) -> list[str]:
    """Delete temp files an interrupted atomic write left behind (``.NAME.XXXX.tmp``); returns their names."""
    removed = []
    for name in (RUN_JSON, CHECKPOINT, RESUME_STATE):
        for tmp in run_dir.glob(f".{name}.*.tmp"):
            tmp.unlink(missing_ok=True)
            removed.append(tmp.name)
    return removed


def run_info(
    cfg: dict[str, Any],
    env: dict[str, Any],
    policy_spec: dict[str, Any],
    normalization: dict[str, Any],
    seeds: dict[str, Any],
    progress: dict[str, Any],
    distributed: dict[str, Any],
    precision: dict[str, Any],
    versions: dict[str, str],
    git_commit: str | None,
    eval_returns: list[float] | None = None,
    compile_cache: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The content of run.json (what ``export`` and ``--resume`` read, and what a person reads)."""
    return {
        "schema": RUN_SCHEMA,
        "env_id": cfg["env_id"],
        "config": cfg,
        "env": env,
        "policy_spec": policy_spec,
        "normalization": normalization,
        "seeds": seeds,
        **progress,
        **distributed,
        "precision": precision,
        "eval": {"returns": eval_returns, "mean": float(np.mean(eval_returns))} if eval_returns else None,
        "versions": versions,
        "compile_cache": compile_cache,
        "git_commit": git_commit,
    }


class RunRecorder:
    """Writes one run directory: metrics.csv, episodes.csv, evals.csv and the checkpoint triple.

    On resume, log rows past the checkpoint's ``global_step`` are dropped (they will be produced again).
    """

    def __init__(self, run_dir: Path, fields: dict[str, list[str]], keep_until_step: int | None, evals: bool) -> None:
        self.run_dir = run_dir
        self.metrics = CsvLog(run_dir / METRICS_CSV, fields["metrics"], keep_until_step)
        self.episodes = CsvLog(run_dir / EPISODES_CSV, fields["episodes"], keep_until_step)
        self.evals = CsvLog(run_dir / EVALS_CSV, fields["evals"], keep_until_step) if evals else None

    def iteration(self, row: dict[str, Any], episodes: list[dict[str, Any]]) -> None:
        for episode in episodes:
            self.episodes.write(episode)
        self.metrics.write(row)

    def evaluation(self, row: dict[str, Any]) -> None:
        if self.evals is not None:
            self.evals.write(row)

    def checkpoint(self, policy: Any, state: dict[str, Any], info: dict[str, Any]) -> None:
        """Resume state first, then the policy, then run.json: each file is replaced atomically."""
        from msrl_consistency.artifacts.checkpoint import save_policy

        save_resume_state(self.run_dir / RESUME_STATE, state)
        save_policy(policy, self.run_dir / CHECKPOINT)
        write_json_atomic(self.run_dir / RUN_JSON, info)

    def close(self) -> None:
        self.metrics.close()
        self.episodes.close()
        if self.evals is not None:
            self.evals.close()


class NullRecorder:
    """What ranks other than 0 hold: they train and exchange, but never write the run directory."""

    def iteration(self, row: dict[str, Any], episodes: list[dict[str, Any]]) -> None:
        pass

    def evaluation(self, row: dict[str, Any]) -> None:
        pass

    def checkpoint(self, policy: Any, state: dict[str, Any], info: dict[str, Any]) -> None:
        pass

    def close(self) -> None:
        pass


def read_log(path: Path) -> list[dict[str, str]]:
    """One of a run's CSV logs as rows: empty before its first row is written (a run still starting)."""
    if not path.exists():
        return []
    with open(path, newline="") as fh:
        return list(csv.DictReader(fh))


def episode_returns(run_dir: Path) -> list[tuple[int, float]]:
    """``(global step, return)`` of each finished training episode (episodes.csv)."""
    return [(int(r["global_step"]), float(r["return"])) for r in read_log(run_dir / EPISODES_CSV)]


def eval_means(run_dir: Path) -> list[tuple[int, float]]:
    """``(global step, mean return)`` of each periodic evaluation (evals.csv)."""
    return [(int(r["global_step"]), float(r["return_mean"])) for r in read_log(run_dir / EVALS_CSV)]


class CsvLog:
    """Append-only CSV flushed every row (nothing lost on a crash); on resume, rows past the checkpoint go."""

    def __init__(self, path: Path, fields: list[str], keep_until_step: int | None = None) -> None:
        self.path, self.fields = path, fields
        if keep_until_step is not None and path.exists():
            self._rewrite([r for r in read_log(path) if int(r["global_step"]) <= keep_until_step])
        elif keep_until_step is None or not path.exists():
            self._rewrite([])
        self._fh = open(path, "a", newline="")  # noqa: SIM115 - kept open for the run
        self._writer = csv.DictWriter(self._fh, fieldnames=fields, extrasaction="ignore")

    def _rewrite(self, rows: list[dict[str, Any]]) -> None:
        tmp = self.path.with_suffix(".tmp")
        with open(tmp, "w", newline="") as fh:
            writer = csv.DictWriter(fh, fieldnames=self.fields, extrasaction="ignore")
            writer.writeheader()
            writer.writerows(rows)
        os.replace(tmp, self.path)

    def write(self, row: dict[str, Any]) -> None:
        self._writer.writerow({k: _fmt(v) for k, v in row.items()})
        self._fh.flush()

    def close(self) -> None:
        self._fh.close()


def _fmt(value: Any) -> Any:
    if isinstance(value, float):
        return repr(value)
    return value
