"""Layers of modern policies through every format: LayerNorm in Lite (whose ReduceSumSquare overwrote its input),
exact GELU (no Erf in MindSpore's ONNX exporter), indexing forms of batch-dependent tensors, an output named like a
Parameter. The ONNX rewrites are checked op by op in ONNX Runtime; the policies end to end, Lite included."""

from __future__ import annotations

import math

import layer_policies as lp
import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from inference.compare.verifier import VerifyOptions
from inference.lite.common import runner_available
from msrl_consistency import compat
from msrl_consistency.api import export_policy, verify_policy
from msrl_consistency.artifacts import graphs
from msrl_consistency.artifacts.bundle import ExportCheckFailed
from msrl_consistency.artifacts.onnx_patterns import (
    drop_noop_slices,
    explicit_reduce_axes,
    fix_shrink_slices,
    restore_marked,
    split_reduce_sum_square,
)

needs_runner = pytest.mark.skipif(not runner_available()[0], reason=runner_available()[1])
FULL = {"mindir", "onnx", "ms"}


# -- the ONNX rewrites, each against ONNX Runtime ------------------------------------------------------------------
def run(model: onnx.ModelProto, x: np.ndarray) -> list[np.ndarray]:
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, {"x": x})


def model(nodes: list, inits: list, outputs: list[str], shape: list) -> onnx.ModelProto:
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
        [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in outputs],
        inits,
    )
    made = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 11)])
    made.ir_version = 6
    return made


def ints(name: str, values: list[int]) -> onnx.TensorProto:
    return numpy_helper.from_array(np.asarray(values, np.int64), name)


X = np.random.default_rng(0).standard_normal((5, 8, 6)).astype(np.float32)


def test_reduce_sum_square_becomes_a_sum_of_products_with_the_same_values():
    m = model([helper.make_node("ReduceSumSquare", ["x"], ["ss"], axes=[2], keepdims=1),
               helper.make_node("Div", ["x", "ss"], ["y"])], [], ["y", "ss"], [5, 8, 6])  # fmt: skip
    before = run(m, X)
    assert split_reduce_sum_square(m) == 1
    assert "ReduceSumSquare" not in {n.op_type for n in m.graph.node}
    after = run(m, X)
    np.testing.assert_allclose(after[0], before[0], rtol=1e-6)
    np.testing.assert_allclose(after[1], (X.astype(np.float64) ** 2).sum(2, keepdims=True), rtol=1e-6)


@pytest.mark.parametrize("op", ["Erf", "Elu"])
def test_a_marker_clip_becomes_its_op(op):
    low, high = (
        numpy_helper.from_array(np.array(b, np.float32), n) for b, n in zip(compat.ONNX_MARKERS[op], "lh", strict=True)
    )
    other = numpy_helper.from_array(np.array(2.0, np.float32), "two")
    m = model([helper.make_node("Clip", ["x", "l", "h"], ["e"]), helper.make_node("Mul", ["e", "two"], ["y"])],
              [low, high, other], ["y"], [5, 8, 6])  # fmt: skip
    assert restore_marked(m, compat.ONNX_MARKERS) == 1
    assert [n.op_type for n in m.graph.node] == [op, "Mul"] and [i.name for i in m.graph.initializer] == ["two"]
    x = X.astype(np.float64)
    want = np.vectorize(math.erf)(x) if op == "Erf" else np.where(x > 0, x, np.expm1(x))
    np.testing.assert_allclose(run(m, X)[0], 2 * want, atol=1e-6)


@pytest.mark.parametrize("k", [1, 2])
def test_a_slice_of_one_position_from_the_end_gets_its_end(k):
    """``x[:, -k]`` as MindSpore's exporter writes it: ``Slice(starts=-k, ends=0)`` (empty in ONNX), ``Squeeze``."""
    m = model([helper.make_node("Slice", ["x", "s", "e", "a", "t"], ["sl"]),
               helper.make_node("Squeeze", ["sl"], ["y"], axes=[1])],
              [ints("s", [-k]), ints("e", [0]), ints("a", [1]), ints("t", [1])], ["y"], [5, 8, 6])  # fmt: skip
    with pytest.raises(Exception, match="Squeeze"):
        run(m, X)
    assert fix_shrink_slices(m) == 1
    np.testing.assert_array_equal(run(m, X)[0], X[:, -k])


def test_a_slice_that_slices_nothing_is_removed():
    m = model([helper.make_node("Slice", ["x", "s", "e", "a", "t"], ["sl"]), helper.make_node("Relu", ["sl"], ["y"]),
               helper.make_node("Slice", ["x", "s", "e", "a", "t"], ["out"])],
              [ints("s", []), ints("e", []), ints("a", []), ints("t", [])], ["y", "out"], [5, 8, 6])  # fmt: skip
    assert drop_noop_slices(m) == 2
    assert [n.op_type for n in m.graph.node] == ["Relu", "Identity"]  # a graph output keeps its name
    y, out = run(m, X)
    np.testing.assert_array_equal(y, np.maximum(X, 0))
    np.testing.assert_array_equal(out, X)


