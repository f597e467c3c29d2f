"""A verdict you can trust on every policy: nothing compared is not a pass, a failing policy of any contract kind
reaches the report with the right stage, a contract that describes less than the env is refused, and a runtime
killed from outside is not a verdict on the bundle.

Policies come from ``foreign_policies`` (written as other teams write them), copied next to their bundles.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import foreign_policies as fp
import gymnasium as gym
import lite_build
import numpy as np
import pytest
from cli_inprocess import run_module

from inference.compare.verifier import VerifyOptions
from inference.errors import UsageError
from inference.report.writers import write_reports
from msrl_consistency.api import export_policy, verify_policy

HERE = Path(__file__).resolve().parent
SMALL = ["--observations", "400", "--episodes", "2"]
EVERY_RUNTIME = ("ms-graph", "ms-mindir", "lite", "onnxruntime")


def cli(cwd: Path, module: str, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return run_module(module, *args, cwd=cwd, env=env)


def report(path: Path) -> dict:
    return json.loads((path / "report.json").read_text())


def stages(result) -> set[str]:
    return {c.diagnosis["stage"] for c in result.failed if c.diagnosis}


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> Path:
    """A team's directory: the policies module and frames recorded from its own camera."""
    path = tmp_path_factory.mktemp("team")
    shutil.copy(HERE / "foreign_policies.py", path)
    frames = np.random.default_rng(0).integers(0, 256, (300, 8, 8, 3)).astype(np.float32)
    np.save(path / "frames.npy", frames)
    return path


@pytest.fixture(scope="module")
def sac_bundle(work) -> Path:
    return export_policy(fp.make_sac(), fp.SAC_CONTRACT, work / "sac").root


@pytest.fixture(scope="module")
def gumbel_bundle(work) -> Path:
    return export_policy(fp.make_gumbel_cnn(), fp.GUMBEL_CNN_CONTRACT, work / "gumbel").root


def small(**kwargs) -> VerifyOptions:
    return VerifyOptions(**{"observations": 400, "episodes": 2, "seed": 1, **kwargs})


# -- 1. nothing compared is not a pass --------------------------------------------------------------------------
@pytest.mark.slow
def test_a_run_that_compared_nothing_exits_3_naming_why(cartpole_bundle, cartpole_ckpt, tmp_path):
    args = ["--bundle", str(cartpole_bundle.root), "--ckpt", str(cartpole_ckpt), *SMALL, "--out", str(tmp_path / "r")]
    proc = cli(tmp_path, "msrl_consistency.verify", *args, "--runtimes", "lite",
               env={"MSRL_LITE_RUNNER": "/nonexistent"})  # fmt: skip
    assert proc.returncode == 3, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "NOT VERIFIED" in proc.stdout and "Lite runner not found at /nonexistent" in proc.stdout
    rep = report(tmp_path / "r")
    assert rep["exit_code"] == 3 and not rep["passed"]
    compared = next(c for c in rep["checks"] if c["name"] == "compared")
    assert compared["status"] == "error" and "nothing was compared" in compared["summary"]
    assert "<error message=" in (tmp_path / "r" / "junit.xml").read_text()
    # Known before the reference's episodes and feeds: they are not computed for nothing.
    assert rep["runtimes"]["ms-cell"]["reason"] == "not built: no runtime to compare it with"
    assert "reference ms-cell" not in proc.stderr  # no progress line of a reference being built
    # Every requested runtime skipped for another reason (a MindIR newer than this Lite reads): still nothing compared.
    proc = cli(tmp_path, "msrl_consistency.verify", *args, "--runtimes", "lite-mindir")
    assert proc.returncode == 3 and "nothing was compared" in proc.stdout, proc.stdout[-2000:]


