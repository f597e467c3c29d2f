"""Everything that needs no MindSpore, so an inference box runs it as it is (``pip install ./inference``).

The public surface is here at the top: ``load(BUNDLE)`` and ``Policy`` (a bundle's policy for a control loop,
``policy``), the field recorder (``field``), the errors (``errors``), and the commands ``check``, ``play``,
``bench``, ``doctor``, ``build_runner`` and ``report`` (``python -m inference.X``). Below them, one room per job,
each importing only the rooms under it::

    commands (check, play, bench, doctor, build_runner)   load / Policy, field
        report/  ->  compare/          the comparison (verify's and the device's) and its reports
                     runtimes/         the runtimes without MindSpore, and which one serves a deployed policy
                     lite/             MindSpore Lite: the runner process, Lite in this process, the C++ build
                     bundle/           the bundle format: manifest, schema, contract, spaces, recordings
                     machine/          facts about this box

The training package builds on this one, never the other way round. Names are imported on first use, so ``import
inference`` stays light.
"""

from __future__ import annotations

import importlib
from typing import Any

_PUBLIC = {
    "load": "inference.policy",
    "Policy": "inference.policy",
    "FeedError": "inference.bundle.tensors",
    "TensorMeta": "inference.bundle.tensors",
    "LiteRunner": "inference.lite.client",
    "DeviceUnavailable": "inference.lite.common",
    "InferenceError": "inference.lite.common",
    "LiteRunnerError": "inference.lite.common",
    "MindIRVersionError": "inference.lite.common",
    "ModelLoadError": "inference.lite.common",
    "RunnerCrashed": "inference.lite.common",
    "RunnerTimeout": "inference.lite.common",
    "RunnerUnavailable": "inference.lite.common",
    "runner_available": "inference.lite.common",
    "runner_path": "inference.lite.common",
}

__all__ = sorted(_PUBLIC)


def __getattr__(name: str) -> Any:
    if name in _PUBLIC:
        value = getattr(importlib.import_module(_PUBLIC[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'inference' has no attribute {name!r}")
