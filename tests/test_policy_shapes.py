"""Policies as teams build them: a GRU carrying its state, a CNN on uint8 camera frames from a team's own env,
two action heads on a ``MultiDiscrete`` env, a ``Dict`` observation. Each exports a full bundle that verifies on
every runtime and fails against an injected fault; a contract that leaves a head or a key out is refused."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import foreign_envs as fe
import foreign_policies as fp
import numpy as np
import pytest
from byo_examples import EXAMPLES, example_module, trained_example
from cli_inprocess import run_module

from inference.bundle.contract import PolicyContract
from inference.compare.verifier import VerifyOptions
from inference.errors import UsageError
from msrl_consistency.api import export_policy, verify_policy

EVERY_RUNTIME = ("ms-graph", "ms-mindir", "lite", "onnxruntime")
SMALL = ["--observations", "1000", "--episodes", "3"]


def options(**kwargs) -> VerifyOptions:
    return VerifyOptions(**{"observations": 1000, "episodes": 3, "seed": 2, "required": EVERY_RUNTIME, **kwargs})


def stages(result) -> set[str]:
    return {c.diagnosis["stage"] for c in result.failed if c.diagnosis}


def cli(cwd: Path, module: str, *args: str) -> subprocess.CompletedProcess[str]:
    return run_module(module, *args, cwd=cwd)


# -- carried state: a GRU on CartPole-v1 ----------------------------------------------------------------------------
def exported_example(tmp_path_factory, name: str) -> Path:
    """The example trained briefly by its own script, then exported with the CLI into its ``bundle/``."""
    work = trained_example(tmp_path_factory, name, "--steps", "80")
    proc = cli(work, "msrl_consistency.export", "--cell", "policy:make_policy", "--ckpt", "policy.ckpt", "--contract",
               "contract.toml", "--out", "bundle")  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    return work


@pytest.fixture(scope="module")
def recurrent(tmp_path_factory) -> Path:
    return exported_example(tmp_path_factory, "recurrent")


@pytest.mark.slow
def test_a_gru_policy_verifies_with_its_state_threaded_through_every_runtime(recurrent):
    proc = cli(recurrent, "msrl_consistency.verify", "--bundle", "bundle", "--cell", "policy:make_policy", *SMALL,
               "--require", ",".join(EVERY_RUNTIME), "--out", "r")  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    report = json.loads((recurrent / "r" / "report.json").read_text())
    manifest = json.loads((recurrent / "bundle" / "manifest.json").read_text())["graphs"]["policy"]
    assert [i["name"] for i in manifest["inputs"]] == ["obs", "h"]
    assert {f for f, e in manifest["files"].items() if "file" in e} == {"mindir", "onnx", "ms"}
    teacher = [c for c in report["checks"] if c["name"].startswith("episodes.teacher_forced")]
    assert teacher and all("state" in c["metrics"] and c["metrics"]["state"]["first_divergent_step"] is None
                           for c in teacher)  # fmt: skip


def test_a_gru_whose_state_is_not_fed_back_fails_at_the_state(recurrent):
    policy = example_module(recurrent, "recurrent_policy")
    stuck = export_policy(policy.make_stuck_policy(), recurrent / "contract.toml", recurrent / "stuck",
                          checkpoint=recurrent / "policy.ckpt")  # fmt: skip
    result = _verify_in(recurrent, stuck.root, runtimes=("ms-mindir", "lite", "onnxruntime"), required=())
    assert result.exit_code == 1 and stages(result) == {"state"}, result.console_table()
    teacher = next(c for c in result.failed if c.name.startswith("episodes.teacher_forced"))
    assert teacher.metrics["state"]["first_divergent_step"] == 1 and "state h first leaves" in teacher.summary


def test_a_gru_with_a_nudged_weight_fails(recurrent, tmp_path):
    import mindspore as ms

    policy = example_module(recurrent, "recurrent_policy")
    cell = policy.make_policy()
    ms.load_checkpoint(str(recurrent / "policy.ckpt"), cell)
    nudged = export_policy(fp.nudge(cell, "gru.weight_ih", 0.05), recurrent / "contract.toml", tmp_path / "n")
    result = _verify_in(recurrent, nudged.root)
    assert result.exit_code == 1 and stages(result) == {"network"}, result.console_table()


def test_the_golden_file_and_play_carry_the_state_on_the_deploy_side(recurrent, tmp_path):
    from inference.compare.golden import load_golden, save_golden

    result = _verify_in(recurrent, recurrent / "bundle", runtimes=("ms-graph",), required=())
    save_golden(tmp_path / "g.npz", result.reference, result.bundle, result.inputs.get("env"))
    golden = load_golden(tmp_path / "g.npz", result.bundle)
    assert golden.feeds.state is not None and all(t.states is not None for t in golden.traces.values())
    deploy = "import sys; sys.modules['mindspore'] = None\nfrom inference.check import cli\ncli()"
    args = [str(recurrent / "bundle"), "--golden", str(tmp_path / "g.npz"), "--out", str(tmp_path / "r"), "--quiet"]
    proc = subprocess.run([sys.executable, "-c", deploy, *args], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    play = "import sys; sys.modules['mindspore'] = None\nfrom inference.play import main\nsys.exit(main(sys.argv[1:]))"
    seed = str(result.reference.seed)  # play's episode k is reset with seed + k, as verify's
    proc = subprocess.run([sys.executable, "-c", play, str(recurrent / "bundle"), "--episodes", "2", "--seed", seed],
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    assert proc.returncode == 0 and "mean return" in proc.stdout, proc.stderr[-2000:]
    played = [float(line.split("return ")[1].split()[0]) for line in proc.stdout.splitlines()
              if line.startswith("episode")]  # fmt: skip
    reference = result.reference.traces["deterministic"].returns[:2]
    assert played == pytest.approx(list(reference))  # the device's episodes, state carried, are the reference's


def _verify_in(work: Path, bundle: Path, **kwargs):
    policy = example_module(work, "recurrent_policy")
    return verify_policy(policy.make_policy(), None, bundle, checkpoint=work / "policy.ckpt", options=options(**kwargs))


# -- uint8 camera frames from a team's own env ----------------------------------------------------------------------
@pytest.fixture(scope="module")
def pixel(tmp_path_factory) -> Path:
    return exported_example(tmp_path_factory, "pixel")


@pytest.mark.slow
def test_a_cnn_on_uint8_frames_keeps_its_dtype_everywhere_and_verifies(pixel):
    import onnx

    manifest = json.loads((pixel / "bundle" / "manifest.json").read_text())["graphs"]["policy"]
    assert manifest["inputs"] == [{"name": "obs", "dtype": "uint8", "shape": [-1, 16, 16, 3]}]
    assert onnx.load(str(pixel / "bundle" / "policy.onnx")).graph.input[0].type.tensor_type.elem_type == 2  # uint8
    proc = cli(pixel, "msrl_consistency.verify", "--bundle", "bundle", "--cell", "policy:make_policy", "--env",
               "pixel_env:make_env", *SMALL, "--require", ",".join(EVERY_RUNTIME), "--out", "r")  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]


def test_uint8_feeds_are_integer_frames_with_black_and_white_and_no_nan(pixel):
    from inference.bundle import load_bundle
    from inference.compare.feeds import comparison_feeds

    bundle = load_bundle(pixel / "bundle")
    feeds = comparison_feeds(bundle, 500, 0, None, "episode", 17)
    assert feeds.obs.dtype == np.uint8 and feeds.finite.all() and "nan" not in set(feeds.source)
    frames = feeds.obs.reshape(len(feeds.obs), -1)
    assert (frames == 0).all(1).any() and (frames == 255).all(1).any()  # an all-black and an all-white frame
    assert frames.min() == 0 and frames.max() == 255


@pytest.mark.slow
def test_a_pixel_policy_nudged_or_fed_floats_fails(pixel, tmp_path):
    import mindspore as ms

    policy = example_module(pixel, "pixel_policy")
    cell = policy.make_policy()
    ms.load_checkpoint(str(pixel / "policy.ckpt"), cell)
    nudged = export_policy(fp.nudge(cell, "conv2.weight", 0.2), pixel / "contract.toml", tmp_path / "n")
    sys.path.insert(0, str(pixel))
    try:
        import pixel_env
    finally:
        sys.path.remove(str(pixel))
    result = verify_policy(policy.make_policy(), None, nudged.root, checkpoint=pixel / "policy.ckpt",
                           env=pixel_env.make_env, options=options())  # fmt: skip
    assert result.exit_code == 1 and stages(result) == {"network"}, result.console_table()


# -- several action heads, a Dict observation -----------------------------------------------------------------------
SHAPES = {  # the policy, its contract, its env, and a weight to nudge with the layer that must then be named
    "two heads on MultiDiscrete([2, 3])": (fp.make_two_head, fp.TWO_HEAD_CONTRACT, fe.make_two_head, "strength.weight",
                                           "strength"),
    "a Dict observation (vector + uint8 frame)": (fp.make_dict_policy, fp.DICT_CONTRACT, fe.make_dict, "vec.weight",
                                                  "vec"),
}  # fmt: skip


@pytest.mark.slow
@pytest.mark.parametrize("case", list(SHAPES))
def test_heads_and_dict_observations_verify_everywhere_and_fail_when_nudged(tmp_path, case):
    make, contract, env, weight, layer = SHAPES[case]
    bundle = export_policy(make(), contract, tmp_path / "b")
    files = bundle.manifest["graphs"]["policy"]["files"]
    assert {f for f, e in files.items() if "file" in e} == {"mindir", "onnx", "ms"}
    result = verify_policy(make(), None, bundle.root, env=env, options=options())
    assert result.exit_code == 0, result.console_table(only_failed=True)
    nudged = export_policy(fp.nudge(make(), weight, 0.3), contract, tmp_path / "n")
    result = verify_policy(make(), None, nudged.root, env=env, options=options())
    assert result.exit_code == 1 and stages(result) == {"network"}, result.console_table()
    for name in ("ms-mindir", "lite", "onnxruntime"):  # the nudged layer, and no layer before it
        loc = result.localizations[name]
        before = loc.layers[: [r.scope for r in loc.layers].index(layer)]
        assert loc.first == layer and all(r.status == "pass" for r in before), loc.line()


@pytest.mark.slow
@pytest.mark.parametrize("case", ["gru", "old-style actor", *SHAPES])
def test_every_shape_exports_in_fp16_and_verifies_under_the_fp16_preset(tmp_path, case):
    """Half precision casts every float input but the noise (the carried state too), keeps a single output a
    single output, gives a recurrent cell fp16 weights (it multiplies its raw weights), and the Cell's own
    Parameters when its ``construct`` combines them with layer outputs in a one-dtype op (``BiasAdd``)."""
    from msrl_consistency.artifacts.bundle import ExportOptions

    if case == "gru":
        make, contract, env = (
            example_module(EXAMPLES / "recurrent", "recurrent_fp16").make_policy,
            PolicyContract.from_toml(EXAMPLES / "recurrent" / "contract.toml"),
            None,
        )
    elif case == "old-style actor":
        make, contract, env = fp.make_old_style, fp.OLD_STYLE_CONTRACT, None
    else:
        make, contract, env, _, _ = SHAPES[case]
    bundle = export_policy(make(), contract, tmp_path / "b", options=ExportOptions(precision="fp16"))
    assert bundle.precision == "fp16"
    fp16_runtimes = ("ms-graph", "ms-mindir", "lite")  # no ONNX graph in fp16 (MindSpore 2.10 writes an invalid one)
    result = verify_policy(make(), None, bundle.root, env=env, options=options(required=fp16_runtimes))
    assert result.exit_code == 0, result.console_table(only_failed=True)


def test_a_cell_that_cannot_compute_in_fp16_is_refused_in_one_line(tmp_path):
    import mindspore as ms
    from mindspore import Parameter, nn, ops

    def matmul(x, w):
        return ops.MatMul(False, True)(x, w)

    class RawMatMul(nn.Cell):  # hands its float32 weight to a function, as GRUCell does: no cast reaches it
        def __init__(self) -> None:
            super().__init__()
            self.w = Parameter(ms.Tensor(np.ones((2, 4), np.float32)), name="w")

        def construct(self, x):
            return matmul(x, self.w)

    class Policy(nn.Cell):
        def __init__(self) -> None:
            super().__init__()
            self.layer = RawMatMul()

        def construct(self, obs):
            return self.layer(obs)

    from msrl_consistency.artifacts.bundle import ExportOptions

    contract = {"env_id": "CartPole-v1", "input": {"obs": [4]}, "outputs": {"names": ["logits"]},
                "action": {"kind": "argmax", "values": "logits"}}  # fmt: skip
    with pytest.raises(UsageError, match=r"^--precision fp16: the Cell does not run with its layers in fp16 \(") as e:
        export_policy(Policy(), contract, tmp_path / "b", options=ExportOptions(precision="fp16"))
    assert "\n" not in str(e.value) and not (tmp_path / "b").exists()


def test_a_contract_that_leaves_a_head_or_a_key_out_is_refused(tmp_path):
    import mindspore as ms
    from mindspore import nn

    one_head = {**fp.TWO_HEAD_CONTRACT, "action": {"kind": "categorical", "logits": "direction"}}
    bundle = export_policy(fp.make_two_head(), one_head, tmp_path / "heads")
    with pytest.raises(UsageError, match=r"MultiDiscrete\(\[2 3\]\), 2 heads; the contract's categorical action "
                       "has 1 head") as info:  # fmt: skip
        verify_policy(fp.make_two_head(), None, bundle.root, env=fe.make_two_head, options=options(required=()))
    assert "\n" not in str(info.value)
    ms.set_seed(0)
    vector_only = nn.Dense(4, 2)  # a Cell that reads the vector and ignores the camera
    contract = {"input": {"obs": {"vec": [4]}}, "outputs": {"names": ["logits"]},
                "action": {"kind": "categorical", "logits": "logits"}}  # fmt: skip
    bundle = export_policy(vector_only, contract, tmp_path / "keys")
    with pytest.raises(UsageError, match=r"the contract leaves out \['img'\]") as info:
        verify_policy(vector_only, None, bundle.root, env=fe.make_dict, options=options(required=()))
    assert "\n" not in str(info.value)


def test_every_new_contract_key_parses_and_round_trips():
    examples = [PolicyContract.from_toml(EXAMPLES / name / "contract.toml") for name in ("recurrent", "pixel")]
    examples += [PolicyContract.from_dict(c) for c in (fp.TWO_HEAD_CONTRACT, fp.DICT_CONTRACT)]
    recurrent, pixel, heads, dict_obs = examples
    assert recurrent.states[0].name == "h" and recurrent.states[0].next == "h_next"
    assert [m.name for m in recurrent.input_metas()] == ["obs", "h"]
    assert pixel.observations[0].dtype == "uint8" and heads.action.heads == ("direction", "strength")
    assert dict_obs.obs_dict and [f.name for f in dict_obs.observations] == ["vec", "img"]
    for contract in examples:
        assert PolicyContract.from_dict(contract.to_dict()) == contract


@pytest.mark.slow
def test_recorded_observations_may_carry_the_state_columns(recurrent, tmp_path):
    """A team's recording of its device: observations and the hidden state it had at each one."""
    result = _verify_in(recurrent, recurrent / "bundle", runtimes=("ms-graph",), required=())
    trace = result.reference.traces["deterministic"]
    obs, state = trace.obs[trace.alive], trace.states[trace.alive]
    np.savez(tmp_path / "rec.npz", obs=obs, h=state["h"])
    policy = example_module(recurrent, "recurrent_policy")
    only_lite = options(runtimes=("lite",), required=())
    recorded = verify_policy(policy.make_policy(), None, recurrent / "bundle", checkpoint=recurrent / "policy.ckpt",
                             observations=tmp_path / "rec.npz", options=only_lite)  # fmt: skip
    assert recorded.exit_code == 0, recorded.console_table(only_failed=True)
    feeds = recorded.reference.feeds
    rows = feeds.source == "recorded"
    assert rows.sum() == min(len(obs), 1000) and feeds.state is not None
    assert not np.allclose(feeds.state["h"][rows], 0.0)  # the recorded states, not the init