@pytest.mark.slow
def test_the_deploy_check_with_no_runtime_exits_3(cartpole_bundle, cartpole_ckpt, tmp_path):
    """inference.check in a deploy venv without a built runner and without onnxruntime: not "CONSISTENT"."""
    from inference.compare.golden import save_golden
    from msrl_consistency.api import verify_run

    result = verify_run(cartpole_bundle, cartpole_ckpt, small(runtimes=("ms-graph",)))
    save_golden(tmp_path / "g.npz", result.reference, result.bundle, result.inputs.get("env"))
    code = ("import sys; sys.modules['mindspore'] = None; sys.modules['onnxruntime'] = None\n"
            "from inference.check import cli\ncli()")  # fmt: skip
    proc = subprocess.run([sys.executable, "-c", code, str(cartpole_bundle.root), "--golden", str(tmp_path / "g.npz"),
                           "--out", str(tmp_path / "r")], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "MSRL_LITE_RUNNER": "/nonexistent"})  # fmt: skip
    assert proc.returncode == 3, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "onnxruntime" in proc.stdout and "not installed" in proc.stdout and "Lite runner not found" in proc.stdout


# -- 2. a failing policy that samples from its noise input reaches the report --------------------------------------
@pytest.mark.slow
def test_a_sac_style_sampler_verifies_when_genuine(sac_bundle):
    result = verify_policy(fp.make_sac(), None, sac_bundle, options=small(required=EVERY_RUNTIME))
    assert result.exit_code == 0, result.console_table(only_failed=True)
    assert set(EVERY_RUNTIME) <= set(result.compared)


def test_manifest_defaults_reach_the_report(sac_bundle, tmp_path):
    """(Item 9) An optional manifest field left out: the report says what verify assumed instead."""
    copy = tmp_path / "sac"
    shutil.copytree(sac_bundle, copy)
    manifest = json.loads((copy / "manifest.json").read_text())
    del manifest["env"]
    (copy / "manifest.json").write_text(json.dumps(manifest))
    result = verify_policy(fp.make_sac(), None, copy, options=small(runtimes=("onnxruntime",), episodes=1))
    assert result.exit_code == 0, result.console_table(only_failed=True)
    write_reports(result, tmp_path / "r")
    assert "observation bounds unknown" in report(tmp_path / "r")["bundle"]["defaults"]["env"]
    assert "## Manifest defaults" in (tmp_path / "r" / "report.md").read_text()


@pytest.mark.slow
def test_a_broken_sac_style_sampler_fails_with_a_report_and_the_right_stage(work, tmp_path):
    nudged = export_policy(fp.nudge(fp.make_sac(), "body.0.weight", 0.05), fp.SAC_CONTRACT, tmp_path / "nudged")
    result = verify_policy(fp.make_sac(), None, nudged.root, options=small(required=EVERY_RUNTIME))
    assert result.exit_code == 1 and stages(result) == {"network"}, result.console_table()
    paths = write_reports(result, tmp_path / "r")
    assert report(tmp_path / "r")["exit_code"] == 1 and "plot" in paths
    unsquashed = export_policy(fp.make_sac_unsquashed(), fp.SAC_CONTRACT, tmp_path / "unsquashed")
    result = verify_policy(fp.make_sac(), None, unsquashed.root, options=small(runtimes=("ms-mindir", "onnxruntime")))
    assert result.exit_code == 1 and stages(result) == {"postprocessing"}, result.console_table()
    assert "squash" in result.failed[0].diagnosis["detail"]


@pytest.mark.slow
def test_the_pytest_helper_fails_a_noise_sampler_with_the_table(work, tmp_path):
    from msrl_consistency.testing import assert_policy_consistent

    nudged = export_policy(fp.nudge(fp.make_sac(), "mu.weight", 0.05), fp.SAC_CONTRACT, tmp_path / "nudged")
    with pytest.raises(AssertionError, match=r"(?s)does not act like the training path.*FAIL.*network"):
        assert_policy_consistent(fp.make_sac(), None, nudged.root, runtimes=["ms-mindir"], n_observations=300,
                                 episodes=2)  # fmt: skip


