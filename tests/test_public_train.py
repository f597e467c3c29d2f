"""``msrl_consistency.train_policy(config)``: the CLI's training from Python, returning a ``RunResult``."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
import threading

import numpy as np
import pytest
from conftest import TINY_RUN

from inference.errors import UsageError
from msrl_consistency.artifacts import run_dir as rd
from msrl_consistency.config import TrainConfig


@pytest.mark.slow
def test_train_writes_the_run_and_returns_where_and_how_it_ended(tmp_path):
    import msrl_consistency.train  # noqa: F401 - the CLI module imported first: train_policy is still the function
    from msrl_consistency import RunResult
    from msrl_consistency import train_policy as train

    # No compile cache: MindSpore keeps a process's first cache path (see conftest.run_trainer).
    cfg = TrainConfig(env_id="CartPole-v1", seed=3, total_steps=128, run_dir=str(tmp_path / "run"),
                      **{**TINY_RUN, "eval_episodes": 2, "compile_cache": False})  # fmt: skip
    result = train(cfg)
    assert isinstance(result, RunResult)
    info = rd.read_run_json(tmp_path / "run")
    assert result.run_dir == tmp_path / "run" and result.checkpoint == tmp_path / "run" / rd.CHECKPOINT
    assert result.checkpoint.is_file() and (tmp_path / "run" / rd.REWARD_PLOT).is_file()  # what the CLI writes
    assert (result.iteration, result.global_step) == (2, 128) == (info["iteration"], info["global_step"])
    assert result.episodes == info["episodes"] and result.env_backend == info["env_backend"]["name"] == "envpool"
    assert len(result.eval_returns) == 2 and result.eval_return == pytest.approx(info["eval"]["mean"])
    assert result.eval_returns == info["eval"]["returns"] and result.stopped_at_return is None
    assert result.resume_exact and result.world_size == 1 and result.rank_checksums == info["rank_checksums"]
    assert result.policy_spec.to_dict() == info["policy_spec"]
    assert cfg.env_backend == "auto"  # the caller's config is not modified (run.json records the resolved engine)

    # The same config again trains bitwise the same; resuming the finished run changes nothing but the evaluation.
    again = train(dataclasses.replace(cfg, run_dir=str(tmp_path / "again")))
    assert again.rank_checksums == result.rank_checksums and again.eval_returns == result.eval_returns
    resumed = train(dataclasses.replace(cfg, resume=str(tmp_path / "run")))
    assert (resumed.global_step, resumed.rank_checksums) == (128, result.rank_checksums)
    np.testing.assert_array_equal(resumed.eval_returns, result.eval_returns)


def test_train_refuses_bad_input_before_writing_anything(tmp_path):
    from msrl_consistency import train_policy as train

    with pytest.raises(UsageError, match="train_policy\\(config\\) needs config.run_dir"):
        train(TrainConfig())
    with pytest.raises(UsageError, match="--num-envs must be positive"):
        train(TrainConfig(num_envs=0, run_dir=str(tmp_path / "bad")))
    with pytest.raises(UsageError, match="runs from the CLI: python -m msrl_consistency.train --workers 2"):
        train(TrainConfig(workers=2, run_dir=str(tmp_path / "dp")))
    assert list(tmp_path.iterdir()) == []


def test_a_second_concurrent_run_from_another_thread_is_refused_with_one_line(tmp_path):
    """MindSpore trains one run at a time per process (a concurrent second one died inside its runtime): the second
    call gets a ``UsageError`` naming the running thread and writes nothing; the first run ends normally, and
    training works again once it has."""
    from msrl_consistency import train_policy as train

    cfg = TrainConfig(env_id="CartPole-v1", seed=2, total_steps=128, **{**TINY_RUN, "compile_cache": False})
    started, checked, outcome = threading.Event(), threading.Event(), {}

    def hold(trainer) -> None:  # the first iteration waits until the second call was tried
        started.set()
        checked.wait(timeout=120)

    def first() -> None:
        try:
            outcome["result"] = train(dataclasses.replace(cfg, run_dir=str(tmp_path / "first")), on_iteration=hold)
        except BaseException as exc:  # noqa: BLE001 - reported by the assertion below
            outcome["error"] = exc

    thread = threading.Thread(target=first, name="first-run")
    thread.start()
    try:
        assert started.wait(timeout=300), outcome
        with pytest.raises(UsageError, match="already running in this process \\(thread 'first-run'\\)"):
            train(dataclasses.replace(cfg, run_dir=str(tmp_path / "second")))
    finally:
        checked.set()
        thread.join(timeout=300)
    assert "error" not in outcome and outcome["result"].global_step == 128
    assert not (tmp_path / "second").exists()
    again = train(dataclasses.replace(cfg, run_dir=str(tmp_path / "after")))  # the guard was released
    assert again.rank_checksums == outcome["result"].rank_checksums


@pytest.mark.parametrize("first", ["import msrl_consistency.train", "from msrl_consistency import train_policy"])
def test_train_policy_is_a_function_and_train_the_command_whatever_was_imported_first(first):
    code = (
        f"{first}\n"
        "import sys, types\n"
        "import msrl_consistency, msrl_consistency.train as cli\n"
        "from msrl_consistency import train_policy, RunResult\n"
        "assert isinstance(train_policy, types.FunctionType) and train_policy.__name__ == 'train_policy'\n"
        "assert type(cli) is types.ModuleType and callable(cli.main)\n"
        "assert 'mindspore' not in sys.modules, 'importing train_policy must stay light'\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]


def test_the_cli_module_still_runs_as_a_command():
    proc = subprocess.run([sys.executable, "-m", "msrl_consistency.train", "--help"], capture_output=True, text=True,
                          timeout=120)  # fmt: skip
    assert proc.returncode == 0 and proc.stdout.startswith("usage: python -m msrl_consistency.train"), proc.stderr
