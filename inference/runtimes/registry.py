"""All runtimes by name, and which of them can run on this machine.

The MindSpore runtimes (``ms-cell``, ``ms-graph``, ``ms-mindir``) live in the training package and are
imported only when named; on a deploy box without it they report themselves unavailable with that reason.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator, Mapping

from inference.runtimes.base import Runtime, RuntimeSource

_LOCATIONS = {
    "ms-cell": "msrl_consistency.runtimes.ms_cell:MsCellRuntime",
    "ms-graph": "msrl_consistency.runtimes.ms_cell:MsGraphRuntime",
    "ms-mindir": "msrl_consistency.runtimes.ms_mindir:MsMindirRuntime",
    "lite": "inference.runtimes.lite:LiteRuntime",
    "lite-mindir": "inference.runtimes.lite:LiteMindirRuntime",
    "lite-python": "inference.runtimes.lite_python:LitePythonRuntime",
    "onnxruntime": "inference.runtimes.onnxrt:OnnxRuntime",
}
REFERENCE = "ms-cell"


class _Missing(Runtime):
    """Stands in for a runtime whose module cannot be imported here (the training stack is not installed)."""

    reason = ""

    @classmethod
    def unavailable_reason(cls, source: RuntimeSource) -> str | None:
        return cls.reason

    def _load(self) -> None:  # pragma: no cover - never opened: why_not() always answers
        raise AssertionError(self.reason)

    def _run(self, arrays):  # pragma: no cover
        raise AssertionError(self.reason)


class _Registry(Mapping[str, type[Runtime]]):
    """Name → Runtime class, importing each module on first use."""

    def __init__(self) -> None:
        self._classes: dict[str, type[Runtime]] = {}

    def __getitem__(self, name: str) -> type[Runtime]:
        if name not in _LOCATIONS:
            raise KeyError(name)
        if name not in self._classes:
            module, attr = _LOCATIONS[name].split(":")
            try:
                self._classes[name] = getattr(importlib.import_module(module), attr)
            except ImportError as exc:
                why = f"needs the training stack (msrl-consistency with MindSpore): {exc}"
                self._classes[name] = type(attr, (_Missing,), {"name": name, "description": why, "reason": why})
        return self._classes[name]

    def __iter__(self) -> Iterator[str]:
        return iter(_LOCATIONS)

    def __len__(self) -> int:
        return len(_LOCATIONS)


RUNTIMES = _Registry()


def availability(source: RuntimeSource, names: list[str] | None = None) -> dict[str, str | None]:
    """Name → None if runnable here, else the reason it is not."""
    return {name: RUNTIMES[name].why_not(source) for name in (names or list(RUNTIMES))}


def create(name: str, source: RuntimeSource, graph: str) -> Runtime:
    return RUNTIMES[name](source, graph)
