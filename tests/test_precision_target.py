"""The device's precision is part of the bundle: export --target writes Lite's converter configuration with the
precision mode explicit, the manifest records it, Lite is handed that mode (runner and in-process library), doctor
shows it, an Ascend run whose mode would be Lite's default (fp16) is refused, and a manifest without a target is a
CPU bundle that the report says it assumed."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import lite_build
import pytest
from cli_inprocess import run_module

from inference.bundle import load_bundle
from inference.bundle.precision_mode import PrecisionModeMissing, lite_precision
from inference.lite.common import DeviceUnavailable, ModelLoadError, runner_available, runner_path

REPO = Path(__file__).resolve().parents[1]
_ok, _why = runner_available()
needs_runner = pytest.mark.skipif(not _ok and not lite_build.required(), reason=_why)


def deploy_python(code: str) -> dict:
    """``code`` in a fresh Python without MindSpore (Lite in the process clashes with it); prints one JSON line."""
    script = "import sys, json\nsys.modules['mindspore'] = None\n" + textwrap.dedent(code)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=REPO, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def ascend_bundle(cartpole_ckpt, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("ascend") / "bundle"
    proc = run_module("msrl_consistency.export", "--ckpt", str(cartpole_ckpt), "--out", str(out),
                      "--target", "ascend310", "--precision-mode", "enforce_origin", "--check-samples", "16",
                      cwd=REPO)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    return out


def test_an_ascend_target_without_a_mode_is_refused_in_one_line_naming_lites_default(cartpole_ckpt, tmp_path):
    proc = run_module("msrl_consistency.export", "--ckpt", str(cartpole_ckpt), "--out", str(tmp_path / "b"),
                      "--target", "ascend910b", cwd=REPO)  # fmt: skip
    assert proc.returncode == 2
    line = proc.stderr.strip()
    assert len(line.splitlines()) == 1 and line.startswith("error: ")
    assert "enforce_fp16" in line and "--precision-mode" in line and not (tmp_path / "b").exists()


def test_an_ascend_target_writes_its_converter_configuration_and_records_the_mode(ascend_bundle):
    config = (ascend_bundle / "lite_converter.cfg").read_text()
    assert "[ascend_context]" in config and "precision_mode=enforce_origin" in config
    bundle = load_bundle(ascend_bundle)
    assert bundle.target["device"] == "ascend310" and bundle.target["precision_mode"] == "enforce_origin"
    assert bundle.target["computes_in"] == "fp32" and bundle.target["converter_config"]["file"] == "lite_converter.cfg"
    assert bundle.manifest["graphs"]["policy"]["files"]["ms"]["converter_config"]["file"] == "lite_converter.cfg"
    chosen = lite_precision(bundle.manifest, "ascend", "x86_64")
    assert chosen.precision_mode == "enforce_origin" and chosen.preset == "fp32"


def test_a_changed_converter_configuration_is_caught_by_its_hash(ascend_bundle, tmp_path):
    from inference.bundle import BundleError

    copy = tmp_path / "b"
    shutil.copytree(ascend_bundle, copy)
    (copy / "lite_converter.cfg").write_text("[ascend_context]\nprecision_mode=enforce_fp16\n")
    with pytest.raises(BundleError, match="lite_converter.cfg"):
        load_bundle(copy)


@needs_runner
def test_the_runner_hands_lite_the_mode_it_was_given():
    """Read back from Lite's own AscendDeviceInfo (no device needed), and refused without one."""
    runner = str(runner_path())
    proc = subprocess.run([runner, "--describe-device", "--device", "ascend", "--device-id", "1", "--precision-mode",
                           "enforce_origin"], capture_output=True, text=True, timeout=60)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == {"device": "ascend", "device_id": 1, "precision_mode": "enforce_origin",
                                       "enable_fp16": None}  # fmt: skip
    proc = subprocess.run([runner, "--describe-device", "--device", "ascend"], capture_output=True, text=True,
                          timeout=60)  # fmt: skip
    assert proc.returncode == 2 and json.loads(proc.stdout)["kind"] == "args"
    assert "enforce_fp16" in json.loads(proc.stdout)["error"]


