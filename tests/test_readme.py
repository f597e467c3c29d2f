"""Every command the READMEs show exists (the project's and the deploy side's, ``inference/README.md``): each
``python -m MODULE`` flag is in that module's ``--help``, each ``make`` target is in the Makefile, and every
repository path they name is there."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = "\n".join((ROOT / name).read_text() for name in ("README.md", "inference/README.md"))


def commands() -> list[str]:
    """The README's shell commands: its bash blocks' lines, continuations joined, comments dropped."""
    lines: list[str] = []
    for block in re.findall(r"```bash\n(.*?)```", README, re.S):
        for line in block.replace("\\\n", " ").splitlines():
            line = line.split(" #", 1)[0].strip()
            if line and not line.startswith("#"):
                lines.append(line)
    return lines


@cache
def help_text(module: str) -> str:
    proc = subprocess.run([sys.executable, "-m", module, "--help"], capture_output=True, text=True, cwd=ROOT,
                          timeout=120)  # fmt: skip
    assert proc.returncode == 0, f"{module} --help: {proc.stderr[-1000:]}"
    return proc.stdout


def module_flags() -> list[tuple[str, str]]:
    found = []
    for line in commands():
        for module, rest in re.findall(r"python -m ([\w.]+)(.*?)(?=python -m|$)", line):
            if module == "pip":
                continue
            flags = {t.strip("[]").split("=")[0] for t in shlex.split(rest) if t.strip("[]").startswith("--")}
            found += [(module, flag) for flag in sorted(flags)] or [(module, "--help")]
    return found


def test_the_readme_shows_commands():
    modules = {m for m, _ in module_flags()}
    assert {"msrl_consistency.train", "msrl_consistency.verify", "inference.check", "inference.play"} <= modules


@pytest.mark.slow
@pytest.mark.parametrize(("module", "flag"), module_flags())
def test_every_flag_the_readme_uses_exists(module, flag):
    assert re.search(rf"{re.escape(flag)}(?![\w-])", help_text(module)), f"{module} has no {flag}"


def test_every_make_target_and_path_exists():
    makefile = (ROOT / "Makefile").read_text()
    targets = {t for line in commands() for t in re.findall(r"^make (\w+)", line)}
    targets |= set(re.findall(r"`make (\w+)`", README))
    assert targets >= {"demo", "test"}
    for target in targets:
        assert re.search(rf"^{target}:", makefile, re.M), f"make {target}: no such target"
    for path in set(re.findall(r"`((?:msrl_consistency|inference|bench|examples|export|tests)/[\w./-]+)`", README)):
        assert (ROOT / path.rstrip("/")).exists(), f"the README names {path}, which does not exist"