def test_a_reduction_over_every_axis_names_its_axes():
    m = model([helper.make_node("ReduceMean", ["x"], ["m"], keepdims=1), helper.make_node("Sub", ["x", "m"], ["y"])],
              [], ["y"], [5, 8, 6])  # fmt: skip
    before = run(m, X)[0]
    assert explicit_reduce_axes(m) == 1
    assert [list(a.ints) for a in m.graph.node[0].attribute if a.name == "axes"] == [[0, 1, 2]]
    np.testing.assert_allclose(run(m, X)[0], before, rtol=1e-6)


# -- policies through every format ---------------------------------------------------------------------------------
def files(bundle) -> set[str]:
    return {fmt for fmt, entry in bundle.graph("policy")["files"].items() if "file" in entry and "failed" not in entry}


def verify_runtimes(cell, bundle, **kwargs):
    options = VerifyOptions(observations=500, episodes=2, seed=3, runtimes=("ms-graph", "ms-mindir", "lite",
                            "onnxruntime"), required=("lite", "onnxruntime"))  # fmt: skip
    return verify_policy(cell, None, bundle.root, options=options, **kwargs)


@needs_runner
@pytest.mark.parametrize("factory", [lp.make_layernorm, lp.make_layernorm_large], ids=["realistic", "large"])
def test_a_layernorm_policy_runs_in_lite_at_any_scale(tmp_path, factory):
    bundle = export_policy(factory(), lp.CARTPOLE_LOGITS, tmp_path / "bundle")
    assert files(bundle) == FULL
    lite = next(r for r in bundle.manifest["self_check"]["results"] if r["format"] == "ms")
    assert lite["passed"] and lite["max_abs"] < 1e-4
    result = verify_runtimes(factory(), bundle)
    assert result.exit_code == 0, result.console_table(only_failed=True)


@needs_runner
def test_a_format_failing_its_self_check_names_the_first_diverging_layer(tmp_path, monkeypatch):
    """Without the rewrite Lite's ReduceSumSquare squares the LayerNorm's centred input in place: the .ms fails and
    the reason names the LayerNorm."""
    monkeypatch.setattr(graphs, "split_reduce_sum_square", lambda model: 0)
    with pytest.raises(ExportCheckFailed) as failed:
        export_policy(lp.make_layernorm(), lp.CARTPOLE_LOGITS, tmp_path / "bundle")
    reason = failed.value.bundle.graph("policy")["files"]["ms"]["failed"]
    assert "differs from the Cell in lite" in reason and "first diverging layer: ln (LayerNorm)" in reason, reason


@pytest.mark.slow
@needs_runner
def test_an_attention_block_with_exact_gelu_and_the_last_step_runs_in_lite(tmp_path):
    bundle = export_policy(lp.make_attention(), lp.STACKED_CONTRACT, tmp_path / "bundle")
    assert files(bundle) == FULL
    ops = {n.op_type for n in onnx.load(str(bundle.file("policy", "onnx"))).graph.node}
    assert "Erf" in ops and "ReduceSumSquare" not in ops
    result = verify_runtimes(lp.make_attention(), bundle, observations=np.random.default_rng(1).standard_normal(
        (400, lp.STEPS, lp.FEATURES)).astype(np.float32))  # fmt: skip
    assert result.exit_code == 0, result.console_table(only_failed=True)


@needs_runner
@pytest.mark.parametrize("form", lp.SLICES)
def test_each_indexing_form_of_a_batch_dependent_tensor_runs_everywhere(tmp_path, form):
    bundle = export_policy(lp.make_slice(form), lp.STACKED_CONTRACT, tmp_path / "bundle")
    assert files(bundle) == FULL, bundle.manifest["self_check"]["failures"]
    assert all(r["passed"] for r in bundle.manifest["self_check"]["results"])


@needs_runner
def test_elu_layers_export_as_onnx_elu_and_run_everywhere(tmp_path):
    bundle = export_policy(lp.make_elu(), lp.CARTPOLE_LOGITS, tmp_path / "bundle")
    assert files(bundle) == FULL, bundle.manifest["self_check"]["failures"]
    ops = [n.op_type for n in onnx.load(str(bundle.file("policy", "onnx"))).graph.node]
    assert ops.count("Elu") == 2 and "Clip" not in ops


@needs_runner
def test_a_mean_over_every_axis_runs_in_lite(tmp_path):
    """Lite reduced no axis of ``ReduceMean(axes=[])``: the .ms of a Dueling-DQN-style centring failed its check."""
    bundle = export_policy(lp.make_batch_mean(), lp.CARTPOLE_LOGITS, tmp_path / "bundle")
    assert files(bundle) == FULL, bundle.manifest["self_check"]["failures"]


def test_an_erf_primitive_the_exporter_cannot_write_says_what_to_write_instead(tmp_path):
    with pytest.raises(ExportCheckFailed) as failed:
        export_policy(lp.ErfPrimitivePolicy(), lp.CARTPOLE_LOGITS, tmp_path / "bundle")
    reason = failed.value.bundle.graph("policy")["files"]["onnx"]["failed"]
    assert "Erf" in reason and "ops.gelu(x, approximate='none')" in reason, reason


def test_an_output_named_like_a_parameter_exports(tmp_path):
    bundle = export_policy(lp.make_log_std(), lp.LOG_STD_CONTRACT, tmp_path / "bundle")
    assert "onnx" in files(bundle)
    outputs = [o.name for o in onnx.load(str(bundle.file("policy", "onnx"))).graph.output]
    assert outputs == ["mean", "log_std"]
