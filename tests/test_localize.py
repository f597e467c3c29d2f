"""Point at the layer: a fault injected at a known layer is named by every runtime that carries it, no earlier layer
is, and the deploy side names it from a golden file's recorded layers."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import numpy as np
import pytest
from foreign_policies import FRAME_CONTRACT, make_frame_cnn, nudge

from inference.bundle import load_bundle, sha256_file
from inference.compare.verifier import VerifyOptions
from inference.report.writers import write_reports
from msrl_consistency.api import export_policy, export_run, verify_policy, verify_run
from msrl_consistency.artifacts.bundle import ExportOptions

RUNTIMES = ("ms-mindir", "onnxruntime", "lite")
FAST = dict(observations=400, episodes=1, seed=3)


def scaled_export(ckpt, out, part: str, index: int = 2, **options):
    """The checkpoint's policy with one hidden layer's weight scaled by 1.5, exported to every format."""
    from msrl_consistency.agent import PolicySpec
    from msrl_consistency.artifacts import run_dir as rd
    from msrl_consistency.artifacts.checkpoint import load_policy

    policy = load_policy(ckpt, PolicySpec.from_dict(rd.read_run_json(ckpt.parent)["policy_spec"]))
    weight = getattr(policy, part).layers[index].weight
    weight.set_data(type(weight.value())(weight.asnumpy() * 1.5))
    return export_run(ckpt, out, ExportOptions(**options), policy=policy)


def assert_named(loc, scope: str) -> None:
    """``scope`` is the first diverging layer, and layers before it were compared and agree."""
    assert loc.first == scope, (loc.line(), [(r.scope, r.status, r.max_abs) for r in loc.layers])
    before = loc.layers[: [r.scope for r in loc.layers].index(scope)]
    assert any(r.status == "pass" for r in before) and not any(r.status == "fail" for r in before)


@pytest.mark.slow
@pytest.mark.parametrize("part", ["actor", "critic"])
def test_a_scaled_hidden_layer_is_named_by_every_runtime(cartpole_ckpt, tmp_path, part):
    bundle = scaled_export(cartpole_ckpt, tmp_path / "bundle", part)
    result = verify_run(bundle, cartpole_ckpt, VerifyOptions(**FAST, runtimes=RUNTIMES))
    assert result.exit_code == 1
    assert set(result.localizations) == set(RUNTIMES), result.console_table(only_failed=True)
    for name in RUNTIMES:
        assert_named(result.localizations[name], f"{part}.layers.2")
    assert result.localizations["ms-mindir"].method.startswith("parameters")
    paths = write_reports(result, tmp_path / "report")
    report = json.loads(paths["json"].read_text())
    assert report["localization"]["lite"]["first_diverging_layer"] == f"{part}.layers.2"
    md = paths["md"].read_text()
    assert f"onnxruntime: first diverging layer: {part}.layers.2 (Dense)" in md and "## Where it diverges" in md
    assert paths["layers"].stat().st_size > 1000
    assert f"lite: first diverging layer: {part}.layers.2" in result.console_table()


@pytest.mark.slow
def test_a_passing_verify_and_no_localize_localize_nothing(cartpole_bundle, cartpole_ckpt, tmp_path):
    result = verify_run(cartpole_bundle, cartpole_ckpt, VerifyOptions(**FAST, runtimes=RUNTIMES))
    assert result.exit_code == 0 and result.localizations == {}
    bundle = scaled_export(cartpole_ckpt, tmp_path / "bundle", "actor", formats=("mindir",))
    result = verify_run(bundle, cartpole_ckpt, VerifyOptions(**FAST, runtimes=("ms-mindir",), localize="never"))
    assert result.exit_code == 1 and result.localizations == {}


def replace_first(bundle_root, graph_file: str, op: str, by: str) -> None:
    """Edit an ONNX graph of a bundle (the first ``op`` node becomes ``by``) and record its new hash, as a broken
    conversion tool would leave it."""
    import onnx

    path = bundle_root / graph_file
    model = onnx.load(str(path))
    next(n for n in model.graph.node if n.op_type == op).op_type = by
    onnx.save(model, str(path))
    manifest = json.loads((bundle_root / "manifest.json").read_text())
    for graph in manifest["graphs"].values():
        for entry in graph["files"].values():
            if entry.get("file") == graph_file:
                entry["sha256"] = sha256_file(path)
    (bundle_root / "manifest.json").write_text(json.dumps(manifest, indent=1))


def test_an_activation_replaced_in_onnx_is_named_by_onnx_runtime_only(cartpole_bundle, cartpole_ckpt, tmp_path):
    root = tmp_path / "bundle"
    shutil.copytree(cartpole_bundle.root, root)
    replace_first(root, "policy.onnx", "Tanh", "Relu")
    result = verify_run(load_bundle(root), cartpole_ckpt, VerifyOptions(**FAST, runtimes=RUNTIMES))
    assert result.exit_code == 1
    assert {c.runtime for c in result.failed} == {"onnxruntime"}, result.console_table(only_failed=True)
    assert set(result.localizations) == {"onnxruntime"}
    assert_named(result.localizations["onnxruntime"], "actor.layers.1")


def test_a_changed_weight_in_a_cnns_second_convolution_is_named(tmp_path):
    bundle = export_policy(nudge(make_frame_cnn(), "conv2.weight", 0.5), FRAME_CONTRACT, tmp_path / "bundle")
    frames = np.random.default_rng(0).integers(0, 256, (64, 8, 8, 3)).astype(np.float32)
    result = verify_policy(make_frame_cnn(), None, bundle.root, observations=frames,
                           options=VerifyOptions(**FAST, runtimes=RUNTIMES))  # fmt: skip
    assert result.exit_code == 1
    for name in RUNTIMES:
        assert_named(result.localizations[name], "conv2")
    lite = result.localizations["lite"]  # Lite fuses each convolution with its ReLU: compared at the fused output
    assert "fused with Relu" in next(r for r in lite.layers if r.scope == "conv2").note


@pytest.mark.slow
@pytest.mark.parametrize(("fault", "named"), [("gru.weight_ih", "gru"), ("head.weight", "head")])
def test_a_fault_in_a_recurrent_policy_is_named_at_its_layer(tmp_path, fault, named):
    """A GRUCell exports as two Gemms and gate arithmetic the exporter leaves unnamed; its output is the carried
    state (``h_next``), not a gate's, in every runtime."""
    from byo_examples import EXAMPLES, example_module

    from inference.bundle.contract import PolicyContract

    make_policy = example_module(EXAMPLES / "recurrent", "localize_recurrent_policy").make_policy
    contract = PolicyContract.from_toml(EXAMPLES / "recurrent" / "contract.toml")
    bundle = export_policy(nudge(make_policy(), fault, 0.5), contract, tmp_path / "bundle")
    result = verify_policy(make_policy(), None, bundle.root, options=VerifyOptions(**FAST, runtimes=RUNTIMES))
    assert result.exit_code == 1
    for name in RUNTIMES:
        loc = result.localizations[name]
        assert loc.first == named, loc.line()
        if named == "head":
            assert next(r for r in loc.layers if r.scope == "gru").status == "pass", loc.line()


