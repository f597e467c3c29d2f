"""The product speaks of the product: no tracked file names or mentions the development sittings it was built in.

A measurement is labelled by its date, CPU model and command, never by the sitting that took it, and result files are
named for what they hold (``cartpole_train_throughput_xeon.md``), not numbered by sitting. Every file tracked by git
is checked (binary files skipped), its path and its text; a failure lists each offending ``file:line``.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

# "session N" or "sitting N" (singular or plural, any case, a space, dash or underscore before the number). Whole
# words only, so ONNX Runtime's InferenceSession, pytest's scope="session" and start_new_session= are not flagged.
SITTING = re.compile(r"\b(?:session|sitting)s?[ \t_-]*\d", re.IGNORECASE)
# A file numbered by sitting: "_sNN" (two digits) ending a name or before another suffix, in a path or in text.
NUMBERED_NAME = re.compile(r"_s\d\d(?![0-9A-Za-z])")
NUMBERED_REFERENCE = re.compile(r"\w_s\d\d(?:_\w+)?\.(?:md|txt|png|json|csv|toml|py)\b")


def findings(path: str, text: str) -> list[str]:
    """``path:line: text`` for every development-history reference in one file (its path counts as line 0)."""
    found = [f"{path}:0: file name numbered by sitting"] if NUMBERED_NAME.search(path) else []
    for number, line in enumerate(text.splitlines(), 1):
        if SITTING.search(line) or NUMBERED_REFERENCE.search(line):
            found.append(f"{path}:{number}: {line.strip()[:160]}")
    return found


def tracked_files() -> list[str]:
    if shutil.which("git") is None or not (REPO / ".git").exists():
        pytest.skip("not a git checkout")
    out = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True).stdout
    return [p for p in out.decode().split("\0") if p]


def text_of(path: str) -> str | None:
    """The file's text, or None for a binary file (or one deleted from the working tree)."""
    try:
        data = (REPO / path).read_bytes()
    except (FileNotFoundError, IsADirectoryError):
        return None
    if b"\0" in data[:8192]:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None


def scan() -> dict[str, list[str]]:
    result = {}
    for path in tracked_files():
        found = findings(path, text_of(path) or "")
        if found:
            result[path] = found
    return result


def test_no_tracked_file_mentions_development_sittings():
    lines = [line for found in scan().values() for line in found]
    assert not lines, "development-history references (label by date, CPU and command instead):\n" + "\n".join(lines)


@pytest.mark.parametrize(
    "line",
    [
        "measured in " + "session" + " 21 on the AMD host",
        "Session" + "-23 block",
        "the host of " + "sessions" + " 5-8",
        "SESSION" + " 4",
        "sitting" + " 12",
        "see `pendulum_train_throughput" + "_s22.md`",
        "bench/results/pendulum_train_throughput" + "_s13_split.md",
    ],
)
def test_a_new_reference_is_caught(line):
    assert findings("bench/x.md", f"ok\n{line}\n") == [f"bench/x.md:2: {line}"]


@pytest.mark.parametrize(
    "line",
    [
        "session = ort.InferenceSession(str(path), options)",
        '@pytest.fixture(scope="session", autouse=True)',
        "subprocess.Popen(cmd, start_new_session=True)",
        "options = ort.SessionOptions()",
        "a run directory runs/CartPole-v1-s1 and seed s10",
    ],
)
def test_legitimate_words_are_not_flagged(line):
    assert findings("x.py", line) == []


def test_a_numbered_file_name_is_caught():
    assert findings("bench/results/bipedalwalker_race" + "_s27.png", "") != []
    assert findings("bench/results/bipedalwalker_race.png", "") == []
