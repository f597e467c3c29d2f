"""The one home of MindSpore version quirks (measured on 2.10; the API moved a lot since 2.3).

Everything else imports MindSpore settings through these helpers, so a new MindSpore release
means editing this file only.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import Any

# Silence WARNING-level glog lines (e.g. nn.Adam's FusedSparseAdam deprecation) before the import.
os.environ.setdefault("GLOG_v", "3")

import mindspore as ms  # noqa: E402
from mindspore import nn  # noqa: E402
from mindspore.graph import api as _graph_api  # noqa: E402  (private: the compiled-call fast path below)

DEVICES = {"cpu": "CPU", "gpu": "GPU", "ascend": "Ascend"}
_configured: dict[str, object] = {}


def mindspore_version() -> str:
    return ms.__version__


def set_device(device: str = "cpu", device_id: int = 0) -> None:
    """Select the device once per process (``ms.set_device``; ``set_context(device_target=)`` is deprecated).

    Raises ``ValueError`` with a readable reason when the device is not available here.
    """
    key = device.lower()
    if key not in DEVICES:
        raise ValueError(f"unknown device {device!r}; choose one of {', '.join(DEVICES)}")
    target = DEVICES[key]
    if not ms.hal.is_available(target):
        raise ValueError(
            f"device {device!r} is not available in this MindSpore build ({mindspore_version()}); "
            "install the matching MindSpore package or use --device cpu"
        )
    if _configured.get("device") == (target, device_id):
        return
    if "device" in _configured:
        raise ValueError(f"device already set to {_configured['device']}; one device per process")
    ms.set_device(target, device_id)
    _configured["device"] = (target, device_id)


def select_device(device: str = "cpu", device_id: int = 0) -> str | None:
    """``set_device`` before any kernel runs (MindSpore refuses it afterwards); returns why not instead of raising,
    so that a missing backend is reported by the runtimes that need it (unavailable, exit 3)."""
    try:
        set_device(device, device_id)
    except ValueError as exc:
        return str(exc)
    return None


def set_threads(num_threads: int) -> None:
    """Pin CPU op threads; MindSpore lets this be set only once per process, so later calls are ignored."""
    if "threads" in _configured or num_threads <= 0:
        return
    ms.device_context.cpu.op_tuning.threads_num(num_threads)
    _configured["threads"] = num_threads


def use_graph_mode() -> None:
    """Compile Cells (GRAPH_MODE): measured ~10x faster than a jit function holding the optimizer."""
    ms.set_context(mode=ms.GRAPH_MODE)


def use_pynative_mode() -> None:
    ms.set_context(mode=ms.PYNATIVE_MODE)


@contextlib.contextmanager
def execution_mode(graph: bool) -> Iterator[None]:
    """Temporarily switch between GRAPH_MODE and PYNATIVE_MODE (the mode is process-global)."""
    previous = ms.get_context("mode")
    ms.set_context(mode=ms.GRAPH_MODE if graph else ms.PYNATIVE_MODE)
    try:
        yield
    finally:
        ms.set_context(mode=previous)


def set_seed(seed: int) -> None:
    """Seed MindSpore's global RNG: used only by weight initialisers (all sampling noise comes from the host)."""
    ms.set_seed(seed)


def as_tuple(outputs: Any) -> tuple[Any, ...]:
    """A Cell's outputs as a tuple: a single-output Cell (or GraphCell) returns a bare Tensor."""
    return tuple(outputs) if isinstance(outputs, tuple | list) else (outputs,)


class CompiledCall:
    """Call a GRAPH_MODE Cell straight through its compiled graph on the hot path.

    ``Cell.__call__`` re-derives the compile key from every argument on each call: measured 0.3-1.2 ms per
    call on MindSpore 2.10's CPU backend, more than a small policy's kernels take. The first call with a
    given argument signature (shapes, dtypes) goes through ``Cell.__call__`` and compiles; later calls with
    that signature hand the arguments to the graph executor the way ``Cell.compile_and_run`` does. Same
    graph, same Parameters, same outputs (tested bitwise); only the Python bookkeeping is skipped.
    """

    def __init__(self, cell: nn.Cell) -> None:
        self.cell = cell
        self._phases: dict[tuple[Any, ...], tuple[str, list[bool], list[bool]]] = {}

    def __call__(self, *args: ms.Tensor) -> Any:
        if not all(isinstance(a, ms.Tensor) for a in args):
            return self.cell(*args)  # the shortcut is keyed on tensor shapes and dtypes only
        signature = tuple((a.shape, a.dtype) for a in args)
        known = self._phases.get(signature)
        if known is None or ms.get_context("mode") != ms.GRAPH_MODE:
            out = self.cell(*args)
            if ms.get_context("mode") == ms.GRAPH_MODE:
                self._phases[signature] = (
                    _graph_api._real_phase(self.cell.phase, self.cell),
                    list(self.cell._has_mutable_args_list or []),
                    list(self.cell.sequence_modified or []),
                )
            return out
        phase, mutable_flags, sequence_modified = known
        executor = _graph_api._cell_graph_executor._graph_executor
        executor.set_jit_config(getattr(self.cell, "jit_config_dict", None) or _graph_api._DEFAULT_JIT_CONFIG)
        run_args = executor.get_args_for_run(self.cell, args, {}, mutable_flags, sequence_modified, False, False)
        return _graph_api._convert_python_data(executor(tuple(run_args), phase))