def test_a_layer_that_could_not_be_compared_before_the_first_diverging_one_is_said():
    from inference.compare.judge.localize import IDENTITY_IN_EVAL_NOTE, LayerComparison, conclude

    rows = [LayerComparison("drop", "Dropout", "unmatched", note=IDENTITY_IN_EVAL_NOTE),
            LayerComparison("gru", "GRUCell", "unmatched", note="no output 'x' here"),
            LayerComparison("head", "Dense", "fail", 0.9, 0.2, 3.0)]  # fmt: skip
    loc = conclude("lite", rows, rows[2])
    assert loc.first == "head"
    assert loc.line().endswith("; gru before it could not be compared here, so the divergence may start there")


def test_the_library_entry_point_returns_the_per_layer_comparison(tmp_path):
    import msrl_consistency

    bundle = export_policy(nudge(make_frame_cnn(), "conv2.weight", 0.5), FRAME_CONTRACT, tmp_path / "bundle")
    frames = np.random.default_rng(0).integers(0, 256, (4, 8, 8, 3)).astype(np.float32)
    loc = msrl_consistency.localize(make_frame_cnn(), "onnxruntime", [frames], bundle)
    assert_named(loc, "conv2")
    assert [r.scope for r in loc.layers][:2] == ["conv1", "conv2"] and loc.to_dict()["first_diverging_layer"] == "conv2"


