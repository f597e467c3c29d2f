"""The set-up's install step (``make`` ``$(STAMP)``): uv installs the packages, pip where uv cannot, pip alone with
``INSTALLER=pip``. Run against a stand-in venv whose ``python`` and ``uv`` log their arguments, so no package is
fetched: what is checked is which installer runs, with which requirements, and what the user is told."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
REQUIREMENTS = "-e ./inference -e .[dev]"

LOGGING_TOOL = """#!/bin/sh
call="$(basename "$0") $*"
echo "$call" >> "{log}"
case "$call" in *"{fail}"*) exit 1 ;; esac
exit 0
"""


def install(tmp_path: Path, *make_args: str, fail: str = "@never@") -> tuple[subprocess.CompletedProcess, list[str]]:
    """``make`` the install stamp with a venv whose ``python`` and ``uv`` fail on a command containing ``fail``."""
    if shutil.which("make") is None:
        pytest.fail("make is not installed")
    venv, log = tmp_path / "venv", tmp_path / "calls.log"
    (venv / "bin").mkdir(parents=True)
    for tool in ("python", "uv"):
        (venv / "bin" / tool).write_text(LOGGING_TOOL.format(log=log, fail=fail))
        (venv / "bin" / tool).chmod(0o755)
    env = {k: v for k, v in os.environ.items() if not k.startswith("MAKE")}
    proc = subprocess.run(["make", "--no-print-directory", f"VENV={venv}", *make_args, f"{venv}/.installed"],
                          cwd=ROOT, capture_output=True, text=True, env=env, timeout=60)  # fmt: skip
    calls = log.read_text().splitlines() if log.exists() else []
    return proc, [c for c in calls if "sysconfig" not in c and "compileall" not in c]


def test_uv_installs_the_packages(tmp_path):
    proc, calls = install(tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert calls == ["python -m pip install -q --only-binary=:all: uv",
                     f"uv pip install -q --python {tmp_path}/venv/bin/python {REQUIREMENTS}"]  # fmt: skip
    assert "pip installs instead" not in proc.stderr


@pytest.mark.parametrize("fail", ["pip install -q --only-binary", "uv pip install"], ids=["no uv wheel", "uv fails"])
def test_where_uv_cannot_install_pip_installs_the_same_requirements_and_says_so(tmp_path, fail):
    proc, calls = install(tmp_path, fail=fail)
    assert proc.returncode == 0, proc.stderr
    assert calls[-1] == f"python -m pip install -q --no-compile {REQUIREMENTS}"
    assert proc.stderr.count("uv could not install; pip installs instead") == 1
    assert (tmp_path / "venv" / ".installed").exists()


def test_installer_pip_never_runs_uv(tmp_path):
    proc, calls = install(tmp_path, "INSTALLER=pip")
    assert proc.returncode == 0, proc.stderr
    assert calls == [f"python -m pip install -q --no-compile {REQUIREMENTS}"]


def test_a_failed_install_fails_the_set_up(tmp_path):
    proc, _ = install(tmp_path, fail="install -q")  # uv's bootstrap, and then pip's own install, fail
    assert proc.returncode != 0
    assert not (tmp_path / "venv" / ".installed").exists()
