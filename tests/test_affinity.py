"""--cpu-pin: which runs ``auto`` pins, and that a pinned process's threads get their CPUs back."""

from __future__ import annotations

import os
import threading

import pytest

from inference.errors import UsageError
from msrl_consistency.training import affinity


def masks() -> dict[int, set[int]]:
    return {int(t): os.sched_getaffinity(int(t)) for t in os.listdir("/proc/self/task")}


def test_auto_pins_only_runs_whose_threads_work_in_turn():
    assert affinity.auto_reason("cpu", 1, 1) is None
    assert affinity.auto_reason("CPU", 1, 0) is None
    assert affinity.auto_reason("ascend", 1, 1) == "device ascend"
    assert affinity.auto_reason("cpu", 2, 1) == "2 op threads"
    assert affinity.auto_reason("cpu", 1, 2) == "the env engine steps in 2 threads"
    assert affinity.pin("auto", 0, 1, "2 op threads").describe() == {"cpu": None, "reason": "auto: 2 op threads"}
    assert affinity.pin("off", 0, 1, None).describe() == {"cpu": None, "reason": "--cpu-pin off"}


def test_ranks_take_their_own_cpu_and_a_named_cpu_must_be_allowed():
    allowed = sorted(os.sched_getaffinity(0))
    assert [affinity.choose_cpu("auto", r, 2) for r in range(2)] == [allowed[r % len(allowed)] for r in range(2)]
    assert affinity.choose_cpu("auto", 0, 1) in allowed
    with pytest.raises(UsageError, match="may run on CPUs"):
        affinity.choose_cpu(str(max(allowed) + 1), 0, 1)


def test_pin_moves_every_thread_and_restore_gives_the_cpus_back():
    before = masks()
    stop = threading.Event()
    early = threading.Thread(target=stop.wait)  # a thread that exists when the process is pinned
    early.start()
    cpu = sorted(os.sched_getaffinity(0))[-1]
    pinning = affinity.pin(str(cpu), 0, 1, "ignored: an explicit CPU overrides auto's reason")
    try:
        late = threading.Thread(target=stop.wait)  # started while pinned: inherits the pin
        late.start()
        assert pinning.describe()["cpu"] == cpu and pinning.threads >= 2
        assert set(map(frozenset, masks().values())) == {frozenset({cpu})}
    finally:
        pinning.restore()
    after = masks()
    assert all(after.get(tid, mask) == mask for tid, mask in before.items())  # (threads may have ended)
    assert after[late.native_id] == before[threading.get_native_id()]  # the caller's CPUs
    stop.set()
    early.join()
    late.join()
