"""This box, as the deploy side reports it next to what a bundle pins: package versions (read from their metadata,
never imported), the CPU model and its SIMD level (AVX2 / AVX-512 / NEON give different float roundings), the CANN
toolkit, the Ascend driver and devices. ``doctor`` prints it, ``bench`` records it with every result, the reports
put it in their provenance."""

from __future__ import annotations

import datetime as dt
import glob
import importlib.metadata as md
import os
import platform
import re
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

ASCEND_ROOTS = ("/usr/local/Ascend/ascend-toolkit/latest", "/usr/local/Ascend/latest")
_ARM_IMPLEMENTERS = {"0x41": "Arm", "0x48": "HiSilicon", "0x51": "Qualcomm", "0x61": "Apple", "0xc0": "Ampere"}


def package_version(name: str) -> str | None:
    """An installed distribution's version without importing it (MindSpore's import costs seconds and GBs)."""
    try:
        return md.version(name)
    except md.PackageNotFoundError:
        return None


def parse_cpuinfo(text: str) -> tuple[str, set[str]]:
    """CPU model and feature flags from /proc/cpuinfo text (x86 ``model name``/``flags``, Arm ``Features``)."""
    fields: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip() not in fields:
            fields[key.strip()] = value.strip()
    flags = set((fields.get("flags") or fields.get("Features") or "").split())
    model = fields.get("model name") or fields.get("Hardware") or ""
    if not model and "CPU implementer" in fields:
        vendor = _ARM_IMPLEMENTERS.get(fields["CPU implementer"].lower(), fields["CPU implementer"])
        model = f"{vendor} CPU part {fields.get('CPU part', '?')}"
    return model or "unknown", flags


def simd_level(flags: set[str], machine: str) -> str:
    """The widest SIMD extension the kernels can use: it decides float rounding (FMA, reduction order)."""
    if machine in ("x86_64", "AMD64", "i686"):
        if "avx512f" in flags:
            return "AVX-512"
        if "avx2" in flags:
            return "AVX2" + ("+FMA" if "fma" in flags else "")
        if "avx" in flags:
            return "AVX"
        return "SSE4.2" if "sse4_2" in flags else "SSE2"
    if machine.startswith(("aarch64", "arm")):
        if "sve" in flags:
            return "NEON+SVE"
        return "NEON" if {"asimd", "neon"} & flags else "none"
    return "unknown"


def host_cpu() -> tuple[str, str]:
    """This host's CPU model and SIMD level, from /proc/cpuinfo (``unknown`` without it)."""
    try:
        model, flags = parse_cpuinfo(Path("/proc/cpuinfo").read_text(errors="replace"))
    except OSError:
        model, flags = "unknown", set()
    return model, simd_level(flags, platform.machine())


def measured_here(command: str) -> str:
    """How a measurement is labelled: the date, this host's CPU model and core count, and the command that made it."""
    return f"{dt.date.today().isoformat()}, {host_cpu()[0]} ({os.cpu_count()} CPUs), `{command}`"


def cpu_summary() -> str:
    """One line naming this host's CPU, e.g. ``Intel(R) Xeon(R) Processor, AVX-512, 2 CPUs``: the benchmarks record
    it with each result, since float paths (PyTorch's, not ours) and speed ratios differ from one CPU to another."""
    model, simd = host_cpu()
    return f"{model}, {simd}, {os.cpu_count()} CPUs"


def _key_values(path: Path) -> dict[str, str]:
    out: dict[str, str] = {}
    try:
        for line in path.read_text(errors="replace").splitlines():
            key, sep, value = line.partition("=")
            if sep:
                out[key.strip().lower()] = value.strip()
    except OSError:
        pass
    return out


def cann_info() -> dict[str, str] | None:
    """The Ascend CANN toolkit found via ``$ASCEND_HOME_PATH``/``$ASCEND_TOOLKIT_HOME`` or the default paths."""
    roots = [os.environ.get("ASCEND_HOME_PATH"), os.environ.get("ASCEND_TOOLKIT_HOME"), *ASCEND_ROOTS]
    for root in filter(None, roots):
        base = Path(root)
        candidates = sorted(base.glob("*/ascend_toolkit_install.info")) + [base / "version.cfg"]
        for info in candidates:
            kv = _key_values(info)
            version = kv.get("version") or kv.get("toolkit_running_version") or kv.get("runtime_running_version")
            if version:
                return {"version": version.strip("[]").split(":")[0], "path": str(info)}
    return None


def ascend_devices() -> list[str]:
    return sorted(p for p in glob.glob("/dev/davinci*") if re.fullmatch(r"/dev/davinci\d+", p))


def environment(lite: Mapping[str, Any] | None) -> dict[str, Any]:
    """This box: Python and package versions (never imported), CPU model and SIMD level, the Lite build (``lite``:
    ``RunnerInfo.summary()``, None without a runner), CANN, the Ascend driver and devices."""
    model, simd = host_cpu()
    machine = platform.machine()
    cann = cann_info()
    driver = _key_values(Path("/usr/local/Ascend/driver/version.info")).get("version")
    return {
        "python": platform.python_version(),
        "numpy": package_version("numpy"),
        "gymnasium": package_version("gymnasium"),
        "mindspore": package_version("mindspore"),
        "machine": machine,
        "cpu_model": model,
        "simd": simd,
        "lite": None if lite is None else dict(lite),
        "cann": cann,
        "ascend_driver": driver,
        "ascend_devices": ascend_devices(),
        "npu_smi": shutil.which("npu-smi"),
    }
