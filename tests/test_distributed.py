"""Data-parallel pieces that need no cluster: statistics merging, the consistency check, the launcher's command,
environment and fault report, device per rank, and old resume states."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import msrl_consistency.train as train
from inference.errors import UsageError
from msrl_consistency.agent.preprocess import RunningMeanStd, batch_moments, merge_moments
from msrl_consistency.artifacts import run_dir as rd
from msrl_consistency.config import TrainConfig, build_parser, parse_config
from msrl_consistency.training import distributed as dist
from msrl_consistency.training.distributed import launch
from msrl_consistency.training.loop import Trainer


def test_merged_rank_statistics_equal_the_statistics_of_the_union():
    rng = np.random.default_rng(0)
    parts = [rng.normal(loc=i, scale=1 + i, size=(64 + 16 * i, 3)) for i in range(3)]
    merged = RunningMeanStd.zeros(3)
    merged.update_from_moments(*merge_moments([batch_moments(p, 3) for p in parts]))
    union = RunningMeanStd.zeros(3)
    union.update(np.concatenate(parts))
    np.testing.assert_allclose(merged.mean, union.mean, rtol=1e-12)
    np.testing.assert_allclose(merged.var, union.var, rtol=1e-12)
    assert merged.count == union.count
    # One rank merges nothing: the very same arrays (so one process stays bitwise what it was).
    single = batch_moments(parts[0], 3)
    assert merge_moments([single]) is single


def test_divergence_names_the_ranks_and_the_first_differing_parameter():
    base = {"policy.actor.layers.0.weight": np.ones((2, 2), np.float32), "policy.critic.layers.0.bias": np.zeros(2)}
    same = dist.state_digests(base)
    assert dist.find_divergence([same, dict(same)]) is None
    nudged = dict(base, **{"policy.critic.layers.0.bias": np.array([0.0, 1e-12])})
    problem = dist.find_divergence([same, same, dist.state_digests(nudged)])
    assert problem == (
        "ranks diverged (rank 2 vs rank 0): rank 2 differs from rank 0, first in 'policy.critic.layers.0.bias'"
    )
    # The dtype counts as well as the bytes.
    assert dist.state_digests({"x": np.zeros(2, np.float32)}) != dist.state_digests({"x": np.zeros(1, np.float64)})
    assert dist.checksum(same) == dist.checksum(dict(same)) != dist.checksum(dist.state_digests(nudged))


class TwoRanks:
    """This process as rank 0 of 2, with rank 1's contribution transformed by ``other``."""

    rank, world_size, local_rank = 0, 2, 0

    def __init__(self, other) -> None:
        self.other = other

    def gather(self, obj):
        return [obj, self.other(obj)]


def test_trainer_stops_when_a_rank_diverges(tmp_path):
    cfg = TrainConfig(env_id="CartPole-v1", num_envs=2, num_steps=8, num_minibatches=1, progress=False)
    rd.prepare_new_run_dir(tmp_path / "run")
    trainer = Trainer(cfg, tmp_path / "run")
    try:
        trainer.comm = TwoRanks(lambda digests: digests)
        assert trainer.check_consistency() == [trainer.rank_checksums[0]] * 2
        trainer.comm = TwoRanks(lambda digests: {**digests, "policy.actor.layers.2.bias": "0" * 16})
        with pytest.raises(
            dist.RankDivergence, match="rank 1 differs from rank 0, first in 'policy.actor.layers.2.bias'"
        ):
            trainer.check_consistency()
    finally:
        trainer.close()
    assert dist.RankDivergence.exit_code == 1