@pytest.mark.slow
def test_a_gumbel_cnn_verifies_when_genuine_and_fails_when_nudged(work, gumbel_bundle, tmp_path):
    frames = work / "frames.npy"
    result = verify_policy(fp.make_gumbel_cnn(), None, gumbel_bundle, observations=frames,
                           options=small(required=EVERY_RUNTIME))  # fmt: skip
    assert result.exit_code == 0, result.console_table(only_failed=True)
    observed = next(c for c in result.checks if c.runtime == "lite" and c.name == "observations.policy")
    assert observed.summary.startswith("300 recorded + 100 synthetic observations agree")
    nudged = export_policy(fp.nudge(fp.make_gumbel_cnn(), "conv2.weight", 0.2), fp.GUMBEL_CNN_CONTRACT,
                           tmp_path / "nudged")  # fmt: skip
    result = verify_policy(fp.make_gumbel_cnn(), None, nudged.root, observations=frames,
                           options=small(required=EVERY_RUNTIME))  # fmt: skip
    assert result.exit_code == 1 and stages(result) == {"network"}, result.console_table()


# -- 3. a contract that describes less than the env is refused ---------------------------------------------------
class TwoHeadEnv(gym.Env):
    observation_space = gym.spaces.Box(-1.0, 1.0, (4,), np.float32)
    action_space = gym.spaces.MultiDiscrete([3, 2])

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return np.zeros(4, np.float32), {}

    def step(self, action):
        return np.zeros(4, np.float32), 0.0, True, False, {}


class DictObsEnv(TwoHeadEnv):
    observation_space = gym.spaces.Dict({"vec": gym.spaces.Box(-1.0, 1.0, (4,), np.float32),
                                         "img": gym.spaces.Box(0, 255, (8, 8, 3), np.uint8)})  # fmt: skip
    action_space = gym.spaces.Discrete(2)


@pytest.mark.parametrize(("env", "space"), [(TwoHeadEnv, "MultiDiscrete"), (DictObsEnv, "Dict")])
def test_spaces_the_contract_cannot_describe_are_refused(env, space, tmp_path):
    import mindspore as ms
    from mindspore import nn

    ms.set_seed(0)
    head = nn.Dense(4, 3)
    contract = {"input": {"obs": [4]}, "outputs": {"names": ["logits"]},
                "action": {"kind": "categorical", "logits": "logits"}}  # fmt: skip
    bundle = export_policy(head, contract, tmp_path / "b", options=None)
    with pytest.raises(UsageError, match=space) as info:
        verify_policy(head, None, bundle.root, env=env, options=small(runtimes=("ms-mindir",)))
    assert "\n" not in str(info.value)


# -- 6. bundles that used to refuse to exist -----------------------------------------------------------------------
SHAPES = {
    "old-style actor (ZerosLike std, reshape to mean.shape)": ("make_old_style", fp.OLD_STYLE_CONTRACT, "fc1.weight"),
    "SAC-style actor (broadcast_to(mean.shape) std)": ("make_broadcast_std", fp.BROADCAST_STD_CONTRACT, "fc1.weight"),
    "BatchNorm1d + Dropout MLP": ("make_batchnorm", fp.BATCHNORM_CONTRACT, "fc2.weight"),
    "CNN flattening with x.shape[0]": ("make_frame_cnn", fp.FRAME_CONTRACT, "conv2.weight"),
    "actor-critic with LeakyReLU": ("make_leaky_actor_critic", fp.LEAKY_AC_CONTRACT, "actor.0.weight"),
    "actor returning probabilities": ("make_probs_actor", fp.PROBS_CONTRACT, "body.0.weight"),
}


