"""Load a bench script as a module: ``load("train_throughput")`` runs ``bench/train_throughput.py``.

The scripts are not a package (they run as ``python bench/<name>.py``), so their tests load them by file path. This
is a plain module, not a conftest.py: the main suite's tests import helpers with ``from conftest import ...``, and a
second conftest module would shadow theirs when both directories are collected together. The scripts tested here
import no MindSpore and no PyTorch, and train nothing.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

BENCH = Path(__file__).resolve().parents[1]


def load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, BENCH / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    before = sys.modules.get(name)
    sys.modules[name] = module  # while it runs: dataclasses look their module up by name
    try:
        spec.loader.exec_module(module)
    finally:
        if before is None:
            del sys.modules[name]
        else:
            sys.modules[name] = before
    return module