def test_a_runtime_whose_model_would_cast_an_input_is_a_finding(pixel, tmp_path):
    """The .onnx swapped for one that takes float32 frames: ONNX Runtime would cast the camera's bytes."""
    import onnx

    from inference.bundle import sha256_file

    copy = tmp_path / "b"
    shutil.copytree(pixel / "bundle", copy)
    model = onnx.load(str(copy / "policy.onnx"))
    model.graph.input[0].type.tensor_type.elem_type = onnx.TensorProto.FLOAT
    cast = next(n for n in model.graph.node if n.op_type == "Cast")
    cast.attribute[0].i = onnx.TensorProto.FLOAT
    onnx.save(model, str(copy / "policy.onnx"))
    manifest = json.loads((copy / "manifest.json").read_text())
    manifest["graphs"]["policy"]["files"]["onnx"]["sha256"] = sha256_file(copy / "policy.onnx")
    (copy / "manifest.json").write_text(json.dumps(manifest))
    policy = example_module(pixel, "pixel_policy")
    result = verify_policy(policy.make_policy(), None, copy, checkpoint=pixel / "policy.ckpt",
                           observations=np.zeros((20, 16, 16, 3), np.uint8),
                           options=options(runtimes=("onnxruntime",), required=()))  # fmt: skip
    check = next(c for c in result.failed if c.runtime == "onnxruntime")
    assert check.name == "input_dtypes" and "obs float32 (contract: uint8)" in check.summary


