"""``lite``: MindSpore Lite through the C++ runner process (``inference/``), on the bundle's ``.ms``.

``lite-mindir`` asks the same runner to load the ``.mindir`` directly: with a Lite older than the
exporter's MindSpore this fails with a version error, which verify reports as a version-contract
failure rather than as a crash.
"""

from __future__ import annotations

import numpy as np

from inference import lite_client as lc
from inference.errors import MsrlError
from inference.runtimes.base import InferenceFailed, Runtime, RuntimeSource


class IncompatibleModel(MsrlError):
    """The runtime cannot read the exporter's format version (a version-contract check inside verify)."""


class LiteRuntime(Runtime):
    name = "lite"
    description = "MindSpore Lite C++ runner (own process) on the bundle's .ms"
    fmt = "ms"
    timeout = 10.0

    @classmethod
    def unavailable_reason(cls, source: RuntimeSource) -> str | None:
        ok, detail = lc.runner_available()
        return None if ok else detail

    def _load(self) -> None:
        path = self.model_path()
        try:
            self.runner = lc.LiteRunner(
                path, device=self.source.device, device_id=self.source.device_id, timeout=self.timeout
            )
        except lc.MindIRVersionError as exc:
            raise IncompatibleModel(f"{self.name}: {exc}") from None
        except lc.LiteRunnerError as exc:
            raise InferenceFailed(f"{self.name}: {exc}") from None
        names = [o.name for o in self.runner.outputs]
        wanted = [o.name for o in self.outputs]
        # Names survive ONNX → .ms conversion; fall back to position if a converter renames them.
        self.output_order = wanted if set(wanted) <= set(names) else names

    def _run(self, arrays: list[np.ndarray]) -> list[np.ndarray]:
        try:
            out = self.runner.infer(*arrays)
        except lc.LiteRunnerError as exc:
            raise InferenceFailed(f"{self.name}: {exc}") from None
        return [out[name] for name in self.output_order]

    def _unload(self) -> None:
        self.runner.close()

    def versions(self) -> dict[str, str]:
        return {"mindspore_lite": getattr(getattr(self, "runner", None), "lite_version", "unknown")}


class LiteMindirRuntime(LiteRuntime):
    name = "lite-mindir"
    description = "MindSpore Lite C++ runner on the bundle's .mindir (needs Lite >= the exporter's MindSpore)"
    fmt = "mindir"
