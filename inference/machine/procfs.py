"""Memory figures of a process from Linux's ``/proc/<pid>/status``: the runner's RSS in ``bench``, the trainer's own
in ``run.json``. No MindSpore, so the deploy side uses the same reader."""

from __future__ import annotations

from pathlib import Path


def status_mb(field: str, pid: int | str = "self") -> float | None:
    """A ``kB`` field of ``/proc/<pid>/status`` (``VmRSS``, ``RssAnon``, ...) in MiB; None without procfs, for a
    process that is gone, or where the kernel does not report the field."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(f"{field}:"):
                return int(line.split()[1]) / 1024.0
    except (OSError, IndexError, ValueError):
        return None
    return None
