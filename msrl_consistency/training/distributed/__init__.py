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
import time
from typing import Any

import numpy as np

from inference.errors import INTERRUPTS, MsrlError, first_line
from msrl_consistency import compat
from msrl_consistency.agent.preprocess import RunningMeanStd, batch_moments, merge_moments
from msrl_consistency.config import TrainConfig
from msrl_consistency.training.ppo import STEP_METRICS
from msrl_consistency.training.profile import Profile

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


# -- the per-iteration exchange ----------------------------------------------------------------------------------
def exchange(
    comm: Comm, cfg: TrainConfig, obs_dim: int, buf: dict[str, np.ndarray], stats: dict[str, float], profile: Profile
) -> dict[str, Any]:
    """The one per-iteration exchange: every rank gets every rank's statistics, episodes and metrics.

    Merged in rank order with the same arithmetic on every rank; for one process it is the identity (same floats
    as before data parallel existed).
    """
    t0 = time.perf_counter()
    moments = batch_moments(buf["obs"], obs_dim) if cfg.normalize_obs else None
    ret_moments = batch_moments(buf["returns_seen"], 1) if cfg.normalize_reward else None
    profile.add("normaliser statistics", time.perf_counter() - t0)
    report = {
        "moments": moments,
        "ret_moments": ret_moments,
        "finished": buf["finished"],
        "stats": stats,
        "values": buf["values"].ravel(),
        "returns": buf["returns"].ravel(),
        "stop": INTERRUPTS.requested,  # Ctrl-C on any rank stops every rank after this same iteration
    }
    with profile.section("rank exchange"):
        reports = comm.gather(report)
    finished = np.concatenate(
        [np.column_stack([r["finished"], np.full(len(r["finished"]), rank)]) for rank, r in enumerate(reports)]
    )
    finished = finished[np.lexsort((finished[:, 1], finished[:, 4], finished[:, 0]))]  # by step, rank, env
    t0 = time.perf_counter()
    moments = merge_moments([r["moments"] for r in reports]) if cfg.normalize_obs else None
    ret_moments = merge_moments([r["ret_moments"] for r in reports]) if cfg.normalize_reward else None
    profile.add("normaliser statistics", time.perf_counter() - t0, 0)
    return {
        "moments": moments,
        "ret_moments": ret_moments,
        "finished": finished,  # step, env, return, length, rank
        "stats": {k: sum(r["stats"][k] for r in reports) / len(reports) for k in STEP_METRICS},
        "values": np.concatenate([r["values"] for r in reports]),
        "returns": np.concatenate([r["returns"] for r in reports]),
        "stop": any(r["stop"] for r in reports),
    }


# -- consistency check --------------------------------------------------------------------------------------
def named_state(parameters: list[Any], rms: RunningMeanStd, ret_rms: RunningMeanStd) -> dict[str, np.ndarray]:
    """What every rank must hold bit for bit: all train-step Parameters and the host statistics."""
    state = {p.name: p.asnumpy() for p in parameters}
    state["host.obs_mean"], state["host.obs_var"] = rms.mean, rms.var
    state["host.obs_count"] = np.float64(rms.count)
    state["host.return_mean"], state["host.return_var"] = ret_rms.mean, ret_rms.var
    state["host.return_count"] = np.float64(ret_rms.count)
    return state


def check_consistency(comm: Comm, named: dict[str, np.ndarray], iteration: int) -> list[str]:
    """Every rank's state checksum (``named``: this rank's ``named_state``); stop the run on any difference,
    naming ranks and parameter."""
    per_rank = comm.gather(state_digests(named))
    problem = find_divergence(per_rank)
    if problem:
        raise RankDivergence(f"at iteration {iteration}: {problem}")
    return [checksum(d) for d in per_rank]


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


# -- launcher bookkeeping ---------------------------------------------------------------------------------------
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