@pytest.mark.slow
@pytest.mark.parametrize("case", list(SHAPES))
def test_actors_as_other_teams_write_them_export_a_full_bundle_that_verifies_everywhere(work, tmp_path, case):
    """Shapes the ONNX exporter froze at its batch, LeakyReLU (Mul + Max, which Lite 2.0.0 cannot run), an actor
    that returns probabilities: each a full bundle, genuine 0 on every runtime, nudged 1 at the network stage."""
    factory, contract, weight = SHAPES[case]
    make = getattr(fp, factory)
    bundle = export_policy(make(), contract, tmp_path / "bundle")
    files = {g: {f for f, e in entry["files"].items() if "file" in e} for g, entry in bundle.manifest["graphs"].items()}
    assert files == {"policy": {"mindir", "onnx", "ms"}}
    source = {"observations": work / "frames.npy"} if "CNN" in case else {}
    result = verify_policy(make(), None, bundle.root, options=small(required=EVERY_RUNTIME), **source)
    assert result.exit_code == 0, result.console_table(only_failed=True)
    nudged = export_policy(fp.nudge(make(), weight, 0.05), contract, tmp_path / "nudged")
    result = verify_policy(make(), None, nudged.root, options=small(required=EVERY_RUNTIME), **source)
    assert result.exit_code == 1 and stages(result) == {"network"}, result.console_table()
    assert {c.runtime for c in result.failed} >= {"ms-mindir", "lite", "onnxruntime"}


@pytest.mark.slow
def test_a_format_that_cannot_be_produced_is_marked_and_the_others_kept(work, tmp_path):
    out = tmp_path / "bundle"
    contract = tmp_path / "c.toml"
    contract.write_text('env_id = "CartPole-v1"\n[input]\nobs = [4]\n[outputs]\nnames = ["logits"]\n'
                        '[action]\nkind = "categorical"\nlogits = "logits"\n')  # fmt: skip
    proc = cli(work, "msrl_consistency.export", "--cell", "foreign_policies:make_row_index", "--contract",
               str(contract), "--out", str(out))  # fmt: skip
    assert proc.returncode == 1, proc.stderr[-2000:]
    error = proc.stderr.strip().splitlines()
    assert len(error) == 1 and error[0].startswith("error: policy.onnx failed: ONNX: constant"), proc.stderr
    assert "the bundle keeps mindir" in error[0]
    files = json.loads((out / "manifest.json").read_text())["graphs"]["policy"]["files"]
    assert "file" in files["mindir"] and "rows are not copies" in files["onnx"]["failed"]
    assert "converted from the ONNX graph, which failed" in files["ms"]["failed"]
    result = verify_policy(fp.make_row_index(), None, out, options=small(runtimes=("ms-mindir", "onnxruntime", "lite")))
    failed = {c.runtime: c for c in result.failed}
    assert result.exit_code == 1 and set(failed) == {"onnxruntime", "lite"}, result.console_table()
    assert all(c.diagnosis["stage"] == "runtime" and "failed at export" in c.summary for c in failed.values())
    assert result.runtimes["ms-mindir"]["status"] == "ran"


def test_a_shape_mismatch_is_reported_as_such(tmp_path):
    from inference.compare.judge.stats import Tolerance, compare_arrays

    cmp = compare_arrays("std", np.ones((256, 1)), np.ones((1, 1)), Tolerance(1e-4, 1e-4))
    assert not cmp.passed and cmp.describe() == "std has shape [1, 1] vs expected [256, 1]"
    assert cmp.max_abs == 0.0  # never "max abs inf"


# -- 7. diagnoses that follow the evidence ------------------------------------------------------------------------
def test_a_graph_without_the_cells_input_scaling_is_a_preprocessing_fault(work, tmp_path):
    import mindspore as ms

    ckpt = tmp_path / "cnn.ckpt"
    ms.save_checkpoint(fp.make_frame_cnn(), str(ckpt))
    bundle = export_policy(fp.make_frame_cnn_unscaled(), fp.FRAME_CONTRACT, tmp_path / "b", checkpoint=ckpt)
    result = verify_policy(fp.make_frame_cnn(), None, bundle.root, checkpoint=ckpt, observations=work / "frames.npy",
                           options=small(runtimes=("ms-mindir",)))  # fmt: skip
    provenance = next(c for c in result.checks if c.name == "provenance")
    assert provenance.status == "pass" and stages(result) == {"preprocessing"}, result.console_table()
    assert "/255" in result.failed[0].diagnosis["detail"]