@pytest.mark.slow
def test_a_golden_file_recorded_on_a_teams_own_env_is_checked_on_the_device(tmp_path):
    """verify_policy with an env constructor records it as MODULE:FACTORY: the device's inference.check runs it when
    the command line names it (``--env``), and never from the golden file alone (exit 2, one line saying how)."""
    from inference.compare.golden import save_golden

    bundle = export_policy(fp.make_dict_policy(), fp.DICT_CONTRACT, tmp_path / "b")
    result = verify_policy(fp.make_dict_policy(), None, bundle.root, env=fe.make_dict,
                           options=options(required=(), runtimes=("ms-graph",)))  # fmt: skip
    assert result.inputs["env"] == "foreign_envs:make_dict"
    save_golden(tmp_path / "g.npz", result.reference, result.bundle, result.inputs["env"])
    code = "import sys; sys.modules['mindspore'] = None\nfrom inference.check import cli\ncli()"
    golden = ["--golden", str(tmp_path / "g.npz"), "--out", str(tmp_path / "r")]
    args = [sys.executable, "-c", code, str(bundle.root), *golden]
    env = {**os.environ, "PYTHONPATH": str(Path(fe.__file__).parent)}
    proc = subprocess.run([*args, "--env", "foreign_envs:make_dict"], capture_output=True, text=True, timeout=300,
                          env=env)  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    proc = subprocess.run(args, capture_output=True, text=True, timeout=300, env=env)  # importable, yet not named
    last = proc.stderr.strip().splitlines()[-1]
    assert proc.returncode == 2 and last.startswith("error: ") and "Traceback" not in proc.stderr, proc.stderr
    assert "a golden file never runs code, pass --env foreign_envs:make_dict" in last
