"""``lite``: MindSpore Lite's C++ API on the bundle's ``.ms``: in this process (``libmsrl-lite.so``) where it can run
here, i.e. on the deploy side, else through the runner process (a process that imports MindSpore, or
``MSRL_LITE_ISOLATE=1``; ``inference.lite.inprocess.open_lite``).

``lite-mindir`` asks Lite to load the ``.mindir`` directly: with a Lite older than the exporter's MindSpore this
fails with a version error, which verify reports as a version-contract failure rather than as a crash.

In the runner process, a runner killed from outside (``RunnerCrashed.killed_from_outside``) is restarted once and
the request repeated; a second such death is ``RuntimeDied`` (not a verdict on the graph). A runner that crashes
on the graph itself (SIGSEGV, SIGABRT) or hangs (its watchdog) is ``InferenceFailed``, a verdict. Every restart is
recorded in ``restarts`` so the report says so.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from inference.errors import MsrlError
from inference.lite import common as lc
from inference.lite.client import LiteRunner
from inference.lite.inprocess import LiteModel, in_process_reason, open_lite
from inference.runtimes.base import InferenceFailed, Runtime, RuntimeDied, RuntimeHung, RuntimeSource


class IncompatibleModel(MsrlError):
    """The runtime cannot read the exporter's format version (a version-contract check inside verify)."""


class LiteRuntime(Runtime):
    name = "lite"
    description = "MindSpore Lite C++ API on the bundle's .ms (in this process, or the runner process)"
    fmt = "ms"
    timeout = 10.0

    def model_path(self) -> Path:
        """The file the deploy side loads (``Bundle.lite_format``, as ``inference.load`` and ``doctor`` choose it): the
        file verified is the file deployed."""
        from inference.lite.runner_info import choose_format, runner_info

        return self.source.bundle.file(self.graph, choose_format(self.source.bundle, self.graph, "auto",
                                                                 runner_info())[0])  # fmt: skip

    @classmethod
    def unavailable_reason(cls, source: RuntimeSource) -> str | None:
        if in_process_reason() is None:
            return None
        ok, detail = lc.runner_available()
        return None if ok else detail

    def _load(self) -> None:
        path = self.model_path()
        self.restarts: list[str] = []
        for attempt in range(2):
            try:
                self.runner = self._open_model(path)
                break
            except lc.MindIRVersionError as exc:
                raise IncompatibleModel(f"{self.name}: {exc}") from None
            except lc.RunnerCrashed as exc:
                self._killed(exc, attempt, "loading")
            except lc.RunnerTimeout as exc:
                raise RuntimeHung(f"{self.name}: {exc}") from None
            except lc.LiteRunnerError as exc:
                raise InferenceFailed(f"{self.name}: {exc}") from None
        names = [o.name for o in self.runner.outputs]
        wanted = [o.name for o in self.outputs]
        # Names survive ONNX → .ms conversion; fall back to position if a converter renames them.
        self.output_order = wanted if set(wanted) <= set(names) else names

    def _open_model(self, path: Path) -> LiteRunner | LiteModel:
        """Lite on ``path``: in this process where it can run here, else the runner process."""
        return open_lite(
            path, device=self.source.device, device_id=self.source.device_id, timeout=self.timeout, fork_server=True
        )  # a verify starts a runner per graph and per tap request

    def tap_runner(self, path: Path) -> LiteRunner:
        """A runner process on ``path`` for a tap request (every kernel's outputs: layer localisation)."""
        return LiteRunner(
            path, device=self.source.device, device_id=self.source.device_id, timeout=self.timeout, fork_server=True
        )

    def _run(self, arrays: list[np.ndarray]) -> list[np.ndarray]:
        for attempt in range(2):
            try:
                out = self.runner.infer(*arrays)
                break
            except lc.RunnerCrashed as exc:
                self._killed(exc, attempt, "a request")  # the next infer() starts a fresh runner
            except lc.RunnerTimeout as exc:
                raise RuntimeHung(f"{self.name}: {exc}") from None
            except lc.LiteRunnerError as exc:
                raise InferenceFailed(f"{self.name}: {exc}") from None
        return [out[name] for name in self.output_order]

    def _killed(self, exc: lc.RunnerCrashed, attempt: int, during: str) -> None:
        """Record a runner death; return to retry after a first kill from outside, raise otherwise."""
        if not exc.killed_from_outside:
            raise InferenceFailed(f"{self.name}: {exc}") from None
        self.restarts.append(f"{during}: {exc}")
        if attempt:
            raise RuntimeDied(f"{self.name}: the runner was killed from outside twice during {during} "
                              f"({'; '.join(self.restarts)})") from None  # fmt: skip

    def _unload(self) -> None:
        self.runner.close()

    def model_input_dtypes(self) -> list[np.dtype]:
        return [t.dtype for t in self.runner.inputs]

    def versions(self) -> dict[str, str]:
        runner = getattr(self, "runner", None)
        where = "in this process" if getattr(runner, "pid", None) == os.getpid() else "runner process"
        return {"mindspore_lite": getattr(runner, "lite_version", "unknown"), "lite_process": where}


def tap_runner(runtime: str, source: RuntimeSource, graph: str) -> LiteRunner | None:
    """A runner on ``graph``'s ``.ms`` for ``runtime``'s tap request (its kernels' outputs), None for a runtime
    that is not a Lite runner on the ``.ms`` (the localizers then say it gives no per-layer outputs)."""
    from inference.runtimes.registry import RUNTIMES

    cls = RUNTIMES.get(runtime)
    if cls is None or not issubclass(cls, LiteRuntime) or cls.fmt != "ms":
        return None
    rt = cls(source, graph)
    return rt.tap_runner(rt.model_path())


class LiteMindirRuntime(LiteRuntime):
    name = "lite-mindir"
    description = "MindSpore Lite C++ runner on the bundle's .mindir (needs Lite >= the exporter's MindSpore)"
    fmt = "mindir"

    def model_path(self) -> Path:
        return Runtime.model_path(self)
