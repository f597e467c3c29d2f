"""Untrusted inputs: the manifest is checked against its published schema before any work, a bundle's files stay
inside the bundle, and reports are whole or absent."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest
from cli_inprocess import run_module

from inference.bundle import BundleError, load_bundle
from inference.bundle.schema import MANIFEST_SCHEMA, errors, load_schema, optional_defaults

SMALL = ["--observations", "200", "--episodes", "1"]


def copy_with(bundle_root: Path, tmp_path: Path, edit) -> Path:
    copy = tmp_path / "bundle"
    shutil.copytree(bundle_root, copy)
    manifest = json.loads((copy / "manifest.json").read_text())
    edit(manifest, copy)
    (copy / "manifest.json").write_text(json.dumps(manifest))
    return copy


def verify(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return run_module("msrl_consistency.verify", *args, cwd=cwd)


# -- 9. the manifest is a contract too -------------------------------------------------------------------------------
def broken_manifests(manifest: dict) -> dict[str, dict]:
    """Variants of a valid manifest, each missing or mistyping one field."""
    out = {}
    for field in ("noise", "seeds", "env", "policy_spec", "precision", "source", "graphs"):
        out[f"no {field}"] = {k: v for k, v in manifest.items() if k != field}
    out["precision fp8"] = {**manifest, "precision": "fp8"}
    out["seeds a list"] = {**manifest, "seeds": [1, 2]}
    out["sha256 not hex"] = json.loads(json.dumps(manifest))
    out["sha256 not hex"]["graphs"]["policy"]["files"]["mindir"]["sha256"] = "xyz"
    out["unknown field"] = {**manifest, "extra": 1}
    ranges = {  # every number range-checked: the same verdict from both validators
        "negative var": (("normalization", "var", 0), -1.0),
        "mean beyond float32": (("normalization", "mean", 0), 1e39),
        "clip 0": (("normalization", "clip"), 0),
        "obs dim 2**21": (("policy_spec", "obs_dim"), 2**21),
        "hidden 10**9": (("policy_spec", "hidden_sizes", 0), 10**9),
        "seed 2**64": (("seeds", "self_check"), 2**64),
        "tensor dim 0": (("graphs", "policy", "inputs", 0, "shape", 1), 0),
        "tensor dim -2": (("graphs", "policy", "inputs", 0, "shape", 1), -2),
        "tensor dim 10**12": (("graphs", "policy", "inputs", 0, "shape", 1), 10**12),
        "tensor 9 dims": (("graphs", "policy", "inputs", 0, "shape"), [-1] + [1] * 8),
        "file bytes 2**63": (("graphs", "policy", "files", "mindir", "bytes"), 2**63),
    }
    for name, (path, value) in ranges.items():
        out[name] = json.loads(json.dumps(manifest))
        node = out[name]
        for key in path[:-1]:
            node = node[key]
        node[path[-1]] = value
    return out


@pytest.mark.slow
def test_the_published_schema_agrees_with_the_reference_validator(cartpole_bundle, pendulum_bundle):
    """Our small deploy-side validator and jsonschema give the same verdict, on real and broken manifests."""
    schema = load_schema()
    jsonschema.Draft202012Validator.check_schema(schema)
    reference = jsonschema.Draft202012Validator(schema)
    for bundle in (cartpole_bundle, pendulum_bundle):
        assert errors(bundle.manifest, schema) == [] and reference.is_valid(bundle.manifest)
        for name, broken in broken_manifests(bundle.manifest).items():
            assert errors(broken, schema) and not reference.is_valid(broken), name


@pytest.mark.slow
@pytest.mark.parametrize("field", ["noise", "seeds", "env", "policy_spec"])
def test_a_manifest_missing_a_field_is_exit_2_naming_it(cartpole_bundle, cartpole_ckpt, tmp_path, field):
    copy = copy_with(cartpole_bundle.root, tmp_path, lambda m, _c: m.pop(field))
    proc = verify("--bundle", str(copy), "--ckpt", str(cartpole_ckpt), *SMALL, cwd=tmp_path)
    assert proc.returncode == 2, proc.stdout[-1000:] + proc.stderr[-1000:]
    assert proc.stderr.startswith(f"error: {copy}/manifest.json: field {field}: required field is missing")
    assert len(proc.stderr.strip().splitlines()) == 1


def test_optional_fields_left_out_are_written_into_the_report(pendulum_bundle, pendulum_ckpt, tmp_path):
    def drop(m, _copy):
        m["source"] = {"kind": "cell", "cell": "x:y"}  # a Cell bundle: env and normalization are optional there
        m.pop("env")
        m.pop("normalization")

    copy = copy_with(pendulum_bundle.root, tmp_path, drop)
    bundle = load_bundle(copy)
    assert set(bundle.defaults()) == {"env", "normalization"}
    assert "observation bounds unknown" in bundle.defaults()["env"]
    assert optional_defaults(pendulum_bundle.manifest, load_schema()) == {}


def test_the_schema_ships_with_the_deploy_side():
    deploy = (Path(__file__).resolve().parents[1] / "inference" / "pyproject.toml").read_text()
    assert MANIFEST_SCHEMA.name in deploy and MANIFEST_SCHEMA.is_file()


# -- 11. a bundle's files stay inside the bundle ---------------------------------------------------------------------
@pytest.mark.parametrize("where", ["parent", "absolute", "symlink"])
def test_graph_files_outside_the_bundle_are_refused(cartpole_bundle, tmp_path, where):
    outside = tmp_path / "elsewhere"
    outside.mkdir()

    def escape(m, copy):
        entry = m["graphs"]["policy"]["files"]["onnx"]
        target = outside / "x.onnx"
        shutil.copy(copy / entry["file"], target)
        if where == "parent":
            entry["file"] = "../elsewhere/x.onnx"
        elif where == "absolute":
            entry["file"] = str(target)
        else:
            (copy / entry["file"]).unlink()
            os.symlink(target, copy / entry["file"])

    copy = copy_with(cartpole_bundle.root, tmp_path, escape)
    with pytest.raises(BundleError, match="policy.onnx") as info:
        load_bundle(copy)
    assert "outside the bundle" in str(info.value) or "not a file inside the bundle" in str(info.value)
    # The deploy side refuses it the same way, with exit 2.
    code = "import sys; sys.modules['mindspore'] = None\nfrom inference.play import main\nsys.exit(main(sys.argv[1:]))"
    proc = subprocess.run([sys.executable, "-c", code, str(copy), "--episodes", "1"], capture_output=True, text=True,
                          timeout=120)  # fmt: skip
    assert proc.returncode == 2 and "policy.onnx" in proc.stderr


# -- 13. reports are whole or absent ---------------------------------------------------------------------------------
@pytest.mark.slow
def test_reports_are_renamed_into_place_whole(cartpole_bundle, cartpole_ckpt, tmp_path, monkeypatch):
    from inference.compare.verifier import VerifyOptions
    from inference.report import writers
    from msrl_consistency.api import verify_run

    result = verify_run(cartpole_bundle, cartpole_ckpt, VerifyOptions(observations=200, episodes=1,
                                                                      runtimes=("ms-graph",)))  # fmt: skip
    out = tmp_path / "r"
    writers.write_reports(result, out)
    before = {p.name: p.read_bytes() for p in out.iterdir()}

    def interrupted(*_args):
        raise KeyboardInterrupt("SIGTERM")

    monkeypatch.setattr(writers, "plot_action_diffs", interrupted)
    with pytest.raises(KeyboardInterrupt):
        writers.write_reports(result, out)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before  # the earlier set, untouched
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r"]  # no temporary directory left
    with pytest.raises(KeyboardInterrupt):
        writers.write_reports(result, tmp_path / "fresh")
    assert not (tmp_path / "fresh").exists()


def test_a_report_directory_holding_other_files_is_refused_before_any_work(tmp_path):
    (tmp_path / "r").mkdir()
    (tmp_path / "r" / "notes.txt").write_text("mine")
    proc = verify("--bundle", str(tmp_path), "--out", str(tmp_path / "r"), cwd=tmp_path)
    assert proc.returncode == 2 and "holds other files (notes.txt)" in proc.stderr


# -- 8. the Lite path is tested under CI, never skipped -------------------------------------------------------------
@pytest.mark.slow
def test_a_missing_runner_fails_the_suite_under_ci(tmp_path):
    (tmp_path / "test_x.py").write_text("def test_x():\n    pass\n")
    shutil.copy(Path(__file__).with_name("conftest.py"), tmp_path)
    shutil.copy(Path(__file__).with_name("lite_build.py"), tmp_path)
    env = {**os.environ, "MSRL_REQUIRE_RUNNER": "1", "MSRL_LITE_RUNNER": "/nonexistent/msrl-lite-runner"}
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tmp_path)], env=env,
                          capture_output=True, text=True, timeout=300, cwd=tmp_path)  # fmt: skip
    assert proc.returncode != 0 and "the Lite runner is required here" in proc.stdout + proc.stderr
    env.pop("MSRL_REQUIRE_RUNNER")
    env["CI"] = "false"
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tmp_path)], env=env,
                          capture_output=True, text=True, timeout=300, cwd=tmp_path)  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-1000:]  # outside CI a developer's checkout may lack the runner


def test_a_graph_file_replaced_after_the_bundle_was_loaded_is_refused_not_run(cartpole_bundle, tmp_path):
    """The hash is checked again when a runtime opens the file: a swap between load_bundle and the run is caught."""
    from inference.runtimes.base import RuntimeSource
    from inference.runtimes.registry import create

    copy = tmp_path / "bundle"
    shutil.copytree(cartpole_bundle.root, copy)
    bundle = load_bundle(copy)
    shutil.copyfile(copy / "policy_sample.onnx", copy / "policy.onnx")  # another graph, after the hashes were read
    runtime = create("onnxruntime", RuntimeSource(bundle), "policy")
    with pytest.raises(BundleError, match="policy.onnx changed after the bundle was loaded"):
        runtime.open()