@pytest.mark.slow
def test_a_graph_exported_in_training_mode_is_named_and_the_cell_keeps_its_mode(work, tmp_path):
    code = ("import mindspore as ms, foreign_policies as fp\nnet = fp.make_batchnorm()\nms.save_checkpoint(net, "
            "'bn.ckpt')\nnet.set_train(True)\nms.export(net, ms.Tensor(shape=[None, 4], dtype=ms.float32), "
            "file_name='bn_train', file_format='MINDIR')\n")  # fmt: skip
    subprocess.run([sys.executable, "-c", code], cwd=work, check=True, capture_output=True, timeout=300)
    cell = fp.make_batchnorm()
    cell.set_train(True)  # the caller's mode: verify puts the reference in eval mode and gives it back
    result = verify_policy(cell, fp.BATCHNORM_CONTRACT, work / "bn_train.mindir", checkpoint=work / "bn.ckpt",
                           options=small(runtimes=("ms-mindir",)))  # fmt: skip
    assert cell.training
    repeat = next(c for c in result.checks if c.runtime == "ms-mindir" and c.name == "repeatability")
    assert repeat.status == "fail" and repeat.diagnosis["stage"] == "training-mode", result.console_table()
    assert "Dropout" in repeat.diagnosis["detail"] and "eval mode" in repeat.diagnosis["detail"]
    assert stages(result) == {"training-mode"}


@pytest.mark.slow
def test_a_flip_is_counted_once_and_the_header_says_what_was_observed(work, tmp_path):
    nudged = export_policy(fp.nudge(fp.make_batchnorm(), "fc2.weight", 0.5), fp.BATCHNORM_CONTRACT, tmp_path / "b")
    out = tmp_path / "r"
    args = ["--bundle", str(nudged.root), "--cell", "foreign_policies:make_batchnorm", "--runtimes", "ms-mindir",
            "--observations-file", str(work / "obs.npy"), "--observations", "400", "--out", str(out)]  # fmt: skip
    np.save(work / "obs.npy", np.random.default_rng(1).normal(0.5, 2.0, (410, 4)).astype(np.float32))
    proc = cli(work, "msrl_consistency.verify", *args)
    assert proc.returncode == 1, proc.stderr[-2000:]
    check = next(c for c in report(out)["checks"] if c["name"] == "observations.policy")
    assert check["summary"].startswith("1 output(s) differ: logits "), check["summary"]
    assert "action flip(s)" in check["summary"]
    assert "on recorded observations" in proc.stderr and "(None)" not in proc.stderr
    assert "# Consistency report: " + str(work / "obs.npy") in (out / "report.md").read_text()


# -- 14. a runtime killed from outside is not a verdict on the bundle ----------------------------------------------
TEST_RUNNER = str(Path(lite_build.runner_path()).with_name("msrl-lite-runner-test"))


@pytest.mark.slow
@pytest.mark.parametrize(("fault", "code", "status"), [("kill", 3, "error"), ("crash", 1, "fail")])
def test_a_runner_killed_from_outside_is_not_judged_but_a_crash_is(cartpole_bundle, cartpole_ckpt, tmp_path, fault,
                                                                   code, status):  # fmt: skip
    """kill: the runner dies of SIGKILL on every request (what another process or the OOM killer does): restarted
    once, then the runtime is not judged (exit 3 as the only runtime). crash: it aborts on the graph: a verdict."""
    out = tmp_path / "r"
    proc = cli(tmp_path, "msrl_consistency.verify", "--bundle", str(cartpole_bundle.root), "--ckpt", str(cartpole_ckpt),
               "--runtimes", "lite", *SMALL, "--out", str(out),
               env={"MSRL_LITE_RUNNER": TEST_RUNNER, "MSRL_LITE_RUNNER_FAULT": fault})  # fmt: skip
    assert proc.returncode == code, proc.stdout[-2000:] + proc.stderr[-2000:]
    lite = [c for c in report(out)["checks"] if c["runtime"] == "lite"]
    assert [c["status"] for c in lite] == [status] and lite[0]["diagnosis"]["stage"] == "runtime"
    assert ("SIGKILL" if fault == "kill" else "SIGABRT") in lite[0]["summary"]
    if fault == "kill":
        assert "killed from outside twice" in lite[0]["summary"]


