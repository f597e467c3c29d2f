"""Every module of the deploy package imports with MindSpore made unimportable, and pulls in no training stack."""

from __future__ import annotations

import json
import subprocess
import sys

_PROBE = """
import importlib, json, pkgutil, sys
sys.modules['mindspore'] = None
import inference
names = sorted(m.name for m in pkgutil.iter_modules(inference.__path__, 'inference.'))
for name in names:
    importlib.import_module(name)
heavy = ('mindspore', 'msrl_consistency', 'onnx', 'onnxruntime', 'matplotlib', 'torch', 'gymnasium')
loaded = sorted(m for m, mod in sys.modules.items() if m.split('.')[0] in heavy and mod is not None)
print(json.dumps({'modules': names, 'loaded': loaded}))
"""


def test_every_deploy_module_imports_without_mindspore():
    proc = subprocess.run([sys.executable, "-c", _PROBE], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    expected = {"bench", "build_runner", "bundle", "doctor", "lite_client", "mindir", "play", "sdk"}
    assert expected <= {m.removeprefix("inference.") for m in result["modules"]}
    # Gymnasium too is imported only when episodes are played, so doctor and bench start without it.
    assert result["loaded"] == []
