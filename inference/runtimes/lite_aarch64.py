"""``lite-aarch64``: the bundle's ``.ms`` in MindSpore Lite's ARM kernels, the ones an ARM device runs: the runner
built for aarch64 against PyPI's aarch64 Lite SDK (``python -m inference.build_runner --arch aarch64``), under
qemu-user's instruction emulation on another host and natively on an aarch64 one, on the CPU model ``--arm-cpu`` /
``MSRL_ARM_CPU`` names (``inference.lite.emulation``). Every check, the stage diagnosis and the first diverging
layer (the runner's tap request), as ``lite``; the report says the kernels ran under emulation.

``lite-aarch64-fp16`` asks Lite for its float16 CPU kernels (``CPUDeviceInfo::SetEnableFP16``), the precision an ARM
CPU with half-precision arithmetic offers: judged with the fp16 tolerance, and available only where this Lite
honours the switch. PyPI's Lite 2.0.0 for aarch64 does not (built without ``MSLITE_ENABLE_FP16``, it says so at
``Build`` and computes in float32): the runtime is then unavailable, with Lite's own words as the reason.

Both are opt-in: verify and inference.check run them when named (``--runtimes``/``--require``), never by default,
since emulation makes every call tens of times slower. Runner starts after a process's first are forked from a loaded
runner (``inference.lite.forks``): ~0.4 s instead of ~4.5 s of qemu translating Lite's libraries again.
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Any

from inference.bundle import BundleError
from inference.lite import emulation as emu
from inference.lite.client import LiteRunner
from inference.runtimes.base import RuntimeSource
from inference.runtimes.lite import LiteRuntime


class LiteAarch64Runtime(LiteRuntime):
    name = "lite-aarch64"
    description = "MindSpore Lite's ARM kernels on the bundle's .ms (the aarch64 runner, under qemu-user off ARM)"
    fmt = "ms"
    opt_in = True
    timeout = 600.0  # a request of 10,000 rows through a CNN, instruction by instruction
    cpu_fp16 = False

    @classmethod
    def unavailable_reason(cls, source: RuntimeSource) -> str | None:
        if source.device != "cpu":
            return f"{cls.name} runs Lite's ARM CPU kernels (--device cpu), not {source.device}"
        try:
            emu.arm_cpu()
        except ValueError as exc:
            return str(exc)
        return emu.unavailable_reason()

    def _open_model(self, path: Path) -> LiteRunner:
        return self.tap_runner(path)

    def tap_runner(self, path: Path) -> LiteRunner:
        return LiteRunner(path, runner=emu.aarch64_runner(), launcher=emu.launcher(), cpu_fp16=self.cpu_fp16,
                          timeout=self.timeout, load_timeout=self.timeout, fork_server=True)  # fmt: skip

    def versions(self) -> dict[str, str]:
        return {**super().versions(), "arch": "aarch64", "emulation": emu.describe()}


class LiteAarch64Fp16Runtime(LiteAarch64Runtime):
    name = "lite-aarch64-fp16"
    description = "lite-aarch64 with Lite's float16 CPU kernels (CPUDeviceInfo::SetEnableFP16), where Lite has them"
    cpu_fp16 = True
    CACHE = "cpu-fp16.json"  # next to the runner: what its Lite said of the switch, per build and CPU model

    @classmethod
    def unavailable_reason(cls, source: RuntimeSource) -> str | None:
        reason = super().unavailable_reason(source)
        if reason is not None:
            return reason
        runner, cpu = emu.aarch64_runner(), emu.arm_cpu()
        cache = runner.with_name(cls.CACHE)
        key = f"{_build_key(runner)} {cpu}"
        known = _read_json(cache)
        if key not in known:  # asked once per build and CPU model: a runner start under emulation takes seconds
            refusal = cls._fp16_refusal(source)
            if refusal is False:
                return None  # no .ms to ask with: the file check reports the bundle
            known[key] = refusal
            with contextlib.suppress(OSError):  # a read-only install asks again next time
                cache.write_text(json.dumps(known, indent=1))
        return known[key]

    @classmethod
    def _fp16_refusal(cls, source: RuntimeSource) -> str | None | bool:
        """Asks this Lite, on the bundle's first graph, whether it takes the float16 switch: None if it does, else
        why not in Lite's words; False when the bundle has no .ms to ask with."""
        graph = source.bundle.graphs[0]
        try:
            path = source.bundle.file(graph, "ms")
        except BundleError:
            return False
        with cls(source, graph).tap_runner(path) as runner:
            outcome = runner.cpu_fp16_outcome
        if outcome.startswith("ignored: "):
            return (f"Lite {runner.lite_version} ignores CPUDeviceInfo::SetEnableFP16 here and computes in float32 "
                    f"(its Build said: {outcome.removeprefix('ignored: ')})")  # fmt: skip
        return None

    def versions(self) -> dict[str, str]:
        runner = getattr(self, "runner", None)
        return {**super().versions(), "cpu_fp16": getattr(runner, "cpu_fp16_outcome", "?")}


def _build_key(runner: Path) -> str:
    """The build that made ``runner`` (build_lite.sh's content hash), else its size and time."""
    try:
        return runner.with_name(".build-key").read_text().strip()
    except OSError:
        stat = runner.stat()
        return f"{stat.st_size}-{stat.st_mtime_ns}"


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}
