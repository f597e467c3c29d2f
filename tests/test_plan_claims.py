"""The verifier owns the bar: a precision plan in a manifest is information checked against the files it describes,
and its bounds may only tighten the verifier's (an adversary's 1e300 bounds change nothing)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from inference.bundle import load_bundle
from inference.bundle.ms_file import MsFileError, ms_tensors
from inference.bundle.plan_claims import PlanClaimError, check_plan
from inference.compare.judge.device_precision import judgement
from inference.compare.judge.policy_bounds import POLICY_BOUNDS


def _layers(bundle) -> list[dict]:
    """A plan's layer list for the bundle's real ONNX nodes: the first Gemm of each graph lowered, the rest kept."""
    import onnx

    nodes = {g: [n.name for n in onnx.load(str(bundle.file(g, "onnx"))).graph.node] for g in bundle.graphs}
    first = {g: [n for n in names if "Gemm" in n][:1] for g, names in nodes.items()}
    rest = {g: [n for n in names if n not in first[g]] for g, names in nodes.items()}
    return [{"scope": "actor.layers.0", "kind": "Dense", "nodes": first, "precision": "int8"},
            {"scope": "rest", "kind": "rest", "nodes": rest, "precision": "fp32"}]  # fmt: skip


def _with_plan(bundle, tmp_path: Path, **plan) -> object:
    out = tmp_path / "claimed"
    shutil.copytree(bundle.root, out)
    data = json.loads((out / "manifest.json").read_text())
    data["plan"] = {"lower": "int8", "kept": ["rest"], "layers": _layers(bundle), "bounds": {},
                    "source_graphs": {g: bundle.graph(g)["files"]["onnx"]["sha256"] for g in bundle.graphs},
                    **plan}  # fmt: skip
    data["plan"] = {k: v for k, v in data["plan"].items() if v is not None}
    (out / "manifest.json").write_text(json.dumps(data))
    return load_bundle(out)


def test_the_ms_reader_sees_float32_weights_and_refuses_other_files(cartpole_bundle, tmp_path):
    tensors = ms_tensors(cartpole_bundle.file("policy", "ms"))
    assert any(t.name.endswith("layers.0.weight") and t.dtype == "float32" and t.data_bytes for t in tensors)
    assert {t.dtype for t in tensors if t.data_bytes} == {"float32"} and not any(t.quantized for t in tensors)
    with pytest.raises(MsFileError, match="not a MindSpore Lite model"):
        ms_tensors(cartpole_bundle.file("policy", "onnx"))
    (tmp_path / "cut.ms").write_bytes(cartpole_bundle.file("policy", "ms").read_bytes()[:40])
    with pytest.raises(MsFileError):
        ms_tensors(tmp_path / "cut.ms")


def test_int8_claimed_for_a_float32_ms_is_refused_naming_the_layer(cartpole_bundle, tmp_path):
    forged = _with_plan(cartpole_bundle, tmp_path, bounds={"mean_exp_abs": 1e300, "flip_rate_ucb": 1e300})
    with pytest.raises(PlanClaimError, match="claims int8 for layer 'actor.layers.0'.*float32"):
        check_plan(forged)


@pytest.mark.parametrize(("change", "named"), [
    ({"source_graphs": None}, "does not say which float32 graphs"),
    ({"source_graphs": {"policy": "0" * 64, "policy_sample": "0" * 64}}, "was made for another bundle"),
    ({"kept": ["ghost"]}, "keeps layer\\(s\\) it does not have: ghost"),
    ({"layers": []}, "lists no layers"),
])  # fmt: skip
def test_a_plan_that_does_not_describe_the_files_is_refused(cartpole_bundle, tmp_path, change, named):
    with pytest.raises(PlanClaimError, match=named):
        check_plan(_with_plan(cartpole_bundle, tmp_path, **change))


def test_a_layer_naming_nodes_the_graph_does_not_have_is_refused(cartpole_bundle, tmp_path):
    layers = _layers(cartpole_bundle)
    layers[1]["nodes"]["policy"] = [*layers[1]["nodes"]["policy"], "ghost_node"]
    with pytest.raises(PlanClaimError, match="layer 'rest' with node\\(s\\) ghost_node"):
        check_plan(_with_plan(cartpole_bundle, tmp_path, layers=layers))


def test_an_fp16_plan_keeps_in_fp32_what_its_execution_plan_does(cartpole_bundle, tmp_path):
    layers = [{**layer, "precision": "fp16" if layer["precision"] == "int8" else "fp32"}
              for layer in _layers(cartpole_bundle)]  # fmt: skip
    with pytest.raises(PlanClaimError, match="no runtime configuration"):
        check_plan(_with_plan(cartpole_bundle, tmp_path, lower="fp16", layers=layers))


def test_a_plans_bounds_only_tighten_the_verifiers():
    verifier = POLICY_BOUNDS["int8"]
    loose = verifier.tightened({k: 1e300 for k in verifier.to_dict()})  # ESS "at least 1e300": at least 1, stricter
    assert loose == POLICY_BOUNDS["int8"].__class__(**{**verifier.to_dict(), "ess": 1.0})
    strict = verifier.tightened({"mean_exp_abs": 1.01, "ess": 0.99, "flip_rate_ucb": "0", "k3_kl": float("nan")})
    assert strict.mean_exp_abs == 1.01 and strict.ess == 0.99
    assert strict.flip_rate_ucb == verifier.flip_rate_ucb and strict.k3_kl == verifier.k3_kl  # not numbers: ignored
    fp32 = POLICY_BOUNDS["fp32"].tightened({"flip_rate_ucb": 0.5, "return_difference": 0.5})
    assert fp32.flip_rate_ucb is None and fp32.return_difference is None  # a claim adds no bar the verifier lacks


def test_a_plan_runtime_is_judged_with_the_verifiers_preset_not_the_bundles(cartpole_bundle, tmp_path):
    loose = {k: 1e300 for k in POLICY_BOUNDS["int8"].to_dict() if k != "ess"}
    forged = _with_plan(cartpole_bundle, tmp_path, bounds=loose, tolerance={"atol": 1e300, "rtol": 1e300,
                                                                            "scale": 1e300})  # fmt: skip
    judged = judgement(forged, "lite", "cpu", None)
    assert judged.preset.name == "int8" and judged.policy == POLICY_BOUNDS["int8"]
    assert judged.tolerance.atol < 1 and judged.tolerance.scale <= 0.1
    assert judged.info["judged_as"] == "int8" and judged.info["bounds"]["mean_exp_abs"] == 1.05
    emulated = judgement(forged, "emulated-fp16", "cpu", None)
    assert emulated.preset.name == "fp16" and emulated.policy == POLICY_BOUNDS["fp16"]
