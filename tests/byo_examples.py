"""The bring-your-own examples as the tests run them: a copy of an example after its own training script ran, and an
example's ``policy.py`` imported under a name of its own."""

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


def example_module(work: Path, unique: str):
    """The example's ``policy.py`` (in ``work``) as a module of its own name: every example has a ``policy`` module,
    and MindSpore's graph compiler looks a Cell's module up by name, so each caller picks a name no other uses."""
    import importlib.util

    if unique in sys.modules:
        return sys.modules[unique]
    sys.path.insert(0, str(work))  # its own imports (pixel_env) resolve from its directory
    try:
        spec = importlib.util.spec_from_file_location(unique, work / "policy.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[unique] = module
        spec.loader.exec_module(module)  # type: ignore[union-attr]
    finally:
        sys.path.remove(str(work))
    return module