def test_the_deploy_side_names_the_layer_from_a_golden_file(cartpole_bundle, cartpole_ckpt, tmp_path):
    from msrl_consistency.verify import main as verify_main

    golden = tmp_path / "golden.npz"
    faulty = scaled_export(cartpole_ckpt, tmp_path / "faulty", "actor")
    # The training box records the training path's answers for the very bundle the device holds (a golden file
    # checks only against its own bundle), here one whose graphs do not compute what the Cell does.
    code = verify_main(["--bundle", str(faulty.root), "--ckpt", str(cartpole_ckpt), "--runtimes", "onnxruntime",
                        "--observations", "400", "--episodes", "1", "--save-golden", str(golden), "--golden-layers",
                        "--out", str(tmp_path / "r0"), "--quiet"])  # fmt: skip
    assert code == 1 and golden.is_file()
    script = (
        "import sys; sys.modules['mindspore'] = None\n"
        "from inference.check import main\n"
        f"sys.exit(main([{str(faulty.root)!r}, '--golden', {str(golden)!r}, '--runtimes', 'onnxruntime,lite', "
        f"'--out', {str(tmp_path / 'r')!r}]))"
    )
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1, proc.stderr[-2000:] + proc.stdout[-2000:]
    for name in ("onnxruntime", "lite"):
        assert f"{name}: first diverging layer: actor.layers.2 (Dense)" in proc.stdout, proc.stdout[-3000:]
    report = json.loads((tmp_path / "r" / "report.json").read_text())
    assert report["localization"]["lite"]["first_diverging_layer"] == "actor.layers.2"


@pytest.mark.slow
def test_an_fp16_report_shows_where_the_error_grows(cartpole_ckpt, tmp_path):
    bundle = export_run(cartpole_ckpt, tmp_path / "fp16", ExportOptions(precision="fp16", formats=("mindir", "ms")))
    result = verify_run(bundle, cartpole_ckpt, VerifyOptions(**FAST, runtimes=("lite",)))
    assert result.exit_code == 0, result.console_table(only_failed=True)
    lite = result.localizations["lite"]
    errors = [r.max_abs for r in lite.layers if r.max_abs is not None]
    assert lite.first is None and len(errors) >= 5 and max(errors) > 1e-4  # fp16 rounding, within its tolerance
    assert "the error appears at normalizer" in lite.message
    paths = write_reports(result, tmp_path / "report")
    assert "lite: every one of the" in paths["md"].read_text() and paths["layers"].is_file()