@pytest.mark.slow
def test_a_runner_killed_once_is_restarted_and_the_report_says_so(cartpole_bundle, cartpole_ckpt, tmp_path):
    """One SIGKILL from outside during verify: the runner is restarted, the bundle judged, the restart reported."""
    out = tmp_path / "r"
    proc = cli(tmp_path, "msrl_consistency.verify", "--bundle", str(cartpole_bundle.root), "--ckpt", str(cartpole_ckpt),
               "--runtimes", "lite", *SMALL, "--out", str(out),
               env={"MSRL_LITE_RUNNER": TEST_RUNNER, "MSRL_LITE_RUNNER_FAULT": "kill",
                    "MSRL_LITE_RUNNER_FAULT_ONCE": str(tmp_path / "fired")})  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert (tmp_path / "fired").exists()
    restarts = [c for c in report(out)["checks"] if c["runtime"] == "lite" and c["name"] == "restarts"]
    assert [c["status"] for c in restarts] == ["warn"] and "SIGKILL" in restarts[0]["summary"], restarts


def test_a_runner_killed_once_is_restarted_with_the_same_answers(cartpole_bundle):
    import signal

    from inference.runtimes.base import RuntimeSource
    from inference.runtimes.registry import create

    runtime = create("lite", RuntimeSource(cartpole_bundle), "policy").open()
    try:
        obs = np.zeros((3, 4), np.float32)
        first = runtime.infer(obs)
        os.kill(runtime.runner.pid, signal.SIGKILL)
        again = runtime.infer(obs)
        assert all(np.array_equal(first[k], again[k]) for k in first)
        assert len(runtime.restarts) == 1 and "SIGKILL" in runtime.restarts[0]
    finally:
        runtime.close()


def test_a_broken_onnxruntime_is_unavailable_with_its_reason(tmp_path):
    (tmp_path / "onnxruntime").mkdir()
    (tmp_path / "onnxruntime" / "__init__.py").write_text("raise ImportError('libonnxruntime.so: cannot open')\n")
    code = ("import sys; sys.path.insert(0, sys.argv[1])\nfrom inference.runtimes.onnxrt import import_problem\n"
            "print(import_problem())")  # fmt: skip
    proc = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, timeout=60)
    assert proc.stdout.strip() == "onnxruntime is installed but does not import: libonnxruntime.so: cannot open"


@pytest.mark.slow
def test_a_broken_onnxruntime_as_the_only_runtime_is_not_verified(cartpole_bundle, cartpole_ckpt, tmp_path):
    (tmp_path / "onnxruntime").mkdir()
    (tmp_path / "onnxruntime" / "__init__.py").write_text("raise ImportError('libonnxruntime.so: cannot open')\n")
    args = ["--bundle", str(cartpole_bundle.root), "--ckpt", str(cartpole_ckpt), "--runtimes", "onnxruntime", *SMALL,
            "--out", str(tmp_path / "r")]  # fmt: skip
    # A process of its own: the broken onnxruntime is the one its interpreter finds first.
    proc = subprocess.run([sys.executable, "-m", "msrl_consistency.verify", *args], cwd=tmp_path, capture_output=True,
                          text=True, timeout=600, env={**os.environ, "PYTHONPATH": str(tmp_path)})  # fmt: skip
    assert proc.returncode == 3, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "nothing was compared" in proc.stdout and "does not import: libonnxruntime.so" in proc.stdout


