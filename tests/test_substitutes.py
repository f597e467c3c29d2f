"""Layers MindSpore's ONNX exporter stops at, through to Lite as export-safe substitutes: a one-step GRU and LSTM with
carried state, a negative Split axis, an int64 greedy action, an adaptive max pool on frames. Each: a full bundle
whose manifest names the substitute, verify 0 on the genuine Cell and 1 on a nudged one, naming the nudged layer."""

from __future__ import annotations

import foreign_policies as fp
import layer_policies as lp
import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from inference.compare.verifier import VerifyOptions
from inference.lite.common import runner_available
from msrl_consistency.api import export_policy, verify_policy
from msrl_consistency.artifacts.bundle import ExportCheckFailed
from msrl_consistency.artifacts.onnx_patterns import drop_expand_squeeze, fix_output_casts, slice_unread_splits

needs_runner = pytest.mark.skipif(not runner_available()[0], reason=runner_available()[1])
FULL = {"mindir", "onnx", "ms"}
EVERY_RUNTIME = ("ms-graph", "ms-mindir", "lite", "onnxruntime")
FRAMES = np.random.default_rng(4).integers(0, 256, (300, 12, 12, 3)).astype(np.uint8)


def files(bundle) -> set[str]:
    return {fmt for fmt, entry in bundle.graph("policy")["files"].items() if "file" in entry and "failed" not in entry}


def substitutes(bundle, fmt: str) -> list[str]:
    return bundle.graph("policy")["files"][fmt].get("substitutes", [])


def judge(cell, bundle, **kwargs):
    options = VerifyOptions(observations=500, episodes=2, seed=3, runtimes=EVERY_RUNTIME, required=EVERY_RUNTIME)
    return verify_policy(cell, None, bundle.root, options=options, **kwargs)


def genuine_and_nudged(factory, bundle, parameter: str, delta: float, layer: str, **kwargs) -> None:
    genuine = judge(factory(), bundle, **kwargs)
    assert genuine.exit_code == 0, genuine.console_table(only_failed=True)
    nudged = judge(fp.nudge(factory(), parameter, delta), bundle, **kwargs)
    assert nudged.exit_code == 1
    assert {c.runtime for c in nudged.failed} >= {"lite", "onnxruntime", "ms-mindir"}
    named = {runtime: loc.first for runtime, loc in nudged.localizations.items()}
    assert named["onnxruntime"] == named["ms-mindir"] == layer, named


@pytest.mark.slow
@needs_runner
def test_a_one_step_gru_with_carried_state_goes_through_to_lite(tmp_path):
    """QMIX's layout: without the substitute the ONNX export fails (``make_list``) and the MindIR's sequence output
    keeps the batch of its first call (ms-mindir answered a batch of 64 with the rows of an earlier call)."""
    bundle = export_policy(lp.make_gru(), lp.RECURRENT_CONTRACT, tmp_path / "bundle")
    assert files(bundle) == FULL, bundle.manifest["self_check"]["failures"]
    assert substitutes(bundle, "onnx") == substitutes(bundle, "mindir") == ["rnn: GRU written as its unrolled steps"]
    genuine_and_nudged(lp.make_gru, bundle, "rnn.weight_ih_l0", 0.5, "rnn")


@pytest.mark.slow
@needs_runner
def test_a_one_step_lstm_with_carried_state_goes_through_to_lite(tmp_path):
    bundle = export_policy(lp.make_lstm(), lp.LSTM_CONTRACT, tmp_path / "bundle")
    assert files(bundle) == FULL, bundle.manifest["self_check"]["failures"]
    assert substitutes(bundle, "onnx") == ["rnn: LSTM written as its unrolled steps"]
    genuine_and_nudged(lp.make_lstm, bundle, "rnn.weight_ih_l0", 0.5, "rnn")


