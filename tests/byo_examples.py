"""The bring-your-own examples as the tests run them: a copy of an example after its own training script ran."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

EXAMPLES = Path(__file__).resolve().parents[1] / "examples" / "bring-your-own"


def trained_example(tmp_path_factory, name: str, *train_args: str) -> Path:
    """A copy of ``examples/bring-your-own/NAME`` after its own plain MindSpore training script ran there."""
    work = tmp_path_factory.mktemp("byo") / name
    shutil.copytree(EXAMPLES / name, work)
    proc = subprocess.run([sys.executable, "train.py", *train_args], cwd=work, capture_output=True, text=True,
                          timeout=600)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    return work
