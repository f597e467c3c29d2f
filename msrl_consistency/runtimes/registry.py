"""All runtimes by name, and which of them can run on this machine."""

from __future__ import annotations

from msrl_consistency.runtimes.base import Runtime, RuntimeSource
from msrl_consistency.runtimes.lite import LiteMindirRuntime, LiteRuntime
from msrl_consistency.runtimes.lite_python import LitePythonRuntime
from msrl_consistency.runtimes.ms_cell import MsCellRuntime, MsGraphRuntime
from msrl_consistency.runtimes.ms_mindir import MsMindirRuntime
from msrl_consistency.runtimes.onnxrt import OnnxRuntime

RUNTIMES: dict[str, type[Runtime]] = {
    cls.name: cls
    for cls in (
        MsCellRuntime,
        MsGraphRuntime,
        MsMindirRuntime,
        LiteRuntime,
        LiteMindirRuntime,
        LitePythonRuntime,
        OnnxRuntime,
    )
}
REFERENCE = MsCellRuntime.name


def availability(source: RuntimeSource, names: list[str] | None = None) -> dict[str, str | None]:
    """Name → None if runnable here, else the reason it is not."""
    return {name: RUNTIMES[name].why_not(source) for name in (names or list(RUNTIMES))}


def create(name: str, source: RuntimeSource, graph: str) -> Runtime:
    return RUNTIMES[name](source, graph)
