"""Every bad input gets a one-line error, exit code 2, and leaves nothing half-written."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from inference.errors import UsageError
from msrl_consistency import train
from msrl_consistency.artifacts import run_dir as rd
from msrl_consistency.config import parse_config

TINY = ["--num-envs", "2", "--num-steps", "16", "--num-minibatches", "2", "--update-epochs", "1",
        "--eval-episodes", "0", "--progress", "false"]  # fmt: skip


def run_main(*argv: str) -> int:
    return train.main(list(argv))


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--env-id", "NoSuchEnv-v9"], "unknown environment id"),
        (["--env-id", "Blackjack-v1"], "unsupported observation space"),
        (
            ["--env-id", "CartPole-v1", "--num-envs", "3", "--num-steps", "5", "--num-minibatches", "4"],
            "does not divide",
        ),
        (["--hidden-sizes", "64,-1"], "hidden-sizes"),
        (["--device", "tpu"], "--device"),
        (["--eval-every", "2", "--eval-episodes", "0"], "needs --eval-episodes"),
    ],
)
def test_bad_arguments_fail_before_writing(tmp_path, argv, message):
    run_dir = tmp_path / "run"
    with pytest.raises(UsageError, match=message):
        run_main(*argv, "--run-dir", str(run_dir), *TINY[6:])
    assert not run_dir.exists()


def test_unavailable_device_is_a_clear_error(tmp_path):
    with pytest.raises(UsageError, match="not available"):
        run_main("--device", "ascend", "--run-dir", str(tmp_path / "run"))
    assert not (tmp_path / "run").exists()


def test_unwritable_run_dir(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    with pytest.raises(UsageError, match="cannot write to run dir"):
        run_main("--run-dir", str(blocker / "run"), *TINY)


def test_config_file_errors(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text("num_envs = [oops")
    with pytest.raises(UsageError, match="not valid TOML"):
        parse_config(["--config", str(bad)])
    unknown = tmp_path / "unknown.toml"
    unknown.write_text("learning_rat = 0.1\n")
    with pytest.raises(UsageError, match="unknown field"):
        parse_config(["--config", str(unknown)])
    good = tmp_path / "good.toml"
    good.write_text('env_id = "Pendulum-v1"\nnum_envs = 3\n')
    cfg = parse_config(["--config", str(good), "--num-steps", "7", "--num-minibatches", "1"])
    # preset < file < flags
    assert (cfg.env_id, cfg.num_envs, cfg.num_steps, cfg.gamma) == ("Pendulum-v1", 3, 7, 0.9)


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory) -> Path:
    run_dir = tmp_path_factory.mktemp("cli") / "run"
    assert run_main("--env-id", "CartPole-v1", "--total-steps", "64", "--run-dir", str(run_dir), *TINY) == 0
    return run_dir


def test_existing_run_is_not_overwritten(finished_run):
    before = (finished_run / rd.RUN_JSON).read_text()
    with pytest.raises(UsageError, match="already holds a run"):
        run_main("--run-dir", str(finished_run), *TINY)
    assert (finished_run / rd.RUN_JSON).read_text() == before


def test_resume_rejects_a_run_of_another_env(finished_run):
    with pytest.raises(UsageError, match="is a run of CartPole-v1, not Pendulum-v1"):
        run_main("--resume", str(finished_run), "--env-id", "Pendulum-v1")


@pytest.mark.parametrize("damage", ["truncate", "flip", "delete"])
def test_resume_rejects_corrupt_or_truncated_state(finished_run, tmp_path, damage):
    import shutil

    run_dir = tmp_path / "copy"
    shutil.copytree(finished_run, run_dir)
    state = run_dir / rd.RESUME_STATE
    blob = state.read_bytes()
    if damage == "truncate":
        state.write_bytes(blob[: len(blob) // 2])
    elif damage == "flip":
        state.write_bytes(blob[:-10] + bytes([blob[-10] ^ 0xFF]) + blob[-9:])
    else:
        state.unlink()
    with pytest.raises(UsageError, match="corrupt or truncated|no resume state"):
        run_main("--resume", str(run_dir))


def test_resume_extends_a_finished_run(finished_run, tmp_path):
    import shutil

    run_dir = tmp_path / "extend"
    shutil.copytree(finished_run, run_dir)
    assert run_main("--resume", str(run_dir), "--total-steps", "128", "--progress", "false") == 0
    assert rd.read_run_json(run_dir)["global_step"] == 128


def test_cli_prints_one_line_and_exits_2(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "msrl_consistency.train", "--env-id", "NoSuchEnv-v9", "--run-dir", str(tmp_path / "r")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == ["error: unknown environment id 'NoSuchEnv-v9'"]
    assert not (tmp_path / "r").exists()
