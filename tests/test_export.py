"""The bundle: manifest contents, hashes, tamper detection, atomic writes, self-check refusal."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from inference.bundle import BundleError, load_bundle, sha256_file
from inference.compare.judge.stats import Tolerance
from inference.errors import UsageError
from msrl_consistency.api import export_run
from msrl_consistency.artifacts import selfcheck
from msrl_consistency.artifacts.bundle import ExportCheckFailed, ExportOptions


@pytest.mark.parametrize("which", ["cartpole", "pendulum"])
def test_manifest_pins_files_versions_and_preprocessing(which, request):
    bundle = request.getfixturevalue(f"{which}_bundle")
    ckpt = request.getfixturevalue(f"{which}_ckpt")
    m = bundle.manifest
    assert (m["schema"], m["schema_version"], m["precision"]) == ("msrl-consistency/bundle", 2, "fp32")
    assert m["source"]["checkpoint_sha256"] == sha256_file(ckpt)
    import mindspore

    from inference.bundle.mindir import mindir_version
    from inference.lite.runner_info import runner_info

    assert m["exporter"]["mindspore"] == mindspore.__version__
    assert m["exporter"]["mind_ir_version"] == mindir_version(bundle.file("policy", "mindir"))
    assert m["exporter"]["lite_sdk"] == runner_info().lite_version  # the Lite that ran the self-check
    for name in ("policy", "policy_sample"):
        files = m["graphs"][name]["files"]
        assert set(files) == {"mindir", "onnx", "ms"}
        for entry in files.values():
            assert sha256_file(bundle.root / entry["file"]) == entry["sha256"]
    assert [i["name"] for i in m["graphs"]["policy_sample"]["inputs"]] == ["obs", "noise"]
    assert m["graphs"]["policy"]["inputs"][0]["shape"][0] == -1  # dynamic batch
    assert len(m["normalization"]["sha256"]) == 64 and m["normalization"]["enabled"]
    assert m["self_check"]["passed"] and m["self_check"]["samples"] == 256
    if which == "pendulum":
        assert m["action_postprocess"] == {"mode": "clip", "low": [-2.0], "high": [2.0]}
        assert m["graphs"]["policy"]["outputs"][0]["dtype"] == "float32"
    else:
        assert m["action_postprocess"] is None and m["graphs"]["policy"]["outputs"][0]["dtype"] == "int32"


@pytest.mark.parametrize("damage", ["flip", "truncate", "delete", "manifest"])
def test_tampered_bundle_is_refused(cartpole_bundle, tmp_path, damage):
    copy = tmp_path / "b"
    shutil.copytree(cartpole_bundle.root, copy)
    target = copy / "policy.ms"
    data = target.read_bytes()
    if damage == "flip":
        target.write_bytes(data[:100] + bytes([data[100] ^ 1]) + data[101:])
    elif damage == "truncate":
        target.write_bytes(data[: len(data) // 2])
    elif damage == "delete":
        target.unlink()
    else:
        (copy / "manifest.json").write_text("{ not json")
    with pytest.raises(BundleError, match="does not match|missing|not valid JSON"):
        load_bundle(copy)


def test_existing_bundle_needs_force(cartpole_ckpt, cartpole_bundle):
    with pytest.raises(UsageError, match="--force"):
        export_run(cartpole_ckpt, cartpole_bundle.root, ExportOptions())


def test_failed_self_check_leaves_nothing_behind(cartpole_ckpt, tmp_path, monkeypatch):
    monkeypatch.setattr(selfcheck, "tolerance_for", lambda preset, runtime: Tolerance(0.0, 0.0))
    out = tmp_path / "bundle"
    # ONNX Runtime's GEMM differs from MindSpore by ~1e-6: with zero tolerance the self-check must refuse.
    with pytest.raises(ExportCheckFailed, match="export failed, nothing written: policy.onnx failed: onnxruntime: "):
        export_run(cartpole_ckpt, out, ExportOptions(formats=("onnx",)))
    assert not out.exists()
    assert list(tmp_path.iterdir()) == []


def test_fp16_bundle_is_marked_and_keeps_fp32_io(pendulum_ckpt, tmp_path):
    bundle = export_run(pendulum_ckpt, tmp_path / "fp16", ExportOptions(precision="fp16", formats=("mindir",)))
    assert bundle.manifest["precision"] == "fp16"
    assert bundle.manifest["graphs"]["policy"]["inputs"][0]["dtype"] == "float32"
    assert json.loads((bundle.root / "manifest.json").read_text())["self_check"]["passed"]


def test_export_cli_rejects_bad_input(tmp_path):
    from msrl_consistency import export

    with pytest.raises(UsageError, match="not found"):
        export.main(["--ckpt", str(tmp_path / "missing.ckpt"), "--out", str(tmp_path / "o")])
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "checkpoint.ckpt").write_bytes(np.arange(10).tobytes())
    with pytest.raises(UsageError):
        export.main(["--ckpt", str(tmp_path / "run" / "checkpoint.ckpt"), "--out", str(tmp_path / "o")])
    assert not (tmp_path / "o").exists()


@pytest.mark.slow
def test_fp16_bundle_has_a_lite_artefact_with_fp16_weights(pendulum_ckpt, tmp_path):
    from inference.runtimes.base import RuntimeSource
    from inference.runtimes.registry import availability

    fp32 = export_run(pendulum_ckpt, tmp_path / "fp32", ExportOptions(formats=("ms",)))
    bundle = export_run(pendulum_ckpt, tmp_path / "fp16", ExportOptions(precision="fp16", require_lite=True))
    files = bundle.manifest["graphs"]["policy"]["files"]
    assert "file" in files["mindir"] and "fp16" in files["onnx"]["skipped"] and files["ms"]["weights"] == "float16"
    assert not list(bundle.root.glob("*.onnx"))  # the float32 ONNX was only the converter's input
    assert files["ms"]["bytes"] < fp32.manifest["graphs"]["policy"]["files"]["ms"]["bytes"]
    reasons = availability(RuntimeSource(bundle), ["lite", "onnxruntime", "ms-mindir"])
    assert reasons["lite"] is None and reasons["ms-mindir"] is None and "no .onnx graph" in reasons["onnxruntime"]
    assert {r["format"] for r in bundle.manifest["self_check"]["results"]} == {"mindir", "ms"}
