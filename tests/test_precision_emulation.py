"""``emulated-fp16``: the bundle's graph with every operator's inputs, weights and outputs rounded to fp16 (matrix
products accumulated in fp32), against MindSpore's own fp16 Cell; and a policy that fp16 breaks in one layer (a
LayerNorm whose squares overflow fp16), which ``verify --emulate fp16`` fails naming that layer and whose fp16 plan
keeps it and verifies."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import numpy as np
import onnx
import pytest
from cli_inprocess import run_module
from onnx import TensorProto, helper, numpy_helper

from inference.runtimes.fp16_emulation import emulate_fp16, session

HERE = Path(__file__).resolve().parent


def _graph(nodes, inits, out_dim=2):
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", out_dim])],
                          [numpy_helper.from_array(v, k) for k, v in inits.items()])  # fmt: skip
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def _fp16_exact(a: np.ndarray) -> bool:
    return bool(np.array_equal(a, a.astype(np.float16).astype(np.float32)))


def test_every_operator_output_is_an_fp16_value_and_a_kept_node_is_not_rounded():
    rng = np.random.default_rng(0)
    w1, w2 = rng.standard_normal((4, 16)).astype(np.float32), rng.standard_normal((16, 2)).astype(np.float32)
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["h"], name="mm1"),
        helper.make_node("Tanh", ["h"], ["t"], name="act"),
        helper.make_node("MatMul", ["t", "w2"], ["y"], name="mm2"),
    ]
    model = _graph(nodes, {"w1": w1, "w2": w2})
    x = (rng.standard_normal((64, 4)) * 3).astype(np.float32)
    y = session(emulate_fp16(model)).run(["y"], {"x": x})[0]
    h16 = x.astype(np.float16).astype(np.float32) @ w1.astype(np.float16).astype(np.float32)
    t16 = np.tanh(h16.astype(np.float16).astype(np.float32)).astype(np.float16).astype(np.float32)
    want = (t16 @ w2.astype(np.float16).astype(np.float32)).astype(np.float16).astype(np.float32)
    assert _fp16_exact(y) and np.abs(y - want).max() <= 2 * np.spacing(np.float16(np.abs(want).max()))
    kept = session(emulate_fp16(model, keep=["mm2"])).run(["y"], {"x": x})[0]
    assert not _fp16_exact(kept)  # mm2 computes in fp32 on its fp16 inputs: its output is not rounded
    exact = session(emulate_fp16(model, keep=["mm1", "act", "mm2"])).run(["y"], {"x": x})[0]
    assert np.allclose(exact, np.tanh(x @ w1) @ w2, rtol=1e-5, atol=1e-5)


def test_a_fused_layernorm_is_emulated_step_by_step_so_its_squares_overflow():
    gamma, beta = np.ones(4, np.float32), np.zeros(4, np.float32)
    nodes = [helper.make_node("LayerNormalization", ["x", "g", "b"], ["y"], axis=-1, epsilon=1e-5, name="ln")]
    model = _graph(nodes, {"g": gamma, "b": beta}, out_dim=4)
    small = np.array([[1.0, 2.0, 3.0, 4.0]], np.float32)
    big = small * 300  # centred values ~±450: their squares (~2e5) overflow fp16
    run = session(emulate_fp16(model))
    assert np.allclose(run.run(["y"], {"x": small})[0], (small - 2.5) / small.std(), atol=5e-3)
    assert not np.allclose(run.run(["y"], {"x": big})[0], (small - 2.5) / small.std(), atol=0.1)
    kept = session(emulate_fp16(model, keep=["ln"]))  # the LayerNorm's every step stays in fp32
    assert np.allclose(kept.run(["y"], {"x": big})[0], (small - 2.5) / small.std(), atol=5e-3)


def test_the_emulation_agrees_with_mindspores_fp16_cell(cartpole_bundle, cartpole_ckpt):
    """Measured on the policy graph (trained CartPole 50k steps: logits of magnitude 5.4): the emulation is within
    1 fp16 ULP of MindSpore's fp16 Cell (3.9e-3), where the float32 graph differs from it by 1.0e-2; same actions.
    Here on the suite's briefly trained policy: within 2 ULP of the output's magnitude, and closer than fp32."""
    from mindspore import Tensor

    from inference.compare.feeds import seeded_feeds
    from msrl_consistency import compat
    from msrl_consistency.agent import PolicySpec
    from msrl_consistency.artifacts.checkpoint import load_policy
    from msrl_consistency.artifacts.graphs import export_heads

    bundle, graph = cartpole_bundle, "policy"
    feeds = seeded_feeds(bundle, 2000, 0)
    inputs = [x[feeds.finite & feeds.ordinary] for x in feeds.graph_inputs(bundle, graph)]
    spec = PolicySpec.from_dict(bundle.policy_spec)
    outputs = {}
    for precision in ("fp16", "fp32"):
        cell = export_heads(load_policy(cartpole_ckpt, spec), precision)[graph]
        cell.set_train(False)
        with compat.execution_mode(graph=False):
            outputs[precision] = [o.asnumpy() for o in compat.as_tuple(cell(*[Tensor(x) for x in inputs]))]
    run = session(emulate_fp16(onnx.load(str(bundle.file(graph, "onnx")))))
    emulated = run.run(None, dict(zip([i.name for i in run.get_inputs()], inputs, strict=True)))
    actions, logits = 0, 1
    ms16, fp32, emu = outputs["fp16"][logits], outputs["fp32"][logits], emulated[logits]
    ulp = float(np.spacing(np.float16(np.abs(fp32).max())))
    assert np.abs(emu - ms16).max() <= 2 * ulp, (np.abs(emu - ms16).max(), ulp)
    assert np.abs(emu - ms16).max() < np.abs(fp32 - ms16).max()
    assert (emulated[actions] == outputs["fp16"][actions]).mean() >= 0.999


# -- a layer fp16 breaks ---------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def team(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("layernorm")
    shutil.copy(HERE / "precision_policies.py", path)
    from precision_policies import LAYERNORM_CONTRACT, make_layernorm

    from msrl_consistency.api import export_policy
    from msrl_consistency.artifacts.bundle import ExportOptions

    # MindIR and ONNX: the fp16 emulation runs the ONNX graph (Lite 2.0.0's fused LayerNorm kernel itself differs
    # from the Cell by ~1.7 on inputs this large in fp32, a matter of Lite's kernel, not of this test)
    export_policy(
        make_layernorm(), LAYERNORM_CONTRACT, path / "bundle", options=ExportOptions(formats=("mindir", "onnx"))
    )
    return path


def cli(cwd: Path, module: str, *args: str) -> subprocess.CompletedProcess[str]:
    return run_module(module, *args, cwd=cwd, timeout=900)


@pytest.mark.slow
def test_all_fp16_fails_naming_the_layernorm_and_the_fp16_plan_keeps_it_and_verifies(team):
    small = ["--observations", "1000", "--episodes", "3"]
    proc = cli(team, "msrl_consistency.verify", "--bundle", "bundle", "--cell", "precision_policies:make_layernorm",
               "--emulate", "fp16", "--out", "all-fp16", *small)  # fmt: skip
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-2000:]
    report = json.loads((team / "all-fp16" / "report.json").read_text())
    status = {c["name"]: c["status"] for c in report["checks"] if c["runtime"] == "emulated-fp16"}
    assert status["observations.policy"] == "fail" and status["policy.policy"] == "warn"  # fp16: a warning there
    assert report["localization"]["emulated-fp16"]["first_diverging_layer"] == "norm"
    assert "emulation" in report["runtimes"]["emulated-fp16"]["precision"]["why"]
    assert "first diverging layer: norm" in proc.stdout
    assert not any(c["status"] == "fail" for c in report["checks"] if c["runtime"] != "emulated-fp16")

    proc = cli(team, "msrl_consistency.precision", "--bundle", "bundle", "--cell", "precision_policies:make_layernorm",
               "--lower", "fp16", "--out", "plan", "--observations", "3000", "--episodes", "3")  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    manifest = json.loads((team / "plan" / "manifest.json").read_text())
    assert manifest["plan"]["kept"] == ["norm"] and manifest["target"]["computes_in"] == "fp16"
    assert not manifest["plan"]["all_lowered"]["ok"] and manifest["plan"]["final"]["ok"]
    assert "norm" in (team / "plan" / "plan.md").read_text()

    proc = cli(team, "msrl_consistency.verify", "--bundle", "plan", "--cell", "precision_policies:make_layernorm",
               "--out", "plan-report", "--observations", "3000", "--episodes", "3")  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    report = json.loads((team / "plan-report" / "report.json").read_text())
    assert report["runtimes"]["emulated-fp16"]["status"] == "ran"  # the plan's fp16 judged on the emulation
    assert report["runtimes"]["emulated-fp16"]["precision"]["judged_as"] == "fp16"  # the verifier's preset
    assert "norm" in report["runtimes"]["emulated-fp16"]["precision"]["why"]


@pytest.mark.slow
def test_a_sensor_policys_unit_norm_fp16_overflows_is_named_and_kept_by_a_plan_verify_passes(tmp_path):
    """A parameter-free unit norm over raw readings (sums of squares beyond fp16's range) on a Gaussian head whose std
    is one Parameter (shape [1]): only the fp16 runtime fails, so the stage is precision; the plan search judges its
    candidates as verify does, so its plan verifies 0 and its all-fp16 candidate fails as verify fails it."""
    shutil.copy(HERE / "precision_policies.py", tmp_path)
    from precision_policies import SENSOR_CONTRACT, make_sensor

    from msrl_consistency.api import export_policy
    from msrl_consistency.artifacts.bundle import ExportOptions

    export_policy(
        make_sensor(), SENSOR_CONTRACT, tmp_path / "bundle", options=ExportOptions(formats=("mindir", "onnx"))
    )
    judge = ["--cell", "precision_policies:make_sensor", "--observations", "1000", "--episodes", "3"]
    proc = cli(tmp_path, "msrl_consistency.verify", "--bundle", "bundle", "--emulate", "fp16", "--out", "all", *judge)
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-2000:]
    report = json.loads((tmp_path / "all" / "report.json").read_text())
    failed = [c for c in report["checks"] if c["status"] == "fail"]
    assert failed and all(c["runtime"] == "emulated-fp16" for c in failed)
    assert all(c["diagnosis"]["stage"] == "precision" for c in failed), [c["diagnosis"] for c in failed]
    assert "only the fp16 runtime differs" in failed[0]["diagnosis"]["detail"]
    assert "first diverging layer: unitnorm (UnitNorm)" in failed[0]["diagnosis"]["detail"]  # matched by its values
    assert report["localization"]["emulated-fp16"]["first_diverging_layer"] == "unitnorm"
    assert report["options"]["judged_as"] == {"emulated-fp16": "fp16"}

    proc = cli(tmp_path, "msrl_consistency.precision", "--bundle", "bundle", "--lower", "fp16", "--out", "plan", *judge)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    plan = json.loads((tmp_path / "plan" / "manifest.json").read_text())["plan"]
    assert plan["kept"] == ["unitnorm"] and not plan["all_lowered"]["ok"] and plan["final"]["ok"]
    proc = cli(tmp_path, "msrl_consistency.verify", "--bundle", "plan", "--out", "plan-report", *judge)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]  # accepted by the search: verify passes

    # Exported for a 310 in fp16: export warns naming the layer and the plan command, doctor shows it
    (tmp_path / "sensor.toml").write_text('env_id = "Pendulum-v1"\n[input]\nobs = [3]\n[outputs]\nnames = ["mean", '
                                          '"std"]\n[action]\nkind = "gaussian"\nmean = "mean"\nstd = "std"\n'
                                          'squash = "clip"\nlow = [-2.0]\nhigh = [2.0]\n')  # fmt: skip
    proc = cli(tmp_path, "msrl_consistency.export", "--cell", "precision_policies:make_sensor", "--contract",
               "sensor.toml", "--out", "b310", "--target", "ascend310", "--precision-mode", "enforce_fp16",
               "--formats", "mindir,onnx")  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    warning = [line for line in proc.stderr.splitlines() if line.startswith("warning: target ascend310")]
    assert warning and "unitnorm" in warning[0] and "msrl_consistency.precision" in warning[0], proc.stderr[-2000:]
    doctor = cli(tmp_path, "inference.doctor", "b310", "--json")
    rows = {row["name"]: row for row in json.loads(doctor.stdout)["checks"]}
    assert rows["precision"]["status"] == "warn" and "unitnorm" in rows["precision"]["detail"]
    ok = cli(tmp_path, "msrl_consistency.export", "--cell", "precision_policies:make_sensor", "--contract",
             "sensor.toml", "--out", "b310-origin", "--target", "ascend310", "--precision-mode", "enforce_origin",
             "--formats", "mindir,onnx")  # fmt: skip
    assert ok.returncode == 0 and "warning" not in ok.stderr, ok.stderr[-2000:]  # computes in fp32: no emulation

    proc = cli(tmp_path, "msrl_consistency.precision", "--bundle", "bundle", "--lower", "fp16", "--out", "none",
               "--keep", "none", *judge)  # fmt: skip
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-2000:]  # every layer in fp16: the search rejects
    proc = cli(tmp_path, "msrl_consistency.verify", "--bundle", "none", "--out", "none-report", *judge)
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-2000:]  # ... and verify fails it


@pytest.mark.slow
def test_a_policy_without_weights_has_nothing_to_lower_in_int8(tmp_path):
    shutil.copy(HERE / "precision_policies.py", tmp_path)
    from precision_policies import LAYERNORM_CONTRACT, make_no_dense

    from msrl_consistency.api import export_policy
    from msrl_consistency.artifacts.bundle import ExportOptions

    export_policy(make_no_dense(), LAYERNORM_CONTRACT, tmp_path / "bundle", options=ExportOptions())
    proc = cli(tmp_path, "msrl_consistency.precision", "--bundle", "bundle", "--cell",
               "precision_policies:make_no_dense", "--lower", "int8", "--out", "plan", "--observations", "200",
               "--episodes", "1")  # fmt: skip
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "nothing to lower" in proc.stderr and not (tmp_path / "plan").exists()
