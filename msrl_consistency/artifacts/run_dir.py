"""The training run directory: run.json, checkpoint.ckpt, resume.state, metrics.csv, episodes.csv.

``checkpoint.ckpt`` is the deployable policy. ``resume.state`` is a self-contained snapshot of
everything else a bitwise-exact ``--resume`` needs (optimizer moments, RNG states, env states,
running statistics), with a SHA-256 so that a truncated or corrupt file is detected, not loaded.
"""

from __future__ import annotations

import csv
import hashlib
import json
import os
import pickle
from pathlib import Path
from typing import Any

from inference.errors import UsageError
from inference.files import write_bytes_atomic

RUN_JSON = "run.json"
CHECKPOINT = "checkpoint.ckpt"
RESUME_STATE = "resume.state"
METRICS_CSV = "metrics.csv"
EPISODES_CSV = "episodes.csv"
EVALS_CSV = "evals.csv"
REWARD_PLOT = "reward_curve.png"
RUN_SCHEMA = 1
_STATE_MAGIC = b"MSRL-RESUME-1\n"


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
    try:
        data = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise UsageError(f"{path} is corrupt: {exc}") from None
    if data.get("schema") != RUN_SCHEMA:
        raise UsageError(f"{path}: unsupported run schema {data.get('schema')!r} (expected {RUN_SCHEMA})")
    return data


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
    return pickle.loads(payload)


class CsvLog:
    """Append-only CSV flushed every row (nothing lost on a crash); on resume, rows past the checkpoint go."""

    def __init__(self, path: Path, fields: list[str], keep_until_step: int | None = None) -> None:
        self.path, self.fields = path, fields
        if keep_until_step is not None and path.exists():
            with open(path, newline="") as fh:
                rows = [r for r in csv.DictReader(fh) if int(r["global_step"]) <= keep_until_step]
            self._rewrite(rows)
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