@needs_runner
def test_a_negative_split_axis_is_counted_from_the_front(tmp_path):
    bundle = export_policy(lp.make_negative_split(), lp.CARTPOLE_LOGITS, tmp_path / "bundle")
    assert files(bundle) == FULL, bundle.manifest["self_check"]["failures"]
    assert substitutes(bundle, "onnx") == ["split: axis -1 written as 1"]
    assert lp.make_negative_split().split.axis == -1  # the Cell itself is left as written
    genuine_and_nudged(lp.make_negative_split, bundle, "fc.weight", 0.5, "fc")


@needs_runner
def test_an_int64_greedy_action_keeps_its_dtype_in_every_format(tmp_path):
    bundle = export_policy(lp.make_greedy_q(), lp.GREEDY_CONTRACT, tmp_path / "bundle")
    assert files(bundle) == FULL, bundle.manifest["self_check"]["failures"]
    outputs = {o.name: o.type.tensor_type.elem_type for o in onnx.load(str(bundle.file("policy", "onnx"))).graph.output}
    assert outputs["action"] == TensorProto.INT64
    genuine_and_nudged(lp.make_greedy_q, bundle, "fc.weight", 0.5, "fc")


@pytest.mark.slow
@needs_runner
def test_an_adaptive_max_pool_on_frames_becomes_a_fixed_pool(tmp_path):
    bundle = export_policy(lp.make_adaptive_pool(), lp.FRAME_CONTRACT, tmp_path / "bundle")
    assert files(bundle) == FULL, bundle.manifest["self_check"]["failures"]
    assert substitutes(bundle, "onnx") == ["pool: AdaptiveMaxPool2d written as MaxPool 2x2"]
    assert "MaxPool" in {n.op_type for n in onnx.load(str(bundle.file("policy", "onnx"))).graph.node}
    genuine_and_nudged(lp.make_adaptive_pool, bundle, "conv.weight", 0.5, "conv", observations=FRAMES)


def test_an_adaptive_pool_with_unequal_windows_says_what_to_write(tmp_path):
    with pytest.raises(ExportCheckFailed) as failed:
        export_policy(lp.make_adaptive_pool(pooled=4), lp.FRAME_CONTRACT, tmp_path / "bundle")
    reason = failed.value.bundle.graph("policy")["files"]["onnx"]["failed"]
    assert "layer 'pool' (AdaptiveMaxPool2d(4, 4) on 10x10 inputs)" in reason and "nn.MaxPool2d" in reason, reason
    assert "\n" not in reason


# -- the ONNX rewrites, against ONNX Runtime -----------------------------------------------------------------------
def run(model: onnx.ModelProto, x: np.ndarray) -> list[np.ndarray]:
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, {"x": x})


def graph(nodes: list, inits: list, outputs: list, batch: int | str) -> onnx.ModelProto:
    made = helper.make_model(helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                             [batch, 6])], outputs, inits), opset_imports=[helper.make_opsetid("", 11)])  # fmt: skip
    made.ir_version = 6
    return made


def test_a_leading_axis_added_and_squeezed_again_leaves_its_input():
    shape = numpy_helper.from_array(np.asarray([1, 3, 6], np.int64), "shape")
    nodes = [helper.make_node("Reshape", ["x", "shape"], ["e"]), helper.make_node("Squeeze", ["e"], ["s"], axes=[0]),
             helper.make_node("Tanh", ["s"], ["y"])]  # fmt: skip
    out = [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)]
    m, static = graph(nodes, [shape], out, "batch"), graph(nodes, [shape], out, 3)
    x = np.random.default_rng(0).standard_normal((3, 6)).astype(np.float32)
    before = run(m, x)[0]
    assert drop_expand_squeeze(m, static) == 1
    assert [n.op_type for n in m.graph.node] == ["Identity", "Tanh"]
    np.testing.assert_array_equal(run(m, x)[0], before)
    reshaped = numpy_helper.from_array(np.asarray([1, 6, 3], np.int64), "shape")  # a real reshape stays
    m2 = graph(nodes, [reshaped], out, "batch")
    assert drop_expand_squeeze(m2, graph(nodes, [reshaped], out, 6)) == 0


