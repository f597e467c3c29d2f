"""All runtimes by name, and which of them can run on this machine.

The deploy side's runtimes are listed here. Runtimes that live elsewhere are added with ``register``: the
training package registers the MindSpore ones (``ms-cell``, ``ms-graph``, ``ms-mindir``) when it is imported, so
this package names no module of it. Until registered (a deploy box without MindSpore) those three are listed as
unavailable with that reason, so verify and check still accept their names and say why they did not run.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator, Mapping

from inference.runtimes.base import Runtime, RuntimeSource

REFERENCE = "ms-cell"
# Registered by the training stack; named here so a box without it lists them (unavailable), in this order.
TRAINING_SIDE = ("ms-cell", "ms-graph", "ms-mindir")
NEEDS_TRAINING_STACK = "needs the training stack (msrl-consistency with MindSpore)"
_BUILTIN = {
    "lite": "inference.runtimes.lite:LiteRuntime",
    "lite-mindir": "inference.runtimes.lite:LiteMindirRuntime",
    "lite-aarch64": "inference.runtimes.lite_aarch64:LiteAarch64Runtime",
    "lite-aarch64-fp16": "inference.runtimes.lite_aarch64:LiteAarch64Fp16Runtime",
    "lite-python": "inference.runtimes.lite_python:LitePythonRuntime",
    "onnxruntime": "inference.runtimes.onnxrt:OnnxRuntime",
    "emulated-fp16": "inference.runtimes.emulated:EmulatedFp16Runtime",  # opt-in: the class says so
}

# Name → a Runtime class, or ``MODULE:CLASS`` imported on first use (registering must not import MindSpore);
# None: a training-side name nothing registered yet.
Target = type[Runtime] | str | None
_targets: dict[str, Target] = {**dict.fromkeys(TRAINING_SIDE), **_BUILTIN}


def register(name: str, runtime: type[Runtime] | str) -> None:
    """Add (or replace) the runtime ``name``: a ``Runtime`` subclass, or ``"MODULE:CLASS"`` to import lazily."""
    if isinstance(runtime, str) and runtime.count(":") != 1:
        raise ValueError(f"runtime {name!r}: expected MODULE:CLASS, got {runtime!r}")
    _targets[name] = runtime
    RUNTIMES.forget(name)


class _Missing(Runtime):
    """Stands in for a runtime that cannot be loaded here (not registered, or its module does not import)."""

    reason = ""

    @classmethod
    def unavailable_reason(cls, source: RuntimeSource) -> str | None:
        return cls.reason

    def _load(self) -> None:  # pragma: no cover - never opened: why_not() always answers
        raise AssertionError(self.reason)

    def _run(self, arrays):  # pragma: no cover
        raise AssertionError(self.reason)


def _missing(name: str, reason: str) -> type[Runtime]:
    return type(f"Missing[{name}]", (_Missing,), {"name": name, "description": reason, "reason": reason})


class _Registry(Mapping[str, type[Runtime]]):
    """Name → Runtime class, importing each module on first use."""

    def __init__(self) -> None:
        self._classes: dict[str, type[Runtime]] = {}

    def __getitem__(self, name: str) -> type[Runtime]:
        if name not in _targets:
            raise KeyError(name)
        if name not in self._classes:
            self._classes[name] = self._resolve(name, _targets[name])
        return self._classes[name]

    @staticmethod
    def _resolve(name: str, target: Target) -> type[Runtime]:
        if target is None:
            return _missing(name, f"{NEEDS_TRAINING_STACK}: not installed, or not imported in this process")
        if not isinstance(target, str):
            return target
        module, attr = target.split(":")
        try:
            return getattr(importlib.import_module(module), attr)
        except ImportError as exc:
            prefix = NEEDS_TRAINING_STACK if name in TRAINING_SIDE else "cannot be imported here"
            return _missing(name, f"{prefix}: {exc}")

    def forget(self, name: str) -> None:
        """Drop the resolved class of ``name`` (it was registered anew)."""
        self._classes.pop(name, None)

    def __iter__(self) -> Iterator[str]:
        return iter(_targets)

    def __len__(self) -> int:
        return len(_targets)


RUNTIMES = _Registry()


def availability(source: RuntimeSource, names: list[str] | None = None) -> dict[str, str | None]:
    """Name → None if runnable here, else the reason it is not."""
    return {name: RUNTIMES[name].why_not(source) for name in (names or list(RUNTIMES))}


def create(name: str, source: RuntimeSource, graph: str) -> Runtime:
    return RUNTIMES[name](source, graph)
