"""Every seed a run uses, all derived from ``--seed`` and recorded in run.json.

Rank r's env i resets with ``seed + r * num_envs + i``, weights come from ``seed`` (identical on every rank),
sampling noise and minibatch shuffles come from NumPy generators seeded from ``[seed, stream]`` (rank 0, and a
single process) or ``[seed, stream, rank]``, evaluation episode k resets with ``seed + 10000 + k``. Together with
``resume.state`` this makes a resumed run bitwise-equal to an uninterrupted one.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from msrl_consistency.config import TrainConfig

NOISE_STREAM, SHUFFLE_STREAM, RESUME_RESET_STREAM = 1, 2, 3
EVAL_SEED_OFFSET = 10_000  # evaluation episodes never share a start with training envs


def stream_entropy(seed: int, stream: int, rank: int = 0) -> list[int]:
    """Seed material of one NumPy stream; rank 0's is the single-process one, so one worker changes nothing."""
    return [seed, stream] if rank == 0 else [seed, stream, rank]


def seed_streams(seed: int, rank: int = 0) -> tuple[np.random.Generator, np.random.Generator]:
    """Independent generators for sampling noise and minibatch shuffling, both derived from ``seed`` (and rank)."""
    return (
        np.random.default_rng(stream_entropy(seed, NOISE_STREAM, rank)),
        np.random.default_rng(stream_entropy(seed, SHUFFLE_STREAM, rank)),
    )


def env_seed(cfg: TrainConfig, rank: int) -> int:
    """The reset seed of a rank's first env (env i resets with this + i): no two ranks share an env seed."""
    return cfg.seed + rank * cfg.num_envs


def resume_reset_seed(first_env_seed: int, iteration: int) -> int:
    """Where envs that cannot be snapshotted restart on resume: away from every seed the run used before."""
    return first_env_seed + RESUME_RESET_STREAM * 1_000_003 + iteration


def eval_seed(seed: int, episode: int) -> int:
    return seed + EVAL_SEED_OFFSET + episode


def seed_plan(cfg: TrainConfig, world_size: int) -> dict[str, Any]:
    """Every seed a run uses, per rank (recorded in run.json)."""
    n, s = cfg.num_envs, cfg.seed
    plan: dict[str, Any] = {
        "seed": s,
        "env_reset": f"seed + rank * num_envs + env_index ({s}..{s + world_size * n - 1})",
        "weights": s,
        "noise": stream_entropy(s, NOISE_STREAM),
        "shuffle": stream_entropy(s, SHUFFLE_STREAM),
        "eval": f"seed + {EVAL_SEED_OFFSET} + k ({eval_seed(s, 0)}..)",
    }
    if world_size > 1:
        plan["ranks"] = [
            {"rank": r, "env_reset": [s + r * n, s + r * n + n - 1], "noise": stream_entropy(s, NOISE_STREAM, r),
             "shuffle": stream_entropy(s, SHUFFLE_STREAM, r)}
            for r in range(world_size)
        ]  # fmt: skip
    return plan
