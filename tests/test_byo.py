"""Bring your own policy: the examples (never touching our trainer) verify, and the faults a foreign policy
brings are caught and named. Each example is copied to a temp dir and run there, as a team would."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from byo_examples import trained_example
from cli_inprocess import run_module

SMALL = ["--observations", "400", "--episodes", "2"]


def run(cwd: Path, *args: str, module: str = "msrl_consistency.verify") -> subprocess.CompletedProcess[str]:
    return run_module(module, *args, cwd=cwd)


def report(path: Path) -> dict:
    return json.loads((path / "report.json").read_text())


@pytest.fixture(scope="module")
def pendulum(tmp_path_factory) -> Path:
    """The guide-style PolicyNet, trained briefly by its own script, exported by it with plain mindspore.export."""
    return trained_example(tmp_path_factory, "pendulum", "--iterations", "2", "--episodes", "1")


@pytest.fixture(scope="module")
def dqn(tmp_path_factory) -> Path:
    return trained_example(tmp_path_factory, "cartpole-dqn", "--steps", "600")


USER_MINDIR = ["--mindir", "policy_model.mindir", "--cell", "policy:make_policy", "--ckpt", "policy.ckpt"]


@pytest.mark.slow
def test_user_exported_mindir_verifies_against_its_cell(pendulum):
    proc = run(pendulum, *USER_MINDIR, "--contract", "contract.toml", *SMALL, "--out", "r-ok")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    rep = report(pendulum / "r-ok")
    assert rep["bundle"]["source"] == "mindir" and rep["bundle"]["graphs"]["policy"]["action"]["kind"] == "gaussian"
    ran = {name for name, info in rep["runtimes"].items() if info["status"] == "ran"}
    assert {"ms-graph", "ms-mindir"} <= ran
    checks = {(c["runtime"], c["name"]): c for c in rep["checks"]}
    # std ignores the batch ([1]); KL uses it; stochastic episodes sample on the host from (mean, std).
    assert checks[("ms-mindir", "observations.policy")]["metrics"]["kl"]["max"] == 0.0
    assert checks[("ms-mindir", "episodes.free_running.stochastic")]["status"] == "pass"
    onnx = rep["runtimes"]["onnxruntime"]  # not asked for: a fact of the runtimes section, not a check
    assert onnx["status"] == "unavailable" and "no .onnx graph" in onnx["reason"]
    assert ("onnxruntime", "available") not in checks


@pytest.mark.slow
def test_host_side_normalisation_is_caught_and_named(pendulum):
    """Before: the bare net exported, normalisation left on the host. The wrapped training path tells."""
    bare = ["--mindir", "policy_model_bare.mindir", *USER_MINDIR[2:], "--contract", "contract.toml"]
    proc = run(pendulum, *bare, "--runtimes", "ms-mindir", *SMALL, "--out", "r-bare")
    assert proc.returncode == 1, proc.stderr[-2000:]
    failed = [c for c in report(pendulum / "r-bare")["checks"] if c["status"] == "fail"]
    assert {c["diagnosis"]["stage"] for c in failed if c["diagnosis"]} == {"preprocessing"}


@pytest.mark.slow
def test_export_cell_bundle_runs_everywhere_and_on_the_deploy_side(pendulum):
    proc = run(pendulum, "--cell", "policy:make_policy", "--ckpt", "policy.ckpt", "--contract", "contract.toml",
               "--out", "bundle", module="msrl_consistency.export")  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    manifest = json.loads((pendulum / "bundle" / "manifest.json").read_text())
    assert manifest["schema_version"] == 2 and manifest["source"]["kind"] == "cell"
    assert manifest["graphs"]["policy"]["outputs"][1]["shape"] == [1]  # std kept its batch-free shape
    assert {"mindir", "onnx", "ms"} <= {f for f, e in manifest["graphs"]["policy"]["files"].items() if "file" in e}
    # The manifest names the checkpoint (used as its sha256 matches); the code that runs is the user's to name.
    proc = run(pendulum, "--bundle", "bundle", "--cell", "policy:make_policy", *SMALL, "--out", "r-bundle")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    ran = {name for name, info in report(pendulum / "r-bundle")["runtimes"].items() if info["status"] == "ran"}
    assert {"ms-mindir", "onnxruntime", "lite"} <= ran
    code = "import sys; sys.modules['mindspore'] = None\nfrom inference.play import main\nsys.exit(main(sys.argv[1:]))"
    play = subprocess.run([sys.executable, "-c", code, "bundle", "--episodes", "1", "--stochastic"], cwd=pendulum,
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    assert play.returncode == 0 and "mean return" in play.stdout, play.stderr[-2000:]


@pytest.mark.slow
def test_pytest_helper_passes_and_fails_with_the_table(pendulum, monkeypatch):
    # The team's own CI test file, run as they would run it.
    pytest_cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_policy_consistency.py"]
    proc = subprocess.run(pytest_cmd, cwd=pendulum, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0 and "1 passed" in proc.stdout, proc.stdout[-3000:]
    from msrl_consistency.testing import assert_policy_consistent

    monkeypatch.chdir(pendulum)
    monkeypatch.syspath_prepend(str(pendulum))
    import policy  # the example's own module

    with pytest.raises(AssertionError, match=r"(?s)ms-mindir \| observations.policy .*FAIL.*preprocessing"):
        small = {"runtimes": ["ms-mindir"], "n_observations": 300, "episodes": 2}
        assert_policy_consistent(policy.make_policy(), "contract.toml", "policy_model_bare.mindir",
                                 checkpoint="policy.ckpt", **small)  # fmt: skip


def export_mindir(cwd: Path, module: str, ckpt: str, name: str, obs_dim: int) -> str:
    """What a team does: build the Cell, load its checkpoint, ``mindspore.export`` it (in a fresh process)."""
    code = (
        f"import sys; sys.path.insert(0, '.'); import mindspore as ms; import {module} as m\n"
        f"net = m.make(); ms.load_checkpoint({ckpt!r}, net)\n"
        f"spec = ms.Tensor(shape=[None, {obs_dim}], dtype=ms.float32)\n"
        f"ms.export(net, spec, file_name={name!r}, file_format='MINDIR')"
    )
    subprocess.run([sys.executable, "-c", code], cwd=cwd, check=True, capture_output=True, timeout=300)
    return f"{name}.mindir"


def nudge(ckpt: Path, name: str, out: Path) -> Path:
    """A copy of ``ckpt`` with one weight moved by 1e-3."""
    import mindspore as ms

    params = ms.load_checkpoint(str(ckpt))
    weight = params[name].asnumpy()
    weight.flat[0] += 1e-3
    params[name].set_data(ms.Tensor(weight))
    ms.save_checkpoint([{"name": k, "data": v} for k, v in params.items()], str(out))
    return out


@pytest.mark.slow
def test_nudged_weight_is_a_network_fault(pendulum):
    nudge(pendulum / "policy.ckpt", "fc1.weight", pendulum / "nudged.ckpt")
    args = [*USER_MINDIR[:4], "--ckpt", "nudged.ckpt", "--contract", "contract.toml", "--runtimes", "ms-mindir"]
    proc = run(pendulum, *args, *SMALL, "--out", "r-nudged")
    assert proc.returncode == 1, proc.stderr[-2000:]
    stages = {c["diagnosis"]["stage"] for c in report(pendulum / "r-nudged")["checks"] if c["diagnosis"]}
    assert "network" in stages


@pytest.mark.slow
@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda t: t.replace("low = [-2.0]", "low = [-1.0]").replace("high = [2.0]", "high = [1.0]"), "action bounds"),
        (
            lambda t: t.replace('names = ["mean", "std"]', 'names = ["mean"]').replace('std = "std"', "std = [0.5]"),
            "returns 2 output",
        ),
        (lambda t: t.replace("obs = [3]", "obs = [4]"), "fails on inputs shaped by the contract"),
    ],
    ids=["lying-bounds", "output-count", "obs-shape"],
)
def test_contract_that_disagrees_is_a_usage_error(pendulum, edit, message):
    lie = pendulum / "lie.toml"
    lie.write_text(edit((pendulum / "contract.toml").read_text()))
    proc = run(pendulum, *USER_MINDIR, "--contract", "lie.toml", *SMALL, "--out", "r-lie")
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and message in errors[0] and "Traceback" not in proc.stderr, proc.stderr


NO_KERNEL_POLICY = '''
from policy import PolicyNet

class Repeating(PolicyNet):
    """Calls an op this MindSpore has no CPU kernel for (``Tensor.repeat``, as MAPPO's actor does)."""
    def construct(self, x):
        return super().construct(x.repeat(1, 0))

def make():
    return Repeating()
'''


@pytest.mark.slow
def test_a_cell_that_cannot_run_on_this_device_is_said_so_before_any_contract_talk(pendulum):
    (pendulum / "repeating.py").write_text(NO_KERNEL_POLICY)
    proc = run(pendulum, "--cell", "repeating:make", "--contract", "contract.toml", "--out", "b-repeat",
               module="msrl_consistency.export")  # fmt: skip
    assert proc.returncode == 3, proc.stdout[-2000:] + proc.stderr[-2000:]
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "the Cell fails on this device (CPU): MindSpore has no repeat kernel" in errors[0]
    assert "contract" not in errors[0] and "Traceback" not in proc.stderr, proc.stderr


SAMPLING_POLICY = '''
from mindspore import ops
from policy import PolicyNet

class SamplingPolicy(PolicyNet):
    """Samples inside the graph: no other runtime can reproduce its actions."""
    def construct(self, x):
        mean, std = super().construct(x)
        return mean + std * ops.standard_normal(mean.shape)

def make():
    return SamplingPolicy()
'''

SAMPLING_CONTRACT = """env_id = "Pendulum-v1"
[input]
obs = [3]
[outputs]
names = ["action"]
[action]
kind = "deterministic"
action = "action"
squash = "clip"
low = [-2.0]
high = [2.0]
"""


@pytest.mark.slow
def test_sampling_inside_the_graph_is_diagnosed(pendulum):
    (pendulum / "sampling_policy.py").write_text(SAMPLING_POLICY)
    (pendulum / "sampling.toml").write_text(SAMPLING_CONTRACT)
    export_mindir(pendulum, "sampling_policy", "policy.ckpt", "sampling", 3)
    proc = run(pendulum, "--mindir", "sampling.mindir", "--cell", "sampling_policy:make", "--ckpt", "policy.ckpt",
               "--contract", "sampling.toml", *SMALL, "--out", "r-sampling")  # fmt: skip
    assert proc.returncode == 1, proc.stderr[-2000:]
    failed = [c for c in report(pendulum / "r-sampling")["checks"] if c["status"] == "fail"]
    assert failed[0]["name"] == "repeatability" and "take the noise as an input" in failed[0]["diagnosis"]["detail"]
    assert "sampling inside the graph" in proc.stdout
    refused = run(pendulum, "--cell", "sampling_policy:make", "--ckpt", "policy.ckpt", "--contract", "sampling.toml",
                  "--out", "b-sampling", module="msrl_consistency.export")  # fmt: skip
    assert refused.returncode == 1 and "take the noise as an input" in refused.stderr
    assert not (pendulum / "b-sampling").exists()


@pytest.mark.slow
def test_dqn_example_verifies_with_argmax_metrics(dqn):
    proc = run(dqn, "--mindir", "qnet.mindir", "--cell", "qnet:make_qnet", "--ckpt", "qnet.ckpt", "--contract",
               "contract.toml", *SMALL, "--out", "r-dqn")  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    checks = {(c["runtime"], c["name"]): c for c in report(dqn / "r-dqn")["checks"]}
    metrics = checks[("ms-mindir", "observations.policy")]["metrics"]
    assert metrics["argmax"]["flips"] == 0 and "kl" not in metrics  # Q-values are not a distribution
    assert checks[("inputs", "episodes.stochastic")]["status"] == "skip"
    assert ("ms-mindir", "episodes.free_running.deterministic") in checks
    exported = run(dqn, "--cell", "qnet:make_qnet", "--ckpt", "qnet.ckpt", "--contract", "contract.toml", "--out",
                   "bundle", module="msrl_consistency.export")  # fmt: skip
    assert exported.returncode == 0, exported.stderr[-2000:]
    proc = run(dqn, "--bundle", "bundle", "--cell", "qnet:make_qnet", "--runtimes", "lite,onnxruntime", *SMALL,
               "--out", "r-dqn-bundle")  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]


NOISY_QNET = '''
from mindspore import ops
from qnet import QNet

class NoisyQNet(QNet):
    """Exploration noise added inside the graph."""
    def construct(self, x):
        q = super().construct(x)
        return q + 0.5 * ops.standard_normal(q.shape)

def make():
    return NoisyQNet()
'''


@pytest.mark.slow
@pytest.mark.parametrize("fault", ["nudged-weight", "noise-in-graph", "lying-contract"])
def test_dqn_example_catches_injected_faults(dqn, fault):
    mindir, cell, ckpt, contract = "qnet.mindir", "qnet:make_qnet", "qnet.ckpt", "contract.toml"
    if fault == "nudged-weight":
        ckpt = nudge(dqn / "qnet.ckpt", "body.0.weight", dqn / "nudged.ckpt").name
    elif fault == "noise-in-graph":
        (dqn / "noisy_qnet.py").write_text(NOISY_QNET)
        export_mindir(dqn, "noisy_qnet", "qnet.ckpt", "noisy", 4)
        mindir, cell = "noisy.mindir", "noisy_qnet:make"
    else:
        lie = (dqn / "contract.toml").read_text().replace('kind = "argmax"', 'kind = "gaussian"')
        lie = lie.replace('values = "q"', 'mean = "q"\nstd = [1.0]')
        (dqn / "lie.toml").write_text(lie)
        contract = "lie.toml"
    args = ["--mindir", mindir, "--cell", cell, "--ckpt", ckpt, "--contract", contract, "--runtimes", "ms-mindir"]
    proc = run(dqn, *args, *SMALL, "--out", f"r-{fault}")
    if fault == "lying-contract":
        assert proc.returncode == 2 and "the env takes a discrete action" in proc.stderr, proc.stderr[-2000:]
        return
    assert proc.returncode == 1, proc.stderr[-2000:]
    failed = [c for c in report(dqn / f"r-{fault}")["checks"] if c["status"] == "fail"]
    stage = "network" if fault == "nudged-weight" else "sampling"
    assert stage in {c["diagnosis"]["stage"] for c in failed if c["diagnosis"]}


@pytest.mark.slow
def test_recorded_observations_replace_episodes(dqn):
    import gymnasium as gym

    env = gym.make("CartPole-v1")
    obs = [env.reset(seed=0)[0]]
    for _ in range(300):
        o, _, term, trunc, _ = env.step(env.action_space.sample())
        obs.append(o if not (term or trunc) else env.reset()[0])
    np.savez(dqn / "recorded.npz", obs=np.asarray(obs, np.float32))
    user = ["--mindir", "qnet.mindir", "--cell", "qnet:make_qnet", "--ckpt", "qnet.ckpt", "--contract", "contract.toml"]
    proc = run(dqn, *user, "--observations-file", "recorded.npz", "--runtimes", "ms-mindir", "--out", "r-rec")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    rep = report(dqn / "r-rec")
    assert "episode replay was skipped" in next(c["summary"] for c in rep["checks"] if c["name"] == "episodes")
    assert not any(c["name"].startswith("episodes.") for c in rep["checks"])
    assert rep["inputs"]["recorded_observations"].startswith("recorded.npz (301)")


@pytest.mark.slow
def test_a_runtime_that_hangs_is_stopped_and_reported(pendulum, monkeypatch):
    """Lite hangs in Predict (the test runner's fault hook): its watchdog kills it, and verify says that runtime could
    not be judged (exit 3, never a verdict of 1 on a bundle nobody judged), while the others are compared."""
    import lite_build

    from inference.compare.verifier import VerifyOptions
    from inference.runtimes.lite import LiteRuntime
    from msrl_consistency.api import verify_policy

    bundle = pendulum / "hang-bundle"  # its own: tests of this module may run in other processes
    if not (bundle / "manifest.json").exists():
        proc = run(pendulum, "--cell", "policy:make_policy", "--ckpt", "policy.ckpt", "--contract", "contract.toml",
                   "--out", bundle.name, module="msrl_consistency.export")  # fmt: skip
        assert proc.returncode == 0, proc.stderr[-2000:]
    monkeypatch.setenv("MSRL_LITE_RUNNER", str(lite_build.runner_path().with_name("msrl-lite-runner-test")))
    monkeypatch.setenv("MSRL_LITE_RUNNER_FAULT", "hang")
    monkeypatch.setattr(LiteRuntime, "timeout", 3.0)
    monkeypatch.chdir(pendulum)
    monkeypatch.syspath_prepend(str(pendulum))
    import policy

    options = VerifyOptions(observations=64, episodes=1, runtimes=("lite", "ms-mindir"))
    result = verify_policy(policy.make_policy(), None, bundle, checkpoint=pendulum / "policy.ckpt", options=options)
    lite = {c.name: c for c in result.checks if c.runtime == "lite"}
    assert lite["inference"].status == "error" and "timeout" in lite["inference"].summary
    assert lite["inference"].diagnosis["stage"] == "runtime" and "not judged" in lite["inference"].diagnosis["detail"]
    assert result.runtimes["ms-mindir"]["status"] == "ran" and result.exit_code == 3


def test_a_std_broadcast_with_ones_like_runs_in_lite(tmp_path, monkeypatch):
    """``std = exp(log_std) * ones_like(mean)``, both an output and an input of the action, hung Lite 2.0.0's
    Predict when the ONNX carried ``ones_like`` as a batch-1 constant; exported with a symbolic batch it runs."""
    from inference.compare.verifier import VerifyOptions
    from msrl_consistency.api import export_policy, verify_policy

    (tmp_path / "ones_like_std.py").write_text(ONES_LIKE_STD)
    monkeypatch.syspath_prepend(str(tmp_path))
    import ones_like_std

    contract = {
        "env_id": "Pendulum-v1", "input": {"obs": [3], "noise": [1], "noise_kind": "normal"},
        "outputs": {"names": ["action", "std"]},
        "action": {"kind": "deterministic", "action": "action", "squash": "clip", "low": [-2.0], "high": [2.0]},
    }  # fmt: skip
    bundle = export_policy(ones_like_std.Policy(), contract, tmp_path / "bundle")
    files = bundle.manifest["graphs"]["policy"]["files"]
    assert {f for f, e in files.items() if "file" in e} == {"mindir", "onnx", "ms"}
    options = VerifyOptions(observations=200, episodes=1, required=("lite", "onnxruntime"))
    result = verify_policy(ones_like_std.Policy(), None, bundle.root, options=options)
    assert result.exit_code == 0, result.console_table(only_failed=True)


ONES_LIKE_STD = """
import numpy as np
from mindspore import Parameter, Tensor, nn, ops


class Policy(nn.Cell):
    def __init__(self):
        super().__init__()
        self.fc = nn.Dense(3, 1, weight_init="ones", bias_init="zeros")
        self.log_std = Parameter(Tensor(np.zeros(1, np.float32)), name="log_std")

    def construct(self, obs, noise):
        mean = self.fc(obs)
        std = ops.exp(self.log_std) * ops.ones_like(mean)
        return mean + std * noise, std
"""
