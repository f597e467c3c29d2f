"""Which runtime serves a bundle's graph on this box, on which file, and why: the deploy side's one choice.

``open_graph`` opens one graph for ``Policy`` (and through it ``play`` and ``bench``). ``runtime``:

* ``best``: Lite in this process, on the file ``Bundle.lite_format`` chooses (the rule ``doctor`` and ``check`` use);
  else ONNX Runtime on the ``.onnx`` (CPU only); else the Lite runner process. Each step is tried in that order and
  what ruled it out (not built, cannot load here, a file marked failed at export, a model Lite refuses) is kept for
  the reason the caller prints;
* ``lite``: Lite in this process, or the runner process where it cannot run here (a process that imports MindSpore,
  ``MSRL_LITE_ISOLATE=1``);
* ``lite-isolated``: the runner process (its watchdog kills a graph that hangs);
* ``onnxruntime``: ONNX Runtime on the ``.onnx``.

Nothing is ever silently substituted: the chosen runtime, its file and the reason travel with the model
(``Served``), and a runtime that cannot serve is ``RuntimeUnavailable`` (exit 3) naming every reason.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from inference.bundle import Bundle, BundleError
from inference.errors import RuntimeUnavailable, first_line
from inference.lite.client import LiteRunner
from inference.lite.common import LiteRunnerError, runner_available
from inference.lite.runner_info import open_graph_file
from inference.runtimes.onnxrt import import_problem

RUNTIMES = ("best", "lite", "lite-isolated", "onnxruntime")
_LITE_OPTIONS = ("device", "device_id", "threads", "max_rows")
_RUNNER_OPTIONS = (*_LITE_OPTIONS, "timeout", "runner")


class OnnxModel:
    """ONNX Runtime on one graph, with ``LiteModel``'s interface (``infer`` and ``infer_into`` alike: ONNX Runtime
    hands back fresh arrays)."""

    in_place = False
    restarts = 0

    def __init__(self, path: Path, threads: int = 1) -> None:
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        self.session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        self.path, self.version = path, ort.__version__
        self.inputs = [i.name for i in self.session.get_inputs()]
        self.names = [o.name for o in self.session.get_outputs()]

    @property
    def pid(self) -> int:
        import os

        return os.getpid()

    def infer_into(self, *arrays: np.ndarray) -> dict[str, np.ndarray]:
        feed = dict(zip(self.inputs, arrays, strict=True))
        return dict(zip(self.names, self.session.run(self.names, feed), strict=True))

    infer = infer_into

    def close(self) -> None:
        self.session = None


class _IsolatedModel:
    """The runner process behind the ``infer_into`` interface (its answers are fresh arrays anyway)."""

    in_place = False

    def __init__(self, runner: LiteRunner) -> None:
        self.runner = runner
        self.lite_version = runner.lite_version

    @property
    def pid(self) -> int | None:
        return self.runner.pid

    @property
    def restarts(self) -> int:
        return self.runner.restarts

    def infer_into(self, *arrays: np.ndarray) -> dict[str, np.ndarray]:
        return self.runner.infer(*arrays)

    infer = infer_into

    def close(self) -> None:
        self.runner.close()


@dataclass
class Served:
    """A graph opened on a runtime: the model (``infer``/``infer_into``), the runtime's name, the file it loaded and
    why this runtime and file were chosen."""

    model: Any
    runtime: str
    file: Path
    why: str


def open_graph(bundle: Bundle, graph: str, runtime: str = "best", fmt: str = "auto", **options: Any) -> Served:
    """``graph`` on ``runtime`` (see the module docstring); ``fmt`` the Lite file (``Bundle.lite_format``)."""
    if runtime not in RUNTIMES:
        raise BundleError(f"runtime must be one of {', '.join(RUNTIMES)}, got {runtime!r}")
    steps = {
        "best": (("Lite in this process", _in_process), ("ONNX Runtime", _onnx_fallback),
                 ("the Lite runner process", _runner)),
        "lite": (("Lite in this process", _in_process), ("the Lite runner process", _runner)),
        "lite-isolated": (("the Lite runner process", _runner),),
        "onnxruntime": (("ONNX Runtime", _onnxruntime),),
    }[runtime]  # fmt: skip
    if len(steps) == 1:
        return steps[0][1](bundle, graph, fmt, options)
    ruled_out: list[str] = []
    for name, attempt in steps:
        try:
            served = attempt(bundle, graph, fmt, options)
        except (LiteRunnerError, RuntimeUnavailable, BundleError, OSError, _Unusable) as exc:
            ruled_out.append(f"{name}: {first_line(exc, 300)}")
            continue
        if ruled_out:
            served.why = f"{served.why}; ruled out before it: {'; '.join(ruled_out)}"
        return served
    raise RuntimeUnavailable(f"no runtime can serve {graph} of {bundle.root} here ({'; '.join(ruled_out)})")


class _Unusable(Exception):
    """A step of ``best`` that does not apply here (the reason is its message)."""


def _in_process(bundle: Bundle, graph: str, fmt: str, options: dict[str, Any]) -> Served:
    from inference.lite.inprocess import LiteModel, in_process_reason

    why_not = in_process_reason()
    if why_not is not None:
        raise _Unusable(why_not)
    kwargs = {k: v for k, v in options.items() if k in _LITE_OPTIONS}
    model, chosen, why = open_graph_file(bundle, graph, fmt, lambda path: LiteModel(path, **kwargs))
    return Served(model, "lite", bundle.file(graph, chosen),
                  f"Lite {model.lite_version} in this process on .{chosen} ({why})")  # fmt: skip


def _runner(bundle: Bundle, graph: str, fmt: str, options: dict[str, Any]) -> Served:
    ok, detail = runner_available()
    if not ok:
        raise RuntimeUnavailable(detail)
    kwargs = {k: v for k, v in options.items() if k in _RUNNER_OPTIONS}
    runner, chosen, why = open_graph_file(bundle, graph, fmt, lambda path: LiteRunner(path, **kwargs),
                                          kwargs.get("runner"))  # fmt: skip
    return Served(_IsolatedModel(runner), "lite-isolated", bundle.file(graph, chosen),
                  f"Lite {runner.lite_version} in the runner process on .{chosen} ({why})")  # fmt: skip


def _onnx_fallback(bundle: Bundle, graph: str, _fmt: str, options: dict[str, Any]) -> Served:
    if options.get("device", "cpu") != "cpu":
        raise _Unusable(f"runs on the CPU only, and device {options['device']!r} was asked for")
    return _onnxruntime(bundle, graph, _fmt, options)


def _onnxruntime(bundle: Bundle, graph: str, _fmt: str, options: dict[str, Any]) -> Served:
    problem = import_problem()
    if problem:
        raise RuntimeUnavailable(problem)
    path = bundle.file(graph, "onnx")  # not exported, or failed at export: a BundleError saying which
    model = OnnxModel(path, int(options.get("threads", 1)))
    return Served(model, "onnxruntime", path, f"ONNX Runtime {model.version} in this process on .onnx")
