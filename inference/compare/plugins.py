"""Import a team's own code given as ``MODULE:FACTORY`` (their policy Cell, their env), like ``uvicorn main:app``.

MODULE is importable from the current directory; FACTORY may be a dotted attribute path.
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Callable
from typing import Any

from inference.errors import UsageError, first_line


def import_factory(spec: str, flag: str = "--cell") -> Callable[[], Any]:
    """``MODULE:FACTORY`` → the callable; MODULE is importable from the current directory."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise UsageError(f"{flag} expects MODULE:FACTORY (e.g. my_policy:make_policy), got {spec!r}")
    cwd = os.getcwd()
    if cwd not in sys.path:
        sys.path.insert(0, cwd)
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:  # noqa: BLE001 - ImportError or anything the module raises at import
        raise UsageError(f"{flag} {spec}: cannot import {module_name!r}: {first_line(exc)}") from None
    target: Any = module
    for part in attr.split("."):
        if not hasattr(target, part):
            raise UsageError(f"{flag} {spec}: module {module_name!r} has no attribute {attr!r}")
        target = getattr(target, part)
    if not callable(target):
        raise UsageError(f"{flag} {spec}: {attr!r} is not callable")
    return target
