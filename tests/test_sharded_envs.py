"""Gymnasium envs stepped by several processes: the same stream as one process, state blobs, errors, auto choice."""

from __future__ import annotations

import os
import signal
import time

import numpy as np
import pytest

from msrl_consistency.envs.engines import gymnasium_env_workers, make_training_envs
from msrl_consistency.envs.make import make_vector_env
from msrl_consistency.envs.sharded import ShardedVectorEnv


def stream(envs, actions: np.ndarray, seed: int = 3) -> list[np.ndarray]:
    """Everything the Trainer reads from a vector env over ``actions``: obs, rewards, ends, final observations."""
    out = [envs.reset(seed=seed)[0]]
    for a in actions:
        obs, reward, terminated, truncated, infos = envs.step(a)
        out += [obs, reward, terminated, truncated]
        done = terminated | truncated
        assert ("final_obs" in infos) == bool(done.any())
        if done.any():
            out += [np.flatnonzero(infos["_final_obs"]), np.stack(infos["final_obs"][done])]
    return out


@pytest.mark.parametrize("workers", [2, 3])
def test_sharded_envs_give_one_process_stream_bitwise(workers):
    # 5 CartPoles under random actions: many episodes end (final observations, same-step resets) in 150 steps;
    # 5 envs over 2 or 3 processes are uneven shards.
    actions = np.random.default_rng(0).integers(0, 2, (150, 5))
    one = make_vector_env("CartPole-v1", 5)
    expected = stream(one, actions)
    one.close()
    sharded = ShardedVectorEnv("CartPole-v1", 5, workers)
    try:
        assert sharded.num_workers == workers and len(sharded.helpers_peak_rss_mb()) == workers - 1
        got = stream(sharded, actions)
    finally:
        sharded.close()
    assert sum(len(x) for x in expected[4::5]) > 0  # episodes did end
    assert len(got) == len(expected)
    for a, b in zip(got, expected, strict=True):
        np.testing.assert_array_equal(a, b)


def test_sharded_state_blobs_restore_every_shard():
    # Resume restores each env from its blob, whichever process steps it: the continuation equals the original's.
    actions = np.random.default_rng(1).integers(0, 2, (40, 4))
    a = ShardedVectorEnv("CartPole-v1", 4, 2)
    b = ShardedVectorEnv("CartPole-v1", 4, 2)
    try:
        stream(a, actions[:20])
        blobs = a.get_attr("state_blob")
        assert len(blobs) == 4 and all(blob is not None for blob in blobs)
        b.reset(seed=99)
        b.set_attr("state_blob", blobs)
        for act in actions[20:]:
            for x, y in zip(a.step(act)[:4], b.step(act)[:4], strict=True):
                np.testing.assert_array_equal(x, y)
    finally:
        a.close()
        b.close()


def test_helpers_leave_ctrl_c_to_the_trainer():
    # Ctrl-C signals the whole process group: the trainer finishes its iteration on it, so helpers must keep stepping.
    sharded = ShardedVectorEnv("CartPole-v1", 4, 2)
    try:
        sharded.reset(seed=0)
        os.kill(sharded._procs[0].pid, signal.SIGINT)
        time.sleep(0.2)
        assert sharded.step(np.zeros(4, np.int64))[0].shape == (4, 4)
    finally:
        sharded.close()


def test_a_failing_helper_is_an_error_naming_it():
    sharded = ShardedVectorEnv("CartPole-v1", 4, 2)
    helpers = list(sharded._procs)
    try:
        sharded.reset(seed=0)
        with pytest.raises(RuntimeError, match=r"env worker 1 of CartPole-v1 failed"):
            sharded.step(np.array([0, 1, 7, 7]))  # 7 is no CartPole action: only the helper's shard is invalid
    finally:
        sharded.close()
    assert helpers and all(not p.is_alive() for p in helpers)  # close() leaves no process behind


def test_auto_workers_only_for_costly_gymnasium_envs():
    assert gymnasium_env_workers("CartPole-v1", 16) == 1  # a step costs less than a pipe round trip
    assert gymnasium_env_workers("BipedalWalker-v3", 16) >= 1
    assert gymnasium_env_workers("BipedalWalker-v3", 1) == 1  # never more processes than envs
    assert gymnasium_env_workers("BipedalWalker-v3", 16, world_size=64) == 1  # ranks share the cores
    envs = make_training_envs("CartPole-v1", 4, "gymnasium", env_threads=2)
    try:
        assert isinstance(envs, ShardedVectorEnv) and envs.num_workers == 2
    finally:
        envs.close()
