"""bench/preset_seeds.py's table: a stored run is judged against its env's target, or against another evaluation
bar (``--threshold``) from the evaluations it keeps, without training again."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from bench_script import load


@pytest.fixture
def ps():
    return load("preset_seeds")  # imports no MindSpore: the runs are CLI subprocesses


def stored_run(seed: int, evals: list[tuple[int, float]] | None) -> dict[str, Any]:
    r = {"env_id": "BipedalWalker-v3", "name": "preset", "overrides": [], "seed": seed, "global_step": 3_000_000,
         "steps_to_threshold": None, "steps_to_eval_threshold": next((s for s, m in evals or [] if m >= 300), None),
         "final_eval": 280.0, "sps": 3000.0, "progress": [(400_000, 130.0), (2_000_000, 700.0)]}  # fmt: skip
    if evals is not None:
        r["evals"] = evals
    return r


def test_another_bar_is_read_from_the_stored_evaluations(ps, tmp_path, capsys):
    runs = [stored_run(1, [(81_920, 120.0), (327_680, 210.0), (1_802_240, 305.0)]),
            stored_run(2, [(81_920, 150.0), (163_840, 199.9), (245_760, 250.0)])]  # fmt: skip
    target = ps.table(runs).splitlines()[-1]
    assert "| 1/2 | – | – | 1802.2, – |" in target  # 300: seed 2 never gets there, so no median
    bar = ps.table(runs, 200.0).splitlines()[-1]
    assert "| 2/2 | 286,720 | 327,680 | 327.7, 245.8 |" in bar  # 200: the first evaluation at or above it
    (tmp_path / "results.json").write_text(json.dumps({"results": runs}))
    assert ps.main(["--out", str(tmp_path), "--tabulate", "--threshold", "200"]) == 0
    printed = capsys.readouterr().out
    assert printed.startswith("Target: the first evaluation >= 200.") and "| 2/2 | 286,720 |" in printed


def test_a_bar_needs_stored_evaluations(ps, tmp_path):
    with pytest.raises(SystemExit, match="seed 3 has none"):
        ps.table([stored_run(3, None)], 200.0)
    with pytest.raises(SystemExit, match="no stored runs"):
        ps.main(["--out", str(tmp_path), "--tabulate"])


def write_logs(run_dir: Path, step: int, evals: list[tuple[int, float]]) -> None:
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "metrics.csv").write_text(f"iteration,global_step,sps,wall_time\n1,{step},3000.0,1.0\n")
    (run_dir / "evals.csv").write_text("iteration,global_step,return_mean\n"
                                       + "".join(f"1,{s},{m}\n" for s, m in evals))  # fmt: skip


def test_a_screen_stops_a_run_at_its_target_or_gives_up_on_it(ps, tmp_path):
    run_dir = tmp_path / "run"
    assert ps.stop_reason("BipedalWalker-v3", run_dir, True, 1_400_000) is None  # nothing logged yet
    write_logs(run_dir, 901_120, [(819_200, 296.0), (901_120, 299.9)])
    assert ps.stop_reason("BipedalWalker-v3", run_dir, True, 1_400_000) is None
    write_logs(run_dir, 983_040, [(901_120, 299.9), (983_040, 300.0)])
    assert ps.stop_reason("BipedalWalker-v3", run_dir, True, 1_400_000) == "target"
    assert ps.stop_reason("BipedalWalker-v3", run_dir, False, 1_400_000) is None  # only giving up was asked for
    write_logs(run_dir, 1_400_832, [(1_392_640, 297.0)])
    assert ps.stop_reason("BipedalWalker-v3", run_dir, True, 1_400_000) == "gave up"
    assert ps.stop_reason("CartPole-v1", run_dir, True, 1_400_000) is None  # a training-mean target needs the end


def test_a_stopped_run_shows_where_it_was_given_up(ps, tmp_path):
    given_up = {**stored_run(2, [(1_392_640, 297.0)]), "global_step": 1_400_832, "stopped": "gave up",
                "final_eval": None}  # fmt: skip
    reached = {**stored_run(3, [(983_040, 301.0)]), "stopped": "target", "final_eval": None}
    row = ps.table([given_up, reached]).splitlines()[-1]
    assert "| 1/2 | – | – | –@1.40M, 983.0 | – (stopped) |" in row
