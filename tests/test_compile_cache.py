"""The compile cache: keyed by everything that shapes the graphs, and a warm run trains bitwise like a cold one."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from msrl_consistency import compat
from msrl_consistency.artifacts import run_dir as rd
from msrl_consistency.config import TrainConfig
from msrl_consistency.training.compile_cache import (
    HOST_ONLY,
    STALE_WORK_SECONDS,
    CompileCache,
    count_graphs,
    file_hashes,
    fused_kernels,
    graph_key,
    prune,
)

SPEC = {"obs_dim": 4, "discrete": True}
TINY = ["--num-envs", "2", "--num-steps", "16", "--num-minibatches", "2", "--update-epochs", "2",
        "--updates-per-call", "2", "--eval-episodes", "1", "--progress", "false"]  # fmt: skip
TIMING = {"sps", "wall_time"}


def test_host_only_fields_exist_and_everything_else_is_in_the_key():
    fields = set(TrainConfig.__dataclass_fields__)
    assert HOST_ONLY.issubset(fields)  # a renamed field must not silently leave the key
    base = TrainConfig().to_dict()
    key = graph_key(base, SPEC, 1)
    assert set(key["config"]) == fields - HOST_ONLY
    assert graph_key({**base, "seed": 7, "total_steps": 10}, SPEC, 1) == key
    assert graph_key({**base, "clip_coef": 0.1}, SPEC, 1) != key  # folded into the graph: measured to matter
    assert graph_key(base, {**SPEC, "obs_dim": 5}, 1) != key
    assert graph_key(base, SPEC, 2) != key


def test_off_when_disabled_or_data_parallel_or_opened_before(tmp_path, monkeypatch):
    cfg = TrainConfig().to_dict()
    assert CompileCache.open({**cfg, "compile_cache": False}, SPEC, 1, tmp_path).state == "off"
    assert CompileCache.open(cfg, SPEC, 2, tmp_path).state == "off"
    with monkeypatch.context() as env:
        env.setenv("MS_COMPILER_CACHE_ENABLE", "1")  # the user runs MindSpore's own cache: we stay out of it
        assert "MS_COMPILER_CACHE_ENABLE" in CompileCache.open(cfg, SPEC, 1, tmp_path).reason
    first = CompileCache.open(cfg, SPEC, 1, tmp_path)  # "off" already if this test process trained before
    first.close()
    assert list(tmp_path.iterdir()) == []  # nothing compiled in between: nothing published, no working copy left
    second = CompileCache.open(cfg, SPEC, 1, tmp_path)
    assert second.describe() == {"state": "off", "reason": second.reason}
    assert (compat.compile_cache_blocker() or "cached another run's graphs") in second.reason  # xdist: "-c" is no file


def test_prune_keeps_the_most_recently_used_keys_and_live_working_copies(tmp_path):
    now = time.time()
    ages = {"old": 300, "newer": 200, "newest": 100, ".killed-run": STALE_WORK_SECONDS + 10, ".running": 10}
    for name, age in ages.items():
        (tmp_path / name).mkdir()
        os.utime(tmp_path / name, (now - age, now - age))
    prune(tmp_path, keep=2)
    assert sorted(p.name for p in tmp_path.iterdir()) == [".running", "newer", "newest"]


def cli(cache_dir: Path, *args: str) -> None:
    """The train CLI, run from the cache dir's parent (a test's own directory: nothing may land there)."""
    env = {**os.environ, "MSRL_COMPILE_CACHE_DIR": str(cache_dir)}
    proc = subprocess.run([sys.executable, "-m", "msrl_consistency.train", *args],
                          capture_output=True, text=True, timeout=600, env=env, cwd=cache_dir.parent)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]


def train(run_dir: Path, cache_dir: Path, *extra: str) -> dict:
    cli(cache_dir, "--run-dir", str(run_dir), *TINY, *extra)
    return rd.read_run_json(run_dir)


def metrics(run_dir: Path) -> list[dict[str, str]]:
    with open(run_dir / rd.METRICS_CSV, newline="") as fh:
        return [{k: v for k, v in row.items() if k not in TIMING} for row in csv.DictReader(fh)]


def weights(run_dir: Path) -> dict[str, np.ndarray]:
    import mindspore as ms

    return {k: v.asnumpy() for k, v in ms.load_checkpoint(str(run_dir / rd.CHECKPOINT)).items()}


# fused: act, train step, evaluation. split: act, prepare, gradients, clip + Adam, evaluation. Each compiled once.
# Pendulum with fusion: a warm run builds the kernels its loaded graphs name, and its loss once held a kernel renamed
# in every process; both are caught by the kernel-set checks below (CartPole with fusion adds nothing to them).
@pytest.mark.slow
@pytest.mark.parametrize(("env_id", "update_graphs", "graph_kernel", "graphs"),
                         [("CartPole-v1", "fused", "false", 3), ("CartPole-v1", "split", "false", 5),
                          ("Pendulum-v1", "fused", "true", 3)])  # fmt: skip
def test_a_warm_run_trains_bitwise_like_an_uncached_one(tmp_path, env_id, update_graphs, graph_kernel, graphs):
    cache_dir = tmp_path / "cache"
    flags = ("--env-id", env_id, "--update-graphs", update_graphs, "--graph-kernel", graph_kernel)
    cold = train(tmp_path / "cold", cache_dir, "--seed", "1", "--total-steps", "64", *flags)
    assert cold["compile_cache"]["state"] == "cold"
    published = cache_dir / cold["compile_cache"]["key"]
    assert json.loads((published / "key.json").read_text())["config"]["clip_coef"] == 0.2
    assert count_graphs(published) == graphs
    assert not [p for p in cache_dir.iterdir() if p.name.startswith(".")]  # no working copy left behind
    cold_kernels = fused_kernels(published)

    # Another seed and step budget: the same graphs, loaded rather than compiled.
    warm = train(tmp_path / "warm", cache_dir, "--seed", "2", "--total-steps", "96", *flags)
    assert warm["compile_cache"] == {**cold["compile_cache"], "state": "warm", "graphs_loaded": graphs}
    warm_kernels = fused_kernels(published)  # the loaded graphs' own kernel names, published for the next run
    assert (graph_kernel == "true") == (warm_kernels > cold_kernels)
    plain = train(tmp_path / "plain", cache_dir, "--seed", "2", "--total-steps", "96", "--compile-cache", "false",
                  *flags)  # fmt: skip
    assert plain["compile_cache"]["state"] == "off"
    assert metrics(tmp_path / "warm") == metrics(tmp_path / "plain")
    assert warm["eval"] == plain["eval"]
    warm_w, plain_w = weights(tmp_path / "warm"), weights(tmp_path / "plain")
    assert warm_w.keys() == plain_w.keys()
    for name, value in warm_w.items():
        np.testing.assert_array_equal(value, plain_w[name], err_msg=name)

    # Resuming the finished run only evaluates: its graphs still load in the order they were cached.
    cli(cache_dir, "--resume", str(tmp_path / "warm"))
    resumed = rd.read_run_json(tmp_path / "warm")
    assert resumed["compile_cache"]["state"] == "warm" and resumed["eval"] == plain["eval"]
    # Graph-kernel fusion keeps its kernels with the cached graphs (a third run needs no new one), and no file in
    # the working directory.
    assert (graph_kernel == "true") == bool(cold_kernels) and fused_kernels(published) == warm_kernels
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cache", "cold", "plain", "warm"]


@pytest.mark.slow
def test_a_cached_graph_changed_after_publishing_is_discarded_and_compiled(tmp_path):
    """Two float constants changed inside a cached .mindir used to give a "warm" run that trained differently."""
    cache_dir = tmp_path / "cache"
    flags = ("--env-id", "CartPole-v1", "--seed", "1", "--total-steps", "64")
    cold = train(tmp_path / "cold", cache_dir, *flags)
    published = cache_dir / cold["compile_cache"]["key"]
    recorded = json.loads((published / "key.json").read_text())["files"]
    graph = sorted(published.glob("rank_0/graph_cache/compile_cache_*.mindir"))[0]
    assert recorded[graph.relative_to(published).as_posix()]  # every published file is hashed
    data = bytearray(graph.read_bytes())
    data[len(data) // 2] ^= 0xFF
    graph.write_bytes(bytes(data))
    env = {**os.environ, "MSRL_COMPILE_CACHE_DIR": str(cache_dir)}
    proc = subprocess.run([sys.executable, "-m", "msrl_consistency.train", "--run-dir", str(tmp_path / "again"), *TINY,
                           *flags], capture_output=True, text=True, timeout=600, env=env, cwd=tmp_path)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    again = rd.read_run_json(tmp_path / "again")["compile_cache"]
    assert again["state"] == "cold" and f"{graph.name} changed since it was published" in again["reason"]
    warning = [line for line in proc.stderr.splitlines() if "compile cache" in line]
    assert len(warning) == 1 and warning[0].startswith("warning: compile cache: cache entry"), proc.stderr
    assert metrics(tmp_path / "again") == metrics(tmp_path / "cold")  # compiled afresh: the same training
    republished = json.loads((published / "key.json").read_text())["files"]
    assert republished == file_hashes(published) and republished.keys() == recorded.keys()  # recompiled, consistent


def test_a_cache_dir_other_users_can_write_is_not_used(tmp_path):
    root = tmp_path / "shared"
    root.mkdir()
    root.chmod(0o777)
    cache = CompileCache.open(TrainConfig().to_dict(), SPEC, 1, root)
    assert cache.state == "off" and "writable by other users" in cache.reason