def test_msrun_command_keeps_loopback_unless_told_otherwise(tmp_path):
    cmd = launch.msrun_command(2, "127.0.0.1", 4242, tmp_path, ["--env-id", "CartPole-v1", "--workers", "2"])
    assert cmd[1:3] == ["-m", "mindspore.parallel.cluster.run"]
    assert {"--worker_num=2", "--local_worker_num=2", "--master_addr=127.0.0.1", "--master_port=4242",
            f"--log_dir={tmp_path}", "--join=True"} <= set(cmd)  # fmt: skip
    assert cmd[-7:] == ["python", "-m", "msrl_consistency.train", "--env-id", "CartPole-v1", "--workers", "2"]
    assert "--master_addr=10.1.2.3" in launch.msrun_command(4, "10.1.2.3", 4242, tmp_path, [])
    assert TrainConfig().master_addr == "127.0.0.1"
    port = launch.free_port("127.0.0.1")
    assert 0 < port < 65536
    env = launch.worker_env(tmp_path)
    assert env["PATH"].split(":")[0] == str(Path(launch.sys.executable).parent)
    assert env["PYTHONPATH"].split(":")[0] == str(Path(__file__).resolve().parents[1])
    assert env[dist.STATUS_DIR_ENV] == str(tmp_path)


def test_a_program_wrapping_the_cli_runs_as_each_rank(tmp_path):
    cmd = launch.msrun_command(2, "127.0.0.1", 4242, tmp_path, ["--workers", "2"], rank_command=["/x/wrapper.py"])
    assert cmd[-4:] == ["python", "/x/wrapper.py", "--workers", "2"]


def test_shipped_training_code_has_no_fault_hook():
    """Faults are injected by tests/fault_train.py through the Trainer's ``on_iteration`` (as the Lite runner's are
    by its test binary): no module of the package reads a fault variable or kills its own process."""
    import msrl_consistency

    for path in Path(msrl_consistency.__file__).parent.rglob("*.py"):
        text = path.read_text()
        assert "MSRL_TRAIN_FAULT" not in text and "os.kill(os.getpid()" not in text, path


def test_msrun_hands_every_train_flag_to_the_ranks_untouched(tmp_path, monkeypatch):
    # msrun parses its own options anywhere on its command line, abbreviations included: a train flag that is a
    # prefix of one of msrun's (e.g. "--worker" of "--worker_num") would be taken from the ranks.
    import sys

    from mindspore.parallel.cluster import run as msrun

    argv = []
    for action in build_parser()._actions:
        if action.option_strings and action.dest != "help":
            argv += [action.option_strings[0], "1"]
    cmd = launch.msrun_command(2, "127.0.0.1", 4242, tmp_path, argv)
    monkeypatch.setattr(sys, "argv", ["msrun", *cmd[3:]])
    parsed = msrun.get_args()
    assert (parsed.task_script, parsed.task_script_args) == ("python", ["-m", "msrl_consistency.train", *argv])
    assert (parsed.worker_num, parsed.master_addr, parsed.master_port) == (2, "127.0.0.1", 4242)


def write_status(log_dir: Path, rank: int, **fields) -> None:
    (log_dir / f"rank_{rank}.json").write_text(json.dumps(fields))


def test_launcher_names_a_killed_rank_and_takes_the_worst_exit_code(tmp_path):
    write_status(tmp_path, 0, pid=100)
    write_status(tmp_path, 1, pid=101)
    (tmp_path / "msrun.log").write_text("[ERROR] ME(1:2,MainProcess): Worker process 101 exit with exception. "
                                        "Error code: -9.\n")  # fmt: skip
    outcome = launch.collect_outcome(tmp_path, 2, msrun_code=1)
    assert outcome.exit_code == 137
    lines = outcome.report(tmp_path / "no-run")
    assert lines[0] == "error: rank 1 (pid 101) was killed by signal 9 (SIGKILL); msrun stopped the other ranks"
    assert "ranks stopped because of that: 0" in lines


