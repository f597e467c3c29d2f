"""Lite's ARM kernels on this box: the runner built for aarch64 (``python -m inference.build_runner --arch aarch64``:
PyPI's aarch64 Lite SDK, cross-compiled) and run under qemu-user's instruction emulation on another host, natively on
an aarch64 one.

Ascend inference boxes run their host code on ARM (Kunpeng 920 servers; Atlas boards on Arm cores), and Lite's ARM
kernels are not its x86 kernels: the same graph gives other last bits. Under qemu-user the ARM instructions are
translated one by one, so the answers are those of the ARM kernels on hardware with the same features; the CPU model
decides those features, and with them the kernel variant Lite picks (e.g. float16 arithmetic, dot product, SVE).

The CPU model (``--arm-cpu``, ``MSRL_ARM_CPU``): ``neoverse-n1`` by default. Kunpeng 920, the host CPU of Ascend
servers, is HiSilicon's TaiShan v110 core: Armv8.2-A with half-precision arithmetic (fphp, asimdhp) and dot product
(asimddp), no SVE. QEMU has no TaiShan model; its Neoverse N1, the Armv8.2-A server core of the same generation,
offers exactly those extensions (the hardware capabilities qemu-aarch64 reports: fp asimd aes pmull sha1 sha2 crc32
atomics fphp asimdhp cpuid asimdrdm lrcpc dcpop asimddp; TaiShan adds jscvt, fcma and asimdfhm, which Lite's kernels
do not select on). ``cortex-a76`` reports the same set; ``max`` turns on everything QEMU knows, SVE included.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
from functools import lru_cache
from pathlib import Path
from typing import Any

from inference.lite.common import RUNNER_NAME, runner_path

ARM_CPUS = ("neoverse-n1", "cortex-a76", "max")
DEFAULT_ARM_CPU = "neoverse-n1"
SYSROOT = Path("/usr/aarch64-linux-gnu")  # Debian's cross toolchain: the aarch64 C and C++ runtime libraries
PACKAGES = "apt-get install g++-aarch64-linux-gnu qemu-user"
BUILD = "python -m inference.build_runner --arch aarch64"
KERNELS_NOTE = ("ARM kernels under instruction emulation (bit-exact with the hardware for the same kernel path; the "
                "kernel variant follows the emulated CPU's features)")  # fmt: skip

_REPO = Path(__file__).resolve().parents[2]


def native() -> bool:
    """This host is aarch64: its own Lite runner runs ARM kernels, without emulation."""
    return platform.machine() in ("aarch64", "arm64")


def arm_cpu(cpu: str | None = None) -> str:
    """The CPU model to emulate: ``cpu``, else ``$MSRL_ARM_CPU``, else the default; ValueError for another name."""
    name = cpu or os.environ.get("MSRL_ARM_CPU") or DEFAULT_ARM_CPU
    if name not in ARM_CPUS:
        raise ValueError(f"unknown ARM CPU {name!r} (--arm-cpu / MSRL_ARM_CPU: one of {', '.join(ARM_CPUS)})")
    return name


def aarch64_runner() -> Path:
    """The aarch64 runner: ``$MSRL_LITE_AARCH64_RUNNER``; on an aarch64 host the ordinary one; else the checkout's
    ``.lite/bin-aarch64`` or, installed, ``<prefix>/share/msrl-lite/bin-aarch64`` (where build_runner puts it)."""
    env = os.environ.get("MSRL_LITE_AARCH64_RUNNER")
    if env:
        return Path(env)
    if native():
        return runner_path()
    checkout = _REPO / ".lite" / "bin-aarch64" / RUNNER_NAME
    installed = Path(sys.prefix) / "share" / "msrl-lite" / "bin-aarch64" / RUNNER_NAME
    if checkout.is_file() or not installed.is_file() and (_REPO / ".lite").is_dir():
        return checkout  # a source checkout runs its own build (or says where `make lite-aarch64` puts it)
    return installed


def launcher(cpu: str | None = None) -> list[str]:
    """The command the aarch64 runner runs under here: nothing on an aarch64 host, else qemu-aarch64 on ``cpu``."""
    if native():
        return []
    return ["qemu-aarch64", "-L", str(SYSROOT), "-cpu", arm_cpu(cpu)]


def unavailable_reason() -> str | None:
    """Why the aarch64 runner cannot run here, in one line naming what to install (None: it can)."""
    if not native():
        missing = [what for what, ok in (("qemu-aarch64", shutil.which("qemu-aarch64")),
                                         (f"the aarch64 C++ runtime in {SYSROOT}", (SYSROOT / "lib").is_dir()))
                   if not ok]  # fmt: skip
        if missing:
            return f"{' and '.join(missing)} not found: {PACKAGES}, then {BUILD}"
    runner = aarch64_runner()
    if not runner.is_file():
        return f"the aarch64 Lite runner is not built ({runner}): {BUILD} (needs {PACKAGES})"
    if not os.access(runner, os.X_OK):  # as the x86 runner's check says it: unavailable (exit 3), not a defect
        return f"the aarch64 Lite runner at {runner} is not executable"
    if build_record(runner).get("arch") not in (None, "aarch64"):
        return f"{runner} is built for {build_record(runner)['arch']}, not aarch64: {BUILD}"
    return None


def build_record(runner: Path | None = None) -> dict[str, Any]:
    """The aarch64 runner's ``msrl-lite-runner.json`` ({} if missing or unreadable)."""
    path = (runner or aarch64_runner()).with_name(RUNNER_NAME + ".json")
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


@lru_cache(maxsize=1)
def qemu_version() -> str | None:
    """``qemu-aarch64 --version``'s first line (None without it)."""
    try:
        out = subprocess.run(["qemu-aarch64", "--version"], capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.splitlines()[0].strip() if out.stdout else None


def describe(cpu: str | None = None) -> str:
    """Where the ARM kernels run, for reports: natively, or under which emulator and CPU model."""
    if native():
        return f"ARM kernels natively on this {platform.machine()} host"
    return f"{KERNELS_NOTE}: {qemu_version() or 'qemu-aarch64'}, -cpu {arm_cpu(cpu)}"


def add_arm_cpu(p: argparse.ArgumentParser) -> None:
    """``--arm-cpu``: the CPU model lite-aarch64 emulates (passed on as ``MSRL_ARM_CPU``, to runtimes and children)."""
    p.add_argument("--arm-cpu", choices=ARM_CPUS, help="the ARM CPU model lite-aarch64 emulates under qemu-user "
                   f"(default: $MSRL_ARM_CPU, else {DEFAULT_ARM_CPU}, the closest to Kunpeng 920)")  # fmt: skip


def apply_arm_cpu(args: argparse.Namespace) -> None:
    if args.arm_cpu:
        os.environ["MSRL_ARM_CPU"] = args.arm_cpu