@needs_runner
def test_the_in_process_library_builds_the_same_device_context():
    got = deploy_python("""
        from inference.lite.common import ModelLoadError
        from inference.lite.inprocess import describe_device
        out = {"ascend": describe_device("ascend", 0, "preferred_fp32"),
               "cpu": describe_device("cpu", 0, "enforce_fp16")}
        try:
            describe_device("ascend", 0, "")
        except ModelLoadError as exc:
            out["refused"] = str(exc)
        print(json.dumps(out))
    """)
    assert got["ascend"]["precision_mode"] == "preferred_fp32" and got["cpu"]["enable_fp16"] is True
    assert "enforce_fp16" in got["refused"]


@needs_runner
@pytest.mark.parametrize("where", ["runner", "in-process"])
def test_lite_on_ascend_gets_the_bundles_mode_and_a_cpu_bundle_is_refused(ascend_bundle, cartpole_bundle, where):
    """The Ascend bundle's mode reaches Lite (its device failure here names it: no Ascend on this box); a CPU bundle
    on Ascend is refused before Lite is touched, naming the default it would get."""
    opener = "from inference.lite.client import LiteRunner as Open" if where == "runner" else \
        "from inference.lite.inprocess import LiteModel as Open"  # fmt: skip
    got = deploy_python(f"""
        {opener}
        out = {{}}
        for name, path in (("ascend", {str(ascend_bundle / "policy.ms")!r}),
                           ("cpu", {str(cartpole_bundle.root / "policy.ms")!r})):
            try:
                Open(path, device="ascend")
            except Exception as exc:
                out[name] = [type(exc).__name__, str(exc)]
        print(json.dumps(out))
    """)
    assert got["ascend"][0] == DeviceUnavailable.__name__ and "precision mode enforce_origin" in got["ascend"][1]
    assert got["cpu"][0] == ModelLoadError.__name__
    assert "enforce_fp16" in got["cpu"][1] and "--precision-mode" in got["cpu"][1]


def test_verify_and_check_on_ascend_refuse_a_bundle_without_a_mode(cartpole_bundle, ascend_bundle):
    """Before any comparison runs (the deploy side's check runs the same verifier)."""
    from inference.compare.inputs import Inputs
    from inference.compare.verifier import VerifyOptions, verify
    from inference.errors import UsageError

    with pytest.raises(UsageError, match="no Ascend precision mode: Lite would use its default, enforce_fp16"):
        verify(cartpole_bundle, VerifyOptions(device="ascend", runtimes=("lite",)), Inputs())
    with pytest.raises(UsageError, match="no observation source"):  # the Ascend bundle gets past the refusal
        verify(load_bundle(ascend_bundle), VerifyOptions(device="ascend", runtimes=("lite",)), Inputs())


def test_a_manifest_without_a_target_is_read_as_cpu_and_the_report_says_so(cartpole_bundle, tmp_path):
    copy = tmp_path / "old"
    shutil.copytree(cartpole_bundle.root, copy)
    manifest = json.loads((copy / "manifest.json").read_text())
    del manifest["target"]
    for graph in manifest["graphs"].values():
        graph["files"]["ms"].pop("converter_config", None)
    (copy / "manifest.json").write_text(json.dumps(manifest))
    bundle = load_bundle(copy)
    assert bundle.target["device"] == "cpu" and bundle.target["precision_mode"] is None
    assert "cpu" in bundle.defaults()["target"]
    with pytest.raises(PrecisionModeMissing, match="enforce_fp16"):
        lite_precision(bundle.manifest, "ascend", "x86_64")


def test_doctor_shows_the_mode_that_will_apply(ascend_bundle, cartpole_bundle):
    from inference.doctor import precision_check

    check = precision_check(load_bundle(ascend_bundle), None, "ascend")
    assert check.status == "ok" and "enforce_origin" in check.here and "fp32" in check.here
    refused = precision_check(cartpole_bundle, None, "ascend")
    assert refused.status == "incompatible" and "enforce_fp16" in refused.detail
    cpu = precision_check(cartpole_bundle, None, "cpu")
    assert cpu.status == "ok" and "fp32" in cpu.here