def test_an_output_cast_casts_to_the_type_the_output_declares():
    nodes = [helper.make_node("ArgMax", ["x"], ["i"], axis=1, keepdims=0),
             helper.make_node("Cast", ["i"], ["action"], to=TensorProto.INT32)]  # fmt: skip
    m = graph(nodes, [], [helper.make_tensor_value_info("action", TensorProto.INT64, None)], "batch")
    with pytest.raises(Exception, match="does not match expected type"):
        ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    assert fix_output_casts(m) == 1
    x = np.random.default_rng(0).standard_normal((4, 6)).astype(np.float32)
    (action,) = run(m, x)
    assert action.dtype == np.int64 and (action == x.argmax(1)).all()


@needs_runner
def test_q_values_that_differ_behind_an_agreeing_greedy_action_are_localised_on_their_rows(tmp_path):
    """The decision output (the int64 action) agrees on every row; the Q-values do not: the failure is the network's
    and localisation runs on the rows where the Q-values are furthest beyond their tolerance."""
    bundle = export_policy(lp.make_greedy_q(), lp.GREEDY_CONTRACT, tmp_path / "bundle")
    nudged = judge(fp.nudge(lp.make_greedy_q(), "fc.weight", 0.002), bundle)
    assert nudged.exit_code == 1
    failing = [c for c in nudged.failed if c.name == "observations.policy"]
    assert failing and all(c.diagnosis["stage"] == "network" for c in failing), nudged.console_table()
    named = {runtime: loc.first for runtime, loc in nudged.localizations.items()}
    assert named["onnxruntime"] == named["lite"] == "fc", named


def test_a_nested_output_tuple_is_flattened_in_order(tmp_path):
    """XuanCe's DRQN returns ``(..., (hidden, None))``: the outputs are the flat tuple without the None."""
    from mindspore import Tensor, nn

    class Nested(nn.Cell):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Dense(4, 2)

        def construct(self, obs: Tensor) -> tuple:
            logits = self.fc(obs)
            return logits, (logits * 2.0, None)

    contract = {**lp.CARTPOLE_LOGITS, "outputs": {"names": ["logits", "doubled"]}}
    bundle = export_policy(Nested(), contract, tmp_path / "bundle")
    assert files(bundle) == FULL, bundle.manifest["self_check"]["failures"]
    assert [o.name for o in onnx.load(str(bundle.file("policy", "onnx"))).graph.output] == ["logits", "doubled"]


@needs_runner
def test_a_split_with_an_unread_half_is_written_as_the_slice_that_is_read(tmp_path):
    """Dreamer's decoder keeps the mean half of its Split: Lite 2.0.0 wrote past the unread half's buffer (SIGSEGV at
    batches of 256 and more on the library's own decoder, ``bench/results/mindrl_actors.md``)."""
    bundle = export_policy(lp.make_half_split(), lp.HALF_SPLIT_CONTRACT, tmp_path / "bundle")
    assert files(bundle) == FULL, bundle.manifest["self_check"]["failures"]
    assert "Split" not in {n.op_type for n in onnx.load(str(bundle.file("policy", "onnx"))).graph.node}


def test_an_unread_split_output_leaves_slices_with_the_same_values():
    nodes = [helper.make_node("Split", ["x"], ["a", "b", "c"], axis=1, split=[1, 2, 3]),
             helper.make_node("Add", ["a", "c"], ["y"])]  # fmt: skip
    m = graph(nodes, [], [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], "batch")
    x = np.random.default_rng(0).standard_normal((4, 6)).astype(np.float32)
    before = run(m, x)[0]
    assert slice_unread_splits(m) == 1
    assert [n.op_type for n in m.graph.node] == ["Slice", "Slice", "Add"]
    np.testing.assert_array_equal(run(m, x)[0], before)