def test_launcher_reports_a_rank_error_and_success(tmp_path):
    write_status(tmp_path, 0, pid=100, exit_code=1, error="at iteration 4: ranks diverged")
    write_status(tmp_path, 1, pid=101)
    (tmp_path / "msrun.log").write_text("Worker process 100 exit with exception. Error code: 1.\n")
    outcome = launch.collect_outcome(tmp_path, 2, msrun_code=1)
    assert outcome.exit_code == 1
    assert outcome.report(tmp_path)[0] == "error: rank 0 exited with code 1: at iteration 4: ranks diverged"

    # Bad input found by rank 0 stops every rank with the same error: reported once.
    write_status(tmp_path, 0, pid=100, exit_code=2, error="unknown environment id 'X'")
    write_status(tmp_path, 1, pid=101, exit_code=2, error="unknown environment id 'X'")
    outcome = launch.collect_outcome(tmp_path, 2, msrun_code=1)
    assert outcome.exit_code == 2
    assert outcome.report(tmp_path)[0] == "error: ranks 0, 1 exited with code 2: unknown environment id 'X'"

    write_status(tmp_path, 0, pid=100, exit_code=0)
    write_status(tmp_path, 1, pid=101, exit_code=0)
    (tmp_path / "msrun.log").write_text("")
    assert launch.collect_outcome(tmp_path, 2, msrun_code=0).exit_code == 0
    # msrun failed (e.g. its scheduler) while no rank reported: still a failure.
    write_status(tmp_path, 1, pid=101)
    assert launch.collect_outcome(tmp_path, 2, msrun_code=1).exit_code == 1


def test_device_per_rank_and_its_clear_error(tmp_path):
    assert dist.device_id_for("ascend", 3) == 3 and dist.device_id_for("gpu", 1) == 1
    assert dist.device_id_for("cpu", 3) == 0  # one CPU device, shared by the ranks
    with pytest.raises(UsageError, match="device 'ascend' is not available"):
        train.main(["--device", "ascend", "--workers", "2", "--run-dir", str(tmp_path / "run")])
    assert not (tmp_path / "run").exists()


def test_a_resumed_rank_joins_on_the_runs_own_device_not_the_command_lines(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / rd.RUN_JSON).write_text(json.dumps({"schema": rd.RUN_SCHEMA, "config": {"device": "Ascend"}}))
    assert train.rank_device(parse_config(["--resume", str(run)])) == "Ascend"  # the CLI default is CPU
    # A rank that cannot read the run (another machine's disk) keeps the command line's; rank 0 reports the run.
    assert train.rank_device(parse_config(["--resume", str(tmp_path / "elsewhere"), "--device", "GPU"])) == "GPU"
    assert train.rank_device(parse_config(["--device", "GPU"])) == "GPU"


def test_bad_data_parallel_flags_fail_before_writing(tmp_path):
    for flags, message in (
        (["--workers", "0"], "--workers must be positive"),
        (["--adv-norm-scope", "world"], "--adv-norm-scope must be global or rank"),
        (["--master-port", "70000"], "--master-port"),
        (["--check-every", "0"], "--check-every must be positive"),
    ):
        with pytest.raises(UsageError, match=message):
            train.main([*flags, "--run-dir", str(tmp_path / "run")])
    assert not (tmp_path / "run").exists()


def test_resume_state_of_a_single_process_run_before_data_parallel_loads_as_one_rank(tmp_path):
    old = {"env_id": "CartPole-v1", "iteration": 2, "global_step": 64, "episodes": 1, "params": {}, "rms": None,
           "noise_rng": 1, "shuffle_rng": 2, "obs": 3, "env_blobs": None, "ep_return": 4, "ep_length": 5}  # fmt: skip
    rd.save_resume_state(tmp_path / rd.RESUME_STATE, old)
    state = rd.load_resume_state(tmp_path / rd.RESUME_STATE)
    assert state["world_size"] == 1
    assert state["ranks"] == [{"noise_rng": 1, "shuffle_rng": 2, "obs": 3, "env_blobs": None, "ep_return": 4,
                               "ep_length": 5}]  # fmt: skip
    with pytest.raises(UsageError, match="trained with 1 worker; resume it with the same world size"):
        rd.check_world_size(tmp_path, 1, 2)


def test_stale_temp_files_of_an_interrupted_write_are_removed(tmp_path):
    (tmp_path / ".checkpoint.ckpt.abc123.tmp").write_bytes(b"half")
    (tmp_path / "keep.txt").write_text("x")
    assert rd.remove_stale_temp_files(tmp_path) == [".checkpoint.ckpt.abc123.tmp"]
    assert [p.name for p in tmp_path.iterdir()] == ["keep.txt"]
