"""Every bad input gets a one-line error, exit code 2, and leaves nothing half-written."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

import msrl_consistency.train as train
from inference.errors import UsageError
from msrl_consistency.artifacts import run_dir as rd
from msrl_consistency.config import available_presets, parse_config
from msrl_consistency.envs.engines import resolve_backend

TINY = ["--num-envs", "2", "--num-steps", "16", "--num-minibatches", "2", "--update-epochs", "1",
        "--eval-episodes", "0", "--progress", "false"]  # fmt: skip


def run_main(*argv: str) -> int:
    return train.main(list(argv))


def test_boolean_fields_are_switches_as_users_type_them():
    cfg = parse_config(["--profile", "--no-progress", "--compile-cache", "false", "--seed", "2"])
    assert (cfg.profile, cfg.progress, cfg.compile_cache, cfg.seed) == (True, False, False, 2)
    assert parse_config(["--profile", "true", "--no-profile"]).profile is False  # the last one given wins
    with pytest.raises(SystemExit):
        parse_config(["--profile", "maybe"])


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
        (["--seed", "-1"], "--seed must be in"),
        (["--learning-rate", "-1"], "--learning-rate must be in"),
        (["--learning-rate", "nan"], "--learning-rate must be a finite number"),
        (["--threads", "0"], "--threads must be in"),
        (["--gamma", "2"], "--gamma must be in"),
        (["--env-backend", "ray"], "--env-backend must be auto, envpool or gymnasium"),
        (["--env-id", "msrl/Chain-v0", "--env-backend", "envpool"], "EnvPool has no msrl/Chain-v0"),
        (["--env-backend", "envpool", "--async-envs", "true"], "cannot be used with --env-backend envpool"),
        (["--env-threads", "-1"], "--env-threads must be in"),
        (["--num-minibatches", "4", "--updates-per-call", "3"], "--updates-per-call must be 0"),
    ],
)
def test_bad_arguments_fail_before_writing(tmp_path, argv, message):
    run_dir = tmp_path / "run"
    with pytest.raises(UsageError, match=message):
        run_main(*argv, "--run-dir", str(run_dir), *TINY[6:])
    assert not run_dir.exists()


def test_unavailable_device_is_a_clear_error(tmp_path, monkeypatch):
    import mindspore as ms

    monkeypatch.setattr(ms.hal, "is_available", lambda target: target == "CPU")  # whatever this machine has
    with pytest.raises(UsageError, match="not available"):
        run_main("--device", "ascend", "--run-dir", str(tmp_path / "run"))
    assert not (tmp_path / "run").exists()


def test_config_pointing_at_a_directory(tmp_path):
    with pytest.raises(UsageError, match="is a directory"):
        run_main("--config", str(tmp_path), "--run-dir", str(tmp_path / "run"))
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
    cfg = parse_config(["--config", str(good), "--num-steps", "8", "--num-minibatches", "2"])
    # preset < file < flags
    assert (cfg.env_id, cfg.num_envs, cfg.num_steps, cfg.gamma) == ("Pendulum-v1", 3, 8, 0.95)


@pytest.mark.parametrize("env_id", available_presets())
def test_every_preset_is_a_valid_config_on_a_verified_engine(env_id):
    cfg = parse_config(["--env-id", env_id])
    assert cfg.env_id == env_id and cfg.num_iterations >= 1  # parse_config validated every field
    # auto: EnvPool where its port was verified against gymnasium; Pendulum's EnvPool port differs
    expected = "gymnasium" if env_id == "Pendulum-v1" else "envpool"
    assert resolve_backend(env_id, cfg.env_backend).name == expected


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory) -> Path:
    run_dir = tmp_path_factory.mktemp("cli") / "run"
    assert run_main("--env-id", "CartPole-v1", "--total-steps", "64", "--run-dir", str(run_dir), *TINY) == 0
    return run_dir


@pytest.mark.slow
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


@pytest.mark.slow
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


def start_training(run_dir: Path, *extra: str) -> subprocess.Popen[str]:
    args = [sys.executable, "-m", "msrl_consistency.train", "--env-id", "CartPole-v1", "--run-dir", str(run_dir),
            *TINY, *extra]  # fmt: skip
    return subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def iterations_logged(run_dir: Path) -> int:
    metrics = run_dir / rd.METRICS_CSV
    return max(0, len(metrics.read_text().splitlines()) - 1) if metrics.exists() else 0


def wait_until(condition, proc: subprocess.Popen[str], timeout: float = 120.0) -> None:
    import time

    deadline = time.monotonic() + timeout
    while not condition():
        assert proc.poll() is None, proc.communicate()[1][-2000:]
        assert time.monotonic() < deadline
        time.sleep(0.05)


@pytest.mark.slow
def test_a_run_dir_in_use_is_refused_with_the_holders_pid(tmp_path):
    run_dir = tmp_path / "run"
    first = start_training(run_dir, "--total-steps", "1000000", "--checkpoint-every", "1")
    try:
        wait_until(lambda: iterations_logged(run_dir) >= 1, first)
        second = subprocess.run([sys.executable, "-m", "msrl_consistency.train", "--run-dir", str(run_dir), *TINY],
                                capture_output=True, text=True, timeout=300)  # fmt: skip
        assert second.returncode == 2 and f"in use by another training (pid {first.pid})" in second.stderr
        resumed = subprocess.run([sys.executable, "-m", "msrl_consistency.train", "--resume", str(run_dir)],
                                 capture_output=True, text=True, timeout=300)  # fmt: skip
        assert resumed.returncode == 2 and f"pid {first.pid}" in resumed.stderr
    finally:
        first.kill()
        first.wait()
    assert rd.read_run_json(run_dir)["env_id"] == "CartPole-v1"  # the first run's files, untouched


@pytest.mark.slow
def test_ctrl_c_finishes_the_iteration_checkpoints_and_says_how_to_resume(tmp_path):
    import signal

    run_dir = tmp_path / "run"
    proc = start_training(run_dir, "--total-steps", "1000000", "--checkpoint-every", "1000", "--profile", "true")
    wait_until(lambda: iterations_logged(run_dir) >= 2, proc)
    proc.send_signal(signal.SIGINT)
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 130, stderr[-2000:]
    assert f"interrupted; resume with: --resume {run_dir}" in stderr and "Traceback" not in stderr
    saved = rd.read_run_json(run_dir)
    assert saved["iteration"] == iterations_logged(run_dir) >= 2  # the iterations done are in the checkpoint
    profile = json.loads((run_dir / "profile.json").read_text())  # an interrupted run still reports its profile
    assert "profile:" in stdout and profile["iterations"] == saved["iteration"]
    resumed = subprocess.run([sys.executable, "-m", "msrl_consistency.train", "--resume", str(run_dir),
                              "--total-steps", str(saved["global_step"] + 32)], capture_output=True, text=True,
                             timeout=300)  # fmt: skip
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert "Warning" not in resumed.stderr, resumed.stderr[-2000:]  # e.g. gymnasium on EnvPool's space casts
    assert rd.read_run_json(run_dir)["iteration"] == saved["iteration"] + 1


@pytest.mark.slow
def test_second_ctrl_c_exits_at_once(tmp_path):
    import signal

    run_dir = tmp_path / "run"
    # Long iterations (~1 s), so the second signal lands while the first waits for the iteration to end.
    proc = start_training(run_dir, "--total-steps", "1000000", "--checkpoint-every", "1000", "--num-steps", "1024",
                          "--update-epochs", "8")  # fmt: skip
    wait_until(lambda: iterations_logged(run_dir) >= 1, proc)
    proc.send_signal(signal.SIGINT)
    seen = [proc.stderr.readline()]
    while not seen[-1].startswith("stopping: ") and seen[-1]:  # the first signal acknowledged: send the second
        seen.append(proc.stderr.readline())
    proc.send_signal(signal.SIGINT)
    _, stderr = proc.communicate(timeout=60)
    stderr = "".join(seen) + stderr
    assert proc.returncode == 130 and "interrupted again: exiting now" in stderr, stderr[-2000:]
    assert rd.read_run_json(run_dir)["iteration"] == 0  # nothing half-written: the last complete checkpoint


@pytest.mark.slow
@pytest.mark.parametrize(("flag", "value"), [("--hidden-sizes", "32"), ("--run-dir", "elsewhere"),
                                             ("--learning-rate", "0.1")])  # fmt: skip
def test_resume_refuses_flags_that_cannot_change(finished_run, tmp_path, flag, value):
    import shutil

    run_dir = tmp_path / "run"
    shutil.copytree(finished_run, run_dir)
    before = {p.name: p.read_bytes() for p in run_dir.iterdir() if p.is_file()}
    with pytest.raises(UsageError, match=f"{flag} cannot change on --resume"):
        run_main("--resume", str(run_dir), flag, value)
    assert {p.name: p.read_bytes() for p in run_dir.iterdir() if p.is_file()} == before  # refused before writing


@pytest.mark.slow
def test_a_resumed_run_may_be_given_a_return_to_stop_at(tmp_path):
    # A run given up on (its step budget spent) goes on with a target: it stops at the first evaluation reaching it.
    run_dir = tmp_path / "run"
    evals = ["--eval-every", "1", "--eval-episodes", "1"]
    assert run_main("--env-id", "CartPole-v1", "--run-dir", str(run_dir), "--total-steps", "64", *TINY, *evals) == 0
    assert rd.read_run_json(run_dir).get("stopped_at_return") is None
    assert run_main("--resume", str(run_dir), "--total-steps", "256", "--stop-at-return", "5") == 0
    info = rd.read_run_json(run_dir)
    assert info["config"]["stop_at_return"] == "5"
    assert (info["iteration"], info["stopped_at_return"]["global_step"]) == (3, 96)  # 2 iterations of 32, then one


@pytest.mark.slow
def test_a_full_disk_is_a_one_line_error_and_leaves_no_temp_file(tmp_path):
    """Files may not grow past 20 kB (RLIMIT_FSIZE: writes fail like on a full disk): the checkpoint cannot be
    written, the run stops with exit 2 and one line, and no half-written file is left."""
    code = (
        "import resource, signal, sys\n"
        "signal.signal(signal.SIGXFSZ, signal.SIG_IGN)\n"
        "resource.setrlimit(resource.RLIMIT_FSIZE, (20000, 20000))\n"
        "from inference.errors import run_cli\n"
        "from msrl_consistency.train import main\n"
        "run_cli(main)\n"
    )
    run_dir = tmp_path / "run"
    proc = subprocess.run([sys.executable, "-c", code, "--run-dir", str(run_dir), "--total-steps", "64", *TINY],
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert proc.returncode == 2 and len(errors) == 1 and "File too large" in errors[0], proc.stderr[-2000:]
    assert not [p.name for p in run_dir.iterdir() if p.name.endswith(".tmp")]


@pytest.mark.slow
def test_profile_reports_where_the_time_went(tmp_path, capsys):
    run_dir = tmp_path / "run"
    assert run_main("--env-id", "CartPole-v1", "--total-steps", "128", "--run-dir", str(run_dir), "--profile", "true",
                    "--eval-episodes", "1", *TINY[:8]) == 0  # fmt: skip
    out = capsys.readouterr().out
    assert "profile:" in out and "env stepping" in out and "overlap:" in out
    report = json.loads((run_dir / "profile.json").read_text())
    sections = report["sections"]
    assert report["env_steps"] == 128 and report["env_backend"]["name"] == "envpool"
    assert sections["env stepping"]["calls"] == 64 and sections["acting"]["calls"] >= 64
    assert sections["compile"]["calls"] == 3  # act, train step, evaluation policy, at the start
    assert sections["update"]["calls"] == 4 and sections["evaluation"]["calls"] == 1
    assert sections["checkpoints"]["calls"] >= 2
    total = sum(row["seconds"] for name, row in sections.items() if name != "other")
    assert 0 < total <= report["wall_seconds"] and sections["other"]["seconds"] >= 0
    assert report["peak_rss_mb"] > 100
    marks = report["rss_mb"]  # RSS when the imports, the setup and the graphs were done, none above the peak
    assert list(marks) == ["after imports", "after setup", "after compile"]
    assert all(100 < mb <= report["peak_rss_mb"] + 1 for mb in marks.values())
    private = report["private_rss_mb"]  # the same marks without file-backed pages (mostly MindSpore's libraries)
    assert list(private) == list(marks) and all(50 < private[k] < marks[k] for k in marks)
    assert f"after compile {marks['after compile']:.0f} of which private {private['after compile']:.0f}" in out