def test_an_object_array_in_an_observations_file_is_bad_input(cartpole_bundle, tmp_path):
    from inference.compare.inputs import load_observations

    np.savez(tmp_path / "obs.npz", obs=np.array([{"a": 1}] * 3, dtype=object))
    with pytest.raises(UsageError, match="obs.npz.*object"):
        load_observations(tmp_path / "obs.npz", cartpole_bundle)


# -- 15. a bundle does not choose the code that runs -----------------------------------------------------------------
@pytest.mark.slow
def test_a_bundle_naming_a_factory_does_not_run_it_unless_asked(work, sac_bundle, tmp_path):
    copy = tmp_path / "b"
    shutil.copytree(sac_bundle, copy)
    manifest = json.loads((copy / "manifest.json").read_text())
    manifest["source"]["cell"] = "evilmod:make"
    (copy / "manifest.json").write_text(json.dumps(manifest))
    (tmp_path / "evilmod.py").write_text("open('ran', 'w').write('x')\ndef make():\n    raise ValueError('boom')\n")
    proc = cli(tmp_path, "msrl_consistency.verify", "--bundle", str(copy), *SMALL, "--out", str(tmp_path / "r"))
    assert proc.returncode == 2 and not (tmp_path / "ran").exists(), proc.stderr
    assert proc.stderr.strip() == (
        "error: the bundle was exported from 'evilmod:make': pass --cell evilmod:make to "
        "run that code (or --trust-bundle-cell to let the manifest choose it)"
    )
    assert not (tmp_path / "r").exists()  # exit 2 leaves no empty report directory
    proc = cli(tmp_path, "msrl_consistency.verify", "--bundle", str(copy), "--trust-bundle-cell", *SMALL)
    assert (tmp_path / "ran").exists() and proc.returncode == 2  # opted in: the manifest's factory ran


def test_the_manifests_checkpoint_is_only_a_hint(cartpole_bundle, tmp_path):
    copy = tmp_path / "b"
    shutil.copytree(cartpole_bundle.root, copy)
    manifest = json.loads((copy / "manifest.json").read_text())
    other = tmp_path / "other.ckpt"
    other.write_bytes(b"not the checkpoint")
    manifest["source"]["checkpoint"] = str(other)
    (copy / "manifest.json").write_text(json.dumps(manifest))
    proc = cli(tmp_path, "msrl_consistency.verify", "--bundle", str(copy), *SMALL)
    assert proc.returncode == 2 and "is not the checkpoint the bundle was exported from" in proc.stderr


def test_probabilities_declared_as_logits_are_warned_about(tmp_path):
    contract = {**fp.PROBS_CONTRACT, "action": {"kind": "categorical", "logits": "probs"}}
    bundle = export_policy(fp.make_probs_actor(), contract, tmp_path / "b", options=None)
    result = verify_policy(fp.make_probs_actor(), None, bundle.root, options=small(runtimes=("ms-mindir",)))
    warning = next(c for c in result.checks if c.name == "roles.policy")
    assert warning.status == "warn" and 'declare probs = "probs"' in warning.summary


def test_a_probs_flip_is_judged_in_log_space():
    """Scores of a probs output are its logs: p_i may fall and p_j rise by their allowances."""
    from inference.compare.judge.stats import Tolerance, score_allowance

    tol = Tolerance(1e-4, 1e-4)
    closes = float(score_allowance(tol, np.float64(0.5), np.float64(0.49), 1e-4, probabilities=True))
    assert np.isclose(closes, np.log(0.5 / (0.5 - 1e-4)) + np.log((0.49 + 1e-4) / 0.49))
    assert float(score_allowance(tol, np.float64(0.5), np.float64(0.49), 1e-4)) == pytest.approx(2e-4)
