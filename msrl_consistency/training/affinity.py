"""Keep a training process's threads on one CPU (``--cpu-pin``).

With one op thread, MindSpore still hands each graph call between its own threads (the caller, the runtime's actors,
oneDNN's pool). On a virtual machine a hand-off to a thread on another, idle vCPU waits for that vCPU to wake up; on
one CPU it is a plain context switch. Measured 2026-12 on an Intel Xeon VM with 2 vCPUs (bench/train_throughput.py,
whole runs pinned and unpinned alternating): CartPole 1.15-1.8x and Pendulum 1.5-2.7x more steps per second with
every thread on one CPU (act call 1.9 → 1.0 ms, CartPole update 19 → 12 ms). The PyTorch twin, one thread of its
own, gains nothing from it. Pinning changes no arithmetic (oneDNN splits its work the same way), so a pinned run is
bitwise the unpinned one.

``auto`` pins only where every thread of the run works in turn anyway: the CPU device with one op thread and an env
engine that steps in at most one thread (classic control on EnvPool, gymnasium's sync vector env). Box2D and MuJoCo
on EnvPool step in one thread per core, which pinning would squeeze onto one; ``--cpu-pin N`` pins them too.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from inference.errors import UsageError


def _threads() -> list[int]:
    return [int(tid) for tid in os.listdir("/proc/self/task")]


def supported() -> bool:
    return hasattr(os, "sched_setaffinity") and os.path.isdir("/proc/self/task")


def current_cpu() -> int | None:
    """The CPU this thread last ran on (field 39 of ``/proc/thread-self/stat``), None where unknown."""
    try:
        return int(Path("/proc/thread-self/stat").read_text().rsplit(")", 1)[1].split()[36])
    except (OSError, IndexError, ValueError):
        return None


def choose_cpu(setting: str, local_rank: int, world_size: int) -> int:
    """The CPU to pin to: ``setting`` if it names one; else a rank's own CPU (local rank modulo the CPUs this process
    may use), or for one process the CPU it runs on now (two runs started side by side then rarely share one)."""
    allowed = sorted(os.sched_getaffinity(0))
    if setting not in ("auto", "off"):
        cpu = int(setting)
        if cpu not in allowed:
            raise UsageError(f"--cpu-pin {cpu}: this process may run on CPUs {allowed} only")
        return cpu
    if world_size > 1:
        return allowed[local_rank % len(allowed)]
    now = current_cpu()
    return now if now in allowed else allowed[0]


def auto_reason(device: str, threads: int, env_threads: int) -> str | None:
    """Why ``auto`` leaves the run unpinned, or None to pin it."""
    if device.lower() != "cpu":
        return f"device {device}"
    if threads != 1:
        return f"{threads} op threads"
    if env_threads > 1:
        return f"the env engine steps in {env_threads} threads"
    return None


@dataclass
class Pinning:
    """What ``pin`` did, for run.json, and the masks ``restore`` puts back (for callers that go on in-process)."""

    cpu: int | None = None
    threads: int = 0
    reason: str | None = None
    saved: dict[int, set[int]] = field(default_factory=dict)
    caller: set[int] = field(default_factory=set)  # the mask of the thread that pinned

    def describe(self) -> dict[str, Any]:
        if self.cpu is None:
            return {"cpu": None, "reason": self.reason}
        return {"cpu": self.cpu, "threads": self.threads}

    def restore(self) -> None:
        """Every thread back to its mask from before ``pin``; threads started since then get the caller's."""
        if self.cpu is None:
            return
        for tid in _threads():
            with contextlib.suppress(OSError):  # the thread ended meanwhile
                os.sched_setaffinity(tid, self.saved.get(tid, self.caller))
        self.cpu, self.saved = None, {}


def pin(setting: str, local_rank: int, world_size: int, reason: str | None) -> Pinning:
    """Pin every thread of this process to one CPU; threads started later inherit it from their starter.

    ``reason`` (from ``auto_reason``) keeps an ``auto`` run unpinned; an explicit CPU overrides it.
    """
    if setting == "off":
        return Pinning(reason="--cpu-pin off")
    if not supported():
        if setting != "auto":
            raise UsageError("--cpu-pin needs Linux's sched_setaffinity")
        return Pinning(reason="no sched_setaffinity here")
    if setting == "auto" and reason is not None:
        return Pinning(reason=f"auto: {reason}")
    cpu = choose_cpu(setting, local_rank, world_size)
    pinning = Pinning(cpu=cpu, caller=os.sched_getaffinity(0))
    for tid in _threads():
        try:
            pinning.saved[tid] = os.sched_getaffinity(tid)
            os.sched_setaffinity(tid, {cpu})
        except OSError:
            continue
        pinning.threads += 1
    return pinning
