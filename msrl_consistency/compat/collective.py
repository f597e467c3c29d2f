"""msrun and MindSpore's collective communication: roles, the cluster's environment, data-parallel gradients."""

from __future__ import annotations

import os
import re

import mindspore as ms
import numpy as np
from mindspore import nn

# msrun starts one scheduler and N workers, all running the same command, and tells each its role through
# the environment (measured on 2.10: MS_ROLE, MS_WORKER_NUM, MS_SCHED_HOST/PORT, MS_NODE_ID, RANK_ID,
# DEVICE_ID = the local rank). The collective backend follows the device: mccl on CPU, nccl on GPU, hccl on
# Ascend; the same code path runs on all three.
ROLE_ENV, SCHEDULER_ROLE, WORKER_ROLE = "MS_ROLE", "MS_SCHED", "MS_WORKER"
# What the `msrun` script runs. It parses its own options anywhere on its command line, abbreviations included:
# a rank's flag must not be a prefix of one of msrun's (e.g. "--worker" is taken for "--worker_num"; tested).
MSRUN_MODULE = "mindspore.parallel.cluster.run"
ALLREDUCE_FUSION_MB = 64  # one fused AllReduce for these small MLPs: 4.4 → 1.7-2.4 ms per update, 2 workers
# msrun's log line when it sees a worker fail (it then SIGKILLs the others), e.g.
# "Worker process 1234 exit with exception. Error code: -9."
_MSRUN_FAILED = re.compile(r"Worker process (\d+) exit with exception\. Error code: (-?\d+)")


# Ranks retry joining the scheduler every 3-5 s by default (measured: a 2-rank join took 5-8 s); on one machine
# a 1-2 s retry interval forms the cluster 2-4 s sooner.
FAST_JOIN_ENV = {"MS_RETRY_INTERVAL_LOWER": "1", "MS_RETRY_INTERVAL_UPPER": "2"}


def cluster_role() -> str | None:
    """``MS_SCHED`` or ``MS_WORKER`` when this process was started by msrun, else ``None``."""
    return os.environ.get(ROLE_ENV) or None


def cluster_env() -> dict[str, str]:
    """What msrun told this process: scheduler address and port, world size, node id, local rank."""
    keys = {"MS_SCHED_HOST": "master_addr", "MS_SCHED_PORT": "master_port", "MS_WORKER_NUM": "world_size",
            "MS_NODE_ID": "node_id", "DEVICE_ID": "local_rank", "RANK_ID": "rank_id"}  # fmt: skip
    return {name: os.environ[key] for key, name in keys.items() if key in os.environ}


def collective_backend(device: str) -> str:
    """The collective library MindSpore uses for ``device``."""
    return {"cpu": "mccl", "gpu": "nccl", "ascend": "hccl"}[device.lower()]


def init_collective() -> tuple[int, int]:
    """Join the msrun cluster; returns ``(rank, world_size)``.

    Call ``set_device`` first (the backend follows the device). In the scheduler role this call runs the
    scheduler until every worker has finished and then ends the process; when a worker vanishes it raises
    ``RuntimeError`` naming the node that timed out.
    """
    from mindspore.communication import get_group_size, get_rank, init

    init()
    return get_rank(), get_group_size()


def configure_data_parallel() -> None:
    """Data parallel with mean gradients and fused AllReduce (one collective per update, not one per tensor)."""
    ms.set_auto_parallel_context(
        parallel_mode=ms.ParallelMode.DATA_PARALLEL,
        gradients_mean=True,
        comm_fusion={"allreduce": {"mode": "size", "config": ALLREDUCE_FUSION_MB}},
    )


def grad_reducer(parameters: list[ms.Parameter], world_size: int) -> nn.Cell:
    """Averages gradients over all ranks inside the compiled train step (AllReduce, fused)."""
    return nn.DistributedGradReducer(parameters, mean=True, degree=world_size)


def all_gather_int32(values: np.ndarray) -> np.ndarray:
    """AllGather a 1-D int32 array of the same length on every rank: ``[world_size, len]`` in rank order.

    Runs eagerly (a new length is not a new graph compile). On the CPU backend AllGather takes int32 and
    float, not uint8, and AllReduce takes float only: byte payloads travel as int32 words.
    """
    from mindspore import ops

    out = ops.AllGather()(ms.Tensor(np.ascontiguousarray(values, np.int32))).asnumpy()
    return out.reshape(-1, len(values))


def msrun_first_failure(log_text: str) -> tuple[int, int] | None:
    """``(pid, exit code)`` of the first worker msrun saw fail, from msrun's own log (negative: a signal)."""
    match = _MSRUN_FAILED.search(log_text)
    return (int(match.group(1)), int(match.group(2))) if match else None
