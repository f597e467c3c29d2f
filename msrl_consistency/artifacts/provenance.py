"""Versions and source revision recorded in run.json, manifests and reports."""

from __future__ import annotations

import platform
import subprocess
from pathlib import Path

from inference.machine.facts import package_version

PACKAGE_ROOT = Path(__file__).resolve().parents[2]


def versions(*names: str) -> dict[str, str | None]:
    """Python plus the given distributions' versions (None when not installed)."""
    found: dict[str, str | None] = {"python": platform.python_version()}
    for name in names:
        found[name] = package_version(name)
    return found


def git_commit() -> str | None:
    """``HEAD`` of the source checkout, suffixed ``-dirty`` when there are local changes; None outside git."""
    try:
        head = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=PACKAGE_ROOT, capture_output=True, text=True, timeout=5, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=PACKAGE_ROOT,
            capture_output=True,
            text=True,
            timeout=5,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return head + ("-dirty" if dirty else "")
