"""Every benchmark under bench/ imports (its imports follow the code as it moves) and says what it measures. A script
may need the ``bench`` extra (PyTorch, Stable-Baselines3), which ``make bench`` installs; nothing else may be
missing."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SCRIPTS = sorted(p.stem for p in (REPO / "bench").glob("*.py"))
BENCH_EXTRA = {"torch", "stable_baselines3"}
PROBE = """
import importlib, json, sys
sys.path[:0] = [BENCH, ROOT]
found = {}
for name in NAMES:
    try:
        found[name] = bool((importlib.import_module(name).__doc__ or "").strip())
    except ModuleNotFoundError as exc:
        found[name] = "missing " + str(exc.name).split(".")[0]
print(json.dumps(found))
"""


def test_every_bench_script_imports_and_has_a_docstring():
    code = f"BENCH, ROOT, NAMES = {str(REPO / 'bench')!r}, {str(REPO)!r}, {SCRIPTS!r}\n" + PROBE
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    found = json.loads(proc.stdout.strip().splitlines()[-1])
    assert set(found) == set(SCRIPTS) and len(SCRIPTS) > 20
    missing = {name: why for name, why in found.items() if isinstance(why, str)}
    assert {why.split()[1] for why in missing.values()} <= BENCH_EXTRA, missing
    assert [name for name, ok in found.items() if ok is False] == []