# -- every layer, and nothing claimed that was not compared --------------------------------------------------------
def test_dense_layers_with_an_activation_inside_nested_sequential_cells_are_named(tmp_path):
    """A Dreamer-style ``FullyConnectedLayers`` (a SequentialCell of ``nn.Dense(..., activation=...)`` sharing one
    activation) inside an actor: each Dense is a layer at its depth, compared after its activation, in every
    runtime; ms-mindir's parameters name it instead of claiming every layer's weights equal the Cell's."""
    import shaped_policies as sp

    bundle = export_policy(nudge(sp.make_dreamer_style(), "fc.fc_layers.1.weight", 0.5), sp.DREAMER_CONTRACT,
                           tmp_path / "bundle")  # fmt: skip
    result = verify_policy(sp.make_dreamer_style(), None, bundle.root, options=VerifyOptions(**FAST, runtimes=RUNTIMES))
    assert result.exit_code == 1
    for name in RUNTIMES:
        assert_named(result.localizations[name], "fc.fc_layers.1")
    scopes = [r.scope for r in result.localizations["ms-mindir"].layers]
    assert scopes == ["fc.fc_layers.0", "fc.fc_layers.1", "fc.fc_layers.2", "squeeze", "fc_out"], scopes


def test_a_consistent_lstm_bundle_has_no_diverging_layer(tmp_path):
    """An LSTMCell's output is the ``h`` that leaves it (``h = o * tanh(c)``), not the ``c`` computed before it."""
    import shaped_policies as sp

    bundle = export_policy(sp.make_lstm(), sp.LSTM_CONTRACT, tmp_path / "bundle")
    options = VerifyOptions(**FAST, runtimes=RUNTIMES, localize="always")
    result = verify_policy(sp.make_lstm(), None, bundle.root, options=options)
    assert result.exit_code == 0, result.console_table(only_failed=True)
    for name in RUNTIMES:
        loc = result.localizations[name]
        assert loc.first is None, loc.line()
        if name != "ms-mindir":
            assert next(r for r in loc.layers if r.scope == "lstm").status == "pass", loc.line()
            assert "not compared" not in loc.message, loc.line()


def test_a_parameter_outside_every_layer_is_compared_or_named(tmp_path):
    """A ``log_std`` Parameter of the actor itself: ms-mindir compares it by name and names it; the runtimes that
    compare layer outputs say they could not compare it, never that every layer agrees."""
    import shaped_policies as sp

    bundle = export_policy(nudge(sp.make_log_std_actor(), "log_std", 0.3), sp.LOG_STD_CONTRACT, tmp_path / "bundle")
    result = verify_policy(sp.make_log_std_actor(), None, bundle.root,
                           options=VerifyOptions(**FAST, runtimes=RUNTIMES, localize="always"))  # fmt: skip
    assert result.exit_code == 1
    assert result.localizations["ms-mindir"].first == "log_std", result.localizations["ms-mindir"].line()
    for name in ("onnxruntime", "lite"):
        loc = result.localizations[name]
        assert loc.first is None and "not compared: Parameter log_std (outside every layer)" in loc.message, loc.line()
        assert not loc.message.startswith("every one"), loc.line()


def test_layouts_are_mapped_only_where_exact():
    from inference.compare.judge.localize import to_layout

    nchw = np.arange(2 * 3 * 4 * 5, dtype=np.float32).reshape(2, 3, 4, 5)
    assert np.array_equal(to_layout(nchw.transpose(0, 2, 3, 1), nchw), nchw)  # Lite's NHWC
    assert np.array_equal(to_layout(nchw.reshape(2, 3, 20, 1), nchw.reshape(2, 3, 20)), nchw.reshape(2, 3, 20))
    flat_nhwc = nchw.transpose(0, 2, 3, 1).reshape(2, -1)
    assert to_layout(flat_nhwc, nchw) is None  # a reshape of a transposed tensor compares unrelated elements
    assert to_layout(nchw.reshape(2, 60), nchw.reshape(2, 6, 10)) is None


