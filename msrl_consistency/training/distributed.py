"""Data-parallel plumbing: who this process is, the host-side exchanges between ranks, and the consistency check.

A run is one process (``SingleProcess``: rank 0 of 1, no collective at all) or one rank of an msrun cluster
(``Collective``). Gradients are averaged inside the compiled train step (``training/ppo.py``); everything else
the ranks must agree on, or that rank 0 must log, travels once per iteration through ``Comm.gather``: each rank
pickles a small report, and an AllGather (MindSpore's own collective: mccl on CPU, hccl on Ascend) hands every
rank all reports in rank order. Every rank then does the same float64 arithmetic on the same data, so
host-side state (the observation statistics) stays bitwise identical without a second round trip.

The consistency check hashes each rank's Parameters (weights, normaliser, optimizer moments) and host statistics,
gathers the digests and stops the run on the first disagreement, naming the ranks and the first parameter.
"""

from __future__ import annotations

import hashlib
import json
import os
import pickle
from dataclasses import dataclass
from typing import Any

import numpy as np

from inference.errors import MsrlError, first_line
from msrl_consistency import compat

FAULT_ENV = "MSRL_TRAIN_FAULT"  # test hook, see ``injected_fault``
STATUS_DIR_ENV = "MSRL_RANK_STATUS_DIR"  # set by the launcher: where each rank reports its pid and exit code


class RankDivergence(MsrlError):
    """The ranks' weights or statistics differ: data parallelism is broken (exit 1)."""

    exit_code = 1


class RankLost(MsrlError):
    """A collective operation failed: another rank died or the network failed (exit 1)."""

    exit_code = 1


class SingleProcess:
    """One process: rank 0 of 1. Exchanges are the identity; nothing touches MindSpore's collectives."""

    rank, world_size, local_rank = 0, 1, 0

    def gather(self, obj: Any) -> list[Any]:
        return [obj]

    def broadcast(self, obj: Any) -> Any:
        return obj


class Collective:
    """One rank of an msrun cluster (``join_cluster`` builds it after ``init``)."""

    def __init__(self, rank: int, world_size: int, local_rank: int) -> None:
        self.rank, self.world_size, self.local_rank = rank, world_size, local_rank

    def gather(self, obj: Any) -> list[Any]:
        """Every rank's ``obj`` in rank order, on every rank (two AllGathers: lengths, then padded payloads)."""
        payload = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
        try:
            lengths = compat.all_gather_int32(np.array([len(payload)], np.int32))[:, 0]
            words = np.zeros(-(-int(lengths.max()) // 4) * 4, np.uint8)
            words[: len(payload)] = np.frombuffer(payload, np.uint8)
            rows = compat.all_gather_int32(words.view(np.int32))
        except RuntimeError as exc:
            raise lost_rank(exc, "exchanging per-iteration data") from None
        return [pickle.loads(rows[r].view(np.uint8)[: lengths[r]].tobytes()) for r in range(self.world_size)]

    def broadcast(self, obj: Any) -> Any:
        """Rank 0's ``obj`` on every rank (the others send nothing)."""
        return self.gather(obj if self.rank == 0 else None)[0]


Comm = SingleProcess | Collective


def join_cluster(device: str) -> Collective:
    """Join the msrun cluster this process was started in, on device ``local rank`` (GPU/Ascend)."""
    local_rank = int(compat.cluster_env().get("local_rank", "0"))
    compat.set_device(device, device_id_for(device, local_rank))
    rank, world_size = compat.init_collective()
    compat.configure_data_parallel()
    return Collective(rank, world_size, local_rank)


def device_id_for(device: str, local_rank: int) -> int:
    """One accelerator per rank on a machine (``device_id = local rank``); the CPU backend has just one device."""
    return 0 if device.lower() == "cpu" else local_rank


def run_scheduler() -> int:
    """The msrun scheduler role: MindSpore runs it inside ``init`` until the workers finish."""
    try:
        compat.init_collective()
    except RuntimeError as exc:
        # e.g. "... worker 1 is the first one timed out, please check its log."
        raise RankLost(f"scheduler: {first_line(exc, 300)}") from None
    return 0


def lost_rank(exc: BaseException, doing: str) -> RankLost:
    return RankLost(
        f"a collective operation failed while {doing}: another rank died or the network failed "
        f"(MindSpore: {first_line(exc, 160)}); the launcher or msrun's scheduler log names the rank"
    )


# -- consistency check --------------------------------------------------------------------------------------
def state_digests(named: dict[str, np.ndarray]) -> dict[str, str]:
    """A short hash of each array's dtype, shape and bytes, in the given (fixed) order."""
    out = {}
    for name, value in named.items():
        arr = np.ascontiguousarray(value)
        h = hashlib.blake2b(digest_size=8)
        h.update(f"{arr.dtype.str}{arr.shape}".encode())
        h.update(arr.tobytes())
        out[name] = h.hexdigest()
    return out


def checksum(digests: dict[str, str]) -> str:
    """One string for a rank's whole state (what run.json records per rank)."""
    return hashlib.sha256("".join(f"{k}={v};" for k, v in digests.items()).encode()).hexdigest()[:16]


def find_divergence(per_rank: list[dict[str, str]]) -> str | None:
    """``None`` if every rank has rank 0's digests, else which ranks differ and the first parameter that does."""
    reference = per_rank[0]
    differing = [r for r, d in enumerate(per_rank) if d != reference]
    if not differing:
        return None
    parts = []
    for r in differing:
        names = list(reference) + [n for n in per_rank[r] if n not in reference]
        first = next(n for n in names if reference.get(n) != per_rank[r].get(n))
        parts.append(f"rank {r} differs from rank 0, first in {first!r}")
    ranks = ", ".join(str(r) for r in differing)
    return f"ranks diverged (rank{'s' if len(differing) > 1 else ''} {ranks} vs rank 0): " + "; ".join(parts)


# -- launcher bookkeeping and fault injection ----------------------------------------------------------------
def write_rank_status(rank: int, **fields: Any) -> None:
    """Under the launcher, record this rank's pid (at start) and exit code (at exit) for its report."""
    directory = os.environ.get(STATUS_DIR_ENV)
    if not directory:
        return
    path = os.path.join(directory, f"rank_{rank}.json")
    data = {}
    if os.path.exists(path):
        with open(path) as fh:
            data = json.load(fh)
    data.update(fields)
    tmp = f"{path}.tmp"
    with open(tmp, "w") as fh:
        json.dump(data, fh)
    os.replace(tmp, path)


@dataclass(frozen=True)
class Fault:
    kind: str  # "kill" (SIGKILL itself) or "perturb" (nudge one weight)
    rank: int
    iteration: int


def injected_fault() -> Fault | None:
    """Test hook: ``MSRL_TRAIN_FAULT=kill:RANK:DONE`` makes that rank kill itself with SIGKILL once DONE iterations
    are done, as the next one starts (a real ``kill -9``, at a reproducible point); ``perturb:RANK:DONE`` nudges
    one weight on that rank there, as silent corruption would. Like ``MSRL_LITE_RUNNER_FAULT`` for the Lite runner."""
    spec = os.environ.get(FAULT_ENV)
    if not spec:
        return None
    kind, rank, iteration = spec.split(":")
    return Fault(kind, int(rank), int(iteration))
