"""bench/train_throughput.py's tables: a seed's rounds are compared by their median, a run that never reached the
target counts as infinitely late, and the last table names who reached it first on each seed."""

from __future__ import annotations

from typing import Any

import pytest
from bench_script import load


@pytest.fixture
def bench():
    return load("train_throughput")  # the driver module imports no MindSpore and no PyTorch


def run(framework: str, seed: int, round_: int | None, wall: float | None, steps: int | None) -> dict[str, Any]:
    r = {"framework": framework, "env_id": "CartPole-v1", "seed": seed, "wall_time": 10.0, "cpu_time": 10.0,
         "global_step": 50_000, "total_time": 12.0, "sps_steady": 5000.0, "steps_to_threshold": steps,
         "steps_to_eval_threshold": None, "wall_to_target": wall, "eval_mean": 500.0, "peak_rss_mb": 400.0}  # fmt: skip
    if round_ is not None:
        r["round"] = round_
    return r


def test_rounds_are_compared_by_their_median_and_the_first_framework_is_named(bench):
    results = [
        # seed 1: ours had one slow round (a slow phase of the host); its median still beats the twin's.
        run("ours", 1, 1, 8.0, 24_000), run("torch", 1, 1, 8.5, 23_000),
        run("torch", 1, 2, 8.4, 23_000), run("ours", 1, 2, 30.0, 24_000),
        run("ours", 1, 3, 8.2, 24_000), run("torch", 1, 3, 8.6, 23_000),
        # seed 2: the twin never gets there; ours does.
        run("ours", 2, 1, 5.0, 12_000), run("torch", 2, 1, None, None),
        run("torch", 2, 2, None, None), run("ours", 2, 2, 6.0, 12_000),
        run("ours", 2, 3, 4.0, 12_000), run("torch", 2, 3, None, None),
    ]  # fmt: skip
    table = bench.tables(results).splitlines()
    assert "| CartPole-v1 | 1 | 8.2 (8.0-30.0, 3/3) | 8.5 (8.4-8.6, 3/3) | ours |" in table
    assert "| CartPole-v1 | 2 | 5.0 (4.0-6.0, 3/3) | – | ours |" in table
    rows = ("| ours | CartPole-v1 | 2 |", "| torch | CartPole-v1 | 2 |")
    summary = {line.split(" | ")[0]: line for line in table if line.startswith(rows)}
    # seeds, runs, ..., reached (seeds, not runs), median steps, ..., median wall per seed
    assert "| ours | CartPole-v1 | 2 | 6 |" in summary["| ours"] and "| 2/2 | 18,000 |" in summary["| ours"]
    assert "| 8.2, 5.0 |" in summary["| ours"]
    assert "| 1/2 | 23,000 |" in summary["| torch"] and "| 8.5, – |" in summary["| torch"]
    # Every run keeps its own row, with its round.
    assert sum(line.startswith("| ours | CartPole-v1 | 1 | 2 | ") for line in table) == 1


def test_a_target_reached_in_fewer_than_half_the_rounds_is_not_a_median(bench):
    assert bench.median_or_none([5.0, None, None]) is None
    assert bench.median_or_none([5.0, 7.0, None]) == 7.0
    assert bench.median_or_none([]) is None
    results = [
        run("ours", 1, 1, 9.0, 20_000),
        run("ours", 1, 2, None, None),
        run("ours", 1, 3, None, None),
        run("torch", 1, 1, 20.0, 30_000),
        run("torch", 1, 2, 21.0, 30_000),
        run("torch", 1, 3, 22.0, 30_000),
    ]
    assert "| CartPole-v1 | 1 | – (9.0-9.0, 1/3) | 21.0 (20.0-22.0, 3/3) | torch |" in bench.tables(results)


def test_results_of_single_round_runs_tabulate_as_before(bench):
    results = [run("ours", 1, None, 8.9, 24_144), run("torch", 1, None, 8.4, 23_888), run("sb3", 1, None, None, None)]
    table = bench.tables(results)
    assert "| CartPole-v1 | 1 | 8.9 | 8.4 | – | torch |" in table
    assert "| ours | CartPole-v1 | 1 | 1 | 20.0 |" in table  # round 1 where the json predates rounds
    assert "| sb3 | CartPole-v1 | 1 | 1 | 5,000 | 1.00x | 1.00x | 0/1 | – |" in table


def test_the_written_table_names_the_hosts_it_was_measured_on(bench, tmp_path):
    results = [run("ours", 1, 1, 8.0, 24_000), run("torch", 1, 1, 8.5, 23_000), run("ours", 2, 1, 5.0, 12_000)]
    hosts = ["Intel A, AVX-512, 2 CPUs", "Intel A, AVX-512, 2 CPUs", "AMD B, AVX2+FMA, 2 CPUs"]
    for r, host in zip(results, hosts, strict=True):
        r.update(host=host, episodes=[(1000, 100.0), (2000, 480.0)])
    bench.write_outputs(results, tmp_path)
    md = (tmp_path / "train_throughput.md").read_text()
    assert md.startswith("Hosts: AMD B, AVX2+FMA, 2 CPUs; Intel A, AVX-512, 2 CPUs.\n")
    del results[2]["host"]  # a json written before hosts were recorded
    bench.write_outputs(results[2:], tmp_path)
    assert (tmp_path / "train_throughput.md").read_text().startswith("Host: not recorded.\n")
    assert bench.cpu_summary().endswith(" CPUs")


def test_a_run_stopped_by_the_race_is_shown_as_not_there_by_the_leaders_time(bench):
    raced = run("sb3", 1, 1, None, None)
    raced.update(gave_up_after_s=8.0, wall_time=8.3)  # stopped at the first check past ours' 8.0 s
    unraced = run("torch", 1, 1, None, None)  # never reached it in its whole run: no race cell
    table = bench.tables([run("ours", 1, 1, 8.0, 24_000), unraced, raced])
    assert "| CartPole-v1 | 1 | 8.0 | – | > 8.3 (raced) | ours |" in table
    assert "| – (raced: none in 8.3) |" in next(line for line in table.splitlines() if line.startswith("| sb3 |"))