def test_a_fused_layer_whose_layout_cannot_be_mapped_is_unmatched_with_its_shapes():
    from inference.compare.judge.localize import Fused, LayerPlan, PlannedLayer, compare_layers
    from inference.compare.judge.stats import Tolerance

    plan = LayerPlan([PlannedLayer("conv", "Conv2d", "t1"), PlannedLayer("head", "Dense", "t3")])
    reference = [np.ones((2, 3, 4, 5), np.float32), np.ones((2, 2), np.float32)]
    got = {"t2": np.ones((2, 61), np.float32), "t3": np.ones((2, 2), np.float32)}
    fused = {"t1": Fused("k", "t2", (("Relu", ()),))}
    loc = compare_layers("lite", plan, reference, got, Tolerance(1e-4, 1e-4), fused)
    conv = loc.layers[0]
    assert conv.status == "unmatched" and "[2, 61] (kernel output 't2') vs [2, 3, 4, 5]" in conv.note, conv
    assert loc.first is None and "not compared: conv" in loc.message, loc.message


def test_a_claim_never_covers_a_layer_that_was_not_compared():
    from inference.compare.judge.localize import LayerComparison, conclude

    rows = [LayerComparison("a", "Dense", "pass", 1.0, 0.0, 0.0), LayerComparison("b", "Dense", "unmatched")]
    loc = conclude("ms-mindir", rows, None, agreed="every layer's parameters equal the Cell's")
    assert not loc.message.startswith("every") and "not compared: b" in loc.message, loc.message


def test_a_changed_clip_bound_of_the_normaliser_is_preprocessing(cartpole_bundle, cartpole_ckpt, tmp_path):
    """The ONNX graph's normaliser clips at 1 instead of 10: the outputs alone say "network"; the first diverging
    layer is the normaliser, so the diagnosis is preprocessing (never "preprocessing is ruled out" beside it)."""
    import onnx
    from onnx import numpy_helper

    root = tmp_path / "bundle"
    shutil.copytree(cartpole_bundle.root, root)
    model = onnx.load(str(root / "policy.onnx"))
    clip = next(n for n in model.graph.node if n.op_type == "Clip")
    for init in model.graph.initializer:
        if init.name in clip.input[1:]:
            init.CopyFrom(numpy_helper.from_array(np.sign(numpy_helper.to_array(init)).astype(np.float32), init.name))
    onnx.save(model, str(root / "policy.onnx"))
    manifest = json.loads((root / "manifest.json").read_text())
    manifest["graphs"]["policy"]["files"]["onnx"]["sha256"] = sha256_file(root / "policy.onnx")
    (root / "manifest.json").write_text(json.dumps(manifest, indent=1))
    result = verify_run(load_bundle(root), cartpole_ckpt, VerifyOptions(**FAST, runtimes=("onnxruntime",)))
    assert result.exit_code == 1
    assert result.localizations["onnxruntime"].first == "normalizer", result.localizations["onnxruntime"].line()
    diagnosed = {c.diagnosis["stage"] for c in result.failed if c.diagnosis}
    assert diagnosed == {"preprocessing"}, result.console_table(only_failed=True)
    assert all("ruled out" not in c.diagnosis["detail"] for c in result.failed if c.diagnosis)


@pytest.mark.slow
def test_a_multi_head_attentions_projections_are_compared_through_their_reshapes(tmp_path):
    """The exporter writes each projection's output already split into heads; the projection is still compared (a
    reshape keeps the elements' order) and a nudged query is named where it happens."""
    import layer_policies as lp

    bundle = export_policy(lp.make_multi_head(), lp.STACKED_CONTRACT, tmp_path / "bundle")
    observations = np.random.default_rng(1).standard_normal((300, lp.STEPS, lp.FEATURES)).astype(np.float32)
    options = VerifyOptions(observations=300, episodes=1, seed=3, runtimes=("lite", "onnxruntime"),
                            required=("lite", "onnxruntime"))  # fmt: skip
    result = verify_policy(nudge(lp.make_multi_head(), "q.weight", 0.5), None, bundle.root,
                           observations=observations, options=options)  # fmt: skip
    assert result.exit_code == 1
    for runtime in ("lite", "onnxruntime"):
        assert_named(result.localizations[runtime], "q")
    status = {row.scope: row.status for row in result.localizations["onnxruntime"].layers}
    assert status["k"] == status["v"] == "pass", status
