"""Untrusted documents: a manifest, contract, config, run record, baseline or golden file from elsewhere is parsed
strictly (no repeated keys, bounded depth, size and integers, no NaN) and every number range-checked before anything
is sized or computed from it. Each failure is one line and exit 2, never a traceback or exit 1."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from cli_inprocess import run_module

from inference.bundle import BundleError, load_bundle, sha256_file, toml_fields
from inference.bundle.contract import ContractError, PolicyContract
from inference.bundle.files import MAX_DEPTH, MAX_DOCUMENT_BYTES, loads_strict, read_document
from inference.bundle.schema import load_schema
from inference.errors import UsageError

DEEP = "[" * 100_000 + "]" * 100_000


# -- the strict reader ---------------------------------------------------------------------------------------------
def refused(path: Path, text: str | bytes, what: str = "manifest") -> str:
    """The one-line error ``read_document`` gives for a file holding ``text``."""
    if isinstance(text, str):
        path.write_text(text)
    else:
        path.write_bytes(text)
    with pytest.raises(UsageError) as info:
        read_document(path, what, UsageError)
    message = str(info.value)
    assert "\n" not in message and str(path) in message
    return message


def test_a_key_twice_in_one_object_is_refused_at_any_depth(tmp_path):
    """JSON readers keep the last of two equal keys: a second "precision": "fp16" would loosen the tolerances."""
    path = tmp_path / "manifest.json"
    assert "key 'precision' appears twice" in refused(path, '{"precision": "fp32", "precision": "fp16"}')
    assert "key 'mean' appears twice" in refused(path, '{"normalization": {"x": [{"mean": 1, "mean": 2}]}}')
    same_key_in_two_objects = _write(tmp_path / "ok.json", '{"a": {"a": 1}}')
    assert read_document(same_key_in_two_objects, "manifest", UsageError) == {"a": {"a": 1}}


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


@pytest.mark.parametrize("suffix", [".json", ".toml"])
def test_deep_nesting_is_one_line_not_a_recursion_error(tmp_path, suffix):
    path = tmp_path / f"doc{suffix}"
    text = DEEP if suffix == ".json" else f"a = {DEEP}"
    assert f"nested more than {MAX_DEPTH} levels deep" in refused(path, text)
    levels = MAX_DEPTH if suffix == ".json" else MAX_DEPTH - 1  # a TOML array sits in the document's table
    just = "[" * levels + "]" * levels
    assert read_document(_write(path, just if suffix == ".json" else f"a = {just}"), "manifest", UsageError)
    over = "[" + just + "]"
    assert "nested more than" in refused(path, over if suffix == ".json" else f"a = {over}")


@pytest.mark.parametrize("suffix", [".json", ".toml"])
def test_integers_of_thousands_of_digits_are_refused(tmp_path, suffix):
    """Python refuses to convert more than 4300 digits with a ValueError; a 41-digit integer is no seed or size."""
    path = tmp_path / f"doc{suffix}"
    for digits in (5000, 41):
        text = "9" * digits
        message = refused(path, f'{{"seed": {text}}}' if suffix == ".json" else f"seed = {text}")
        assert "digits" in message and "set_int_max_str_digits" not in message


def test_nan_is_refused_naming_the_field_and_infinity_is_read(tmp_path):
    path = tmp_path / "manifest.json"
    message = refused(path, '{"normalization": {"mean": [0.0, NaN]}}')
    assert "normalization.mean[1] is NaN" in message
    assert read_document(_write(path, '{"obs_low": [-Infinity, 1e999]}'), "manifest", UsageError) == {
        "obs_low": [-np.inf, np.inf]
    }  # unbounded observation dimensions, as Python's json writes them
    assert "c is NaN" in refused(tmp_path / "c.toml", "c = nan", "contract")


def test_a_document_larger_than_the_cap_is_refused_unread(tmp_path):
    path = tmp_path / "manifest.json"
    with open(path, "wb") as fh:
        fh.truncate(MAX_DOCUMENT_BYTES + 1)
    assert "larger than 16 MB" in refused(path, path.read_bytes())
    assert "not UTF-8" in refused(path, b'{"a": "\xff"}')


def test_the_strict_parser_is_reusable_on_text(tmp_path):
    """What other readers (recording chunk metadata, golden files) call on JSON held inside an archive."""
    with pytest.raises(UsageError, match=r"^chunk 3 meta: key 'steps' appears twice"):
        loads_strict('{"steps": 1, "steps": 2}', "chunk 3 meta", UsageError)
    with pytest.raises(UsageError, match="nested more than"):
        loads_strict(DEEP, "chunk 3 meta", UsageError)
    assert loads_strict('{"steps": 2}', "chunk 3 meta", UsageError) == {"steps": 2}


# -- every manifest number range-checked ---------------------------------------------------------------------------
def _set(path: tuple, value):
    def edit(m):
        node = m
        for key in path[:-1]:
            node = node[key]
        node[path[-1]] = value

    return edit


class _Text:
    """An edit of the manifest's text (what json.dumps cannot write: NaN literals, repeated keys, huge nesting)."""

    def __init__(self, edit) -> None:
        self.edit = edit


def _v1(edit=None):
    def to_v1(m):
        m["schema_version"] = 1
        for graph in m["graphs"].values():
            del graph["contract"]
        if edit:
            edit(m)

    return to_v1


POLICY = ("graphs", "policy")
BAD_MANIFESTS = {
    # name: (edit of the parsed manifest, or a function of its text; what the one-line error says)
    "contract obs [10**12]": (_set((*POLICY, "contract", "input", "obs"), [10**12]), "every dimension must be 1.."),
    "contract obs 8 dims": (_set((*POLICY, "contract", "input", "obs"), [1] * 8), "8 dimensions besides the batch"),
    "contract obs 4096x4096x3": (_set((*POLICY, "contract", "input", "obs"), [4096, 4096, 3]), "values per row"),
    "contract obs [true]": (_set((*POLICY, "contract", "input", "obs"), [True]), "must be a shape"),
    "contract noise [10**12]": (_set(("graphs", "policy_sample", "contract", "input", "noise"), [10**12]),
                                "[input] noise: every dimension"),
    "tensor shape [-1, 10**12]": (_set((*POLICY, "inputs", 0, "shape"), [-1, 10**12]),
                                  "inputs[0].shape[1]: 1000000000000 is not -1"),
    "tensor shape [-1, 0]": (_set((*POLICY, "inputs", 0, "shape"), [-1, 0]), "inputs[0].shape[1]: 0 is not -1"),
    "tensor 9 dims": (_set((*POLICY, "outputs", 0, "shape"), [-1] + [1] * 8), "has 9 items, at most 8"),
    "tensor row of 2^25": (_set((*POLICY, "outputs", 1, "shape"), [-1, 8192, 4096]), "values per row"),
    "NaN normaliser mean": (_Text(lambda t: t.replace('"mean": [', '"mean": [NaN, ', 1)), "mean[0] is NaN"),
    "infinite normaliser mean": (_set(("normalization", "mean", 0), 1e39), "normalization.mean[0]: must be <="),
    "infinite normaliser var": (_Text(lambda t: t.replace('"var": [', '"var": [Infinity, ', 1)), "var[0]: must be <="),
    "negative normaliser var": (_set(("normalization", "var", 0), -1.0), "normalization.var[0]: must be >= 0"),
    "normaliser clip 0": (_set(("normalization", "clip"), 0), "normalization.clip: must be > 0"),
    "normaliser of 1000 dims": (_set(("normalization", "mean"), [0.0] * 1000), "has 1000 entries for an observ"),
    "obs bounds of 3 dims": (_set(("env", "obs_low"), [0.0] * 3), "env.obs_low has 3 entries"),
    "hidden sizes 10**9": (_set(("policy_spec", "hidden_sizes"), [10**9]), "hidden_sizes[0]: must be <= 65536"),
    "noise dim 0": (_set(("noise", "dim"), 0), "noise.dim: must be >= 1"),
    "seed -1": (_set(("seeds", "self_check"), -1), "seeds.self_check: must be >= 0"),
    "seed 2**64": (_set(("seeds", "self_check"), 2**64), "seeds.self_check: must be <="),
    "file bytes -1": (_set((*POLICY, "files", "onnx", "bytes"), -1), "bytes: must be >= 0"),
    "duplicate precision": (_Text(lambda t: t.replace("{", '{"precision": "fp16", ', 1)), "'precision' appears twice"),
    "nested 100k deep": (_Text(lambda t: t.replace("{", '{"notes": {"x": ' + DEEP + "}, ", 1)), "nested more than"),
    "5000-digit integer": (_Text(lambda t: t.replace("{", '{"notes": {"x": ' + "9" * 5000 + "}, ", 1)), "5000 digits"),
    "v1: obs_dim 10**12": (_v1(_set(("policy_spec", "obs_dim"), 10**12)), "policy_spec.obs_dim: must be <= 1048576"),
    "v1: NaN mean": (_Text(lambda t: json.dumps(_edited(t, _v1())).replace('"mean": [', '"mean": [NaN, ', 1)), "NaN"),
    "v1: negative var": (_v1(_set(("normalization", "var", 0), -1.0)), "normalization.var[0]: must be >= 0"),
    "v1: log std 1e39": (_v1(_set(("gaussian_log_std",), [1e39])), "gaussian_log_std[0]: must be <="),
}  # fmt: skip
ANOTHER_BUNDLE = {"notes": (_set(("notes",), {"exported": "again"}), "")}  # a valid manifest, another sha256


def _edited(text: str, edit) -> dict:
    manifest = json.loads(text)
    edit(manifest)
    return manifest


def bad_bundle(bundle_root: Path, tmp_path: Path, name: str) -> Path:
    edit, _ = {**BAD_MANIFESTS, **ANOTHER_BUNDLE}[name]
    copy = tmp_path / "bundle"
    shutil.copytree(bundle_root, copy)
    text = (copy / "manifest.json").read_text()
    (copy / "manifest.json").write_text(edit.edit(text) if isinstance(edit, _Text) else json.dumps(_edited(text, edit)))
    return copy


@pytest.mark.parametrize("name", list(BAD_MANIFESTS))
def test_every_bad_manifest_is_one_line_before_anything_is_sized(cartpole_bundle, tmp_path, name):
    copy = bad_bundle(cartpole_bundle.root, tmp_path, name)
    with pytest.raises(BundleError) as info:
        load_bundle(copy)
    message = str(info.value)
    assert BAD_MANIFESTS[name][1] in message and "\n" not in message, message


def test_v1_manifests_get_the_schema_types_and_ranges_but_still_load(cartpole_bundle, tmp_path):
    copy = tmp_path / "v1"
    shutil.copytree(cartpole_bundle.root, copy)
    manifest = _edited((copy / "manifest.json").read_text(), _v1())
    manifest["source"].pop("kind")  # v1 manifests had no source kind, and fields v2 does not know
    manifest["written_by"] = "an older exporter"
    (copy / "manifest.json").write_text(json.dumps(manifest))
    assert load_bundle(copy).contract("policy") == cartpole_bundle.contract("policy")


def test_the_schema_and_the_contract_share_their_limits():
    defs = load_schema()["$defs"]
    assert defs["dim"]["maximum"] == toml_fields.MAX_DIM
    assert defs["tensor"]["properties"]["shape"]["maxItems"] == toml_fields.MAX_RANK + 1
    assert defs["float32"]["maximum"] == toml_fields.FLOAT32_MAX == float(np.finfo(np.float32).max)


# -- the contract TOML (--contract) -----------------------------------------------------------------------------
CONTRACT = """env_id = "Pendulum-v1"
[input]
obs = {obs}
[outputs]
names = ["mean"]
[action]
kind = "gaussian"
mean = "mean"
{std}
squash = "clip"
low = {low}
high = [2.0]
{extra}
"""


@pytest.mark.parametrize(
    ("obs", "std", "low", "extra", "expected"),
    [
        ("[1000000000000]", "log_std = [0.0]", "[-2.0]", "", "[input] obs: every dimension must be 1..1,048,576"),
        ("[1, 1, 1, 1, 1, 1, 1, 1]", "log_std = [0.0]", "[-2.0]", "", "8 dimensions besides the batch"),
        ("[4096, 4096, 3]", "log_std = [0.0]", "[-2.0]", "", "50,331,648 values per row, at most 16,777,216"),
        ("[true]", "log_std = [0.0]", "[-2.0]", "", "must be a shape without the batch dim"),
        ("[3]", "log_std = [0.0]", "[-1e39]", "", "low holds a number beyond float32's range"),
        ("[3]", "log_std = [0.0]", "[-inf]", "", "low must be a list of finite numbers"),
        ("[3]", "log_std = [0.0]", "[nan]", "", "is NaN"),
        ("[3]", "log_std = [0.0]", "[2.0]", "", "must pair up with low < high"),
        ("[3]", "std = [0.0]", "[-2.0]", "", "std must be > 0"),
        ("[3]", "log_std = [0.0]", "[-2.0]", '[state.h]\nshape = [1000000000000]\nnext = "mean"', "[state.h] shape"),
        ("[3]", "log_std = [0.0]", "[-2.0]", "[notes]\nx = " + "9" * 5000, "digits"),
        ("[3]", "log_std = [0.0]", "[-2.0]", "[notes]\nx = " + DEEP, "nested more than"),
    ],
)
def test_a_contract_toml_gets_the_same_range_checks(tmp_path, obs, std, low, extra, expected):
    path = tmp_path / "contract.toml"
    path.write_text(CONTRACT.format(obs=obs, std=std, low=low, extra=extra))
    with pytest.raises(ContractError) as info:
        PolicyContract.from_toml(path)
    assert expected in str(info.value) and "\n" not in str(info.value), str(info.value)
    path.write_text(CONTRACT.format(obs="[3]", std="log_std = [0.0]", low="[-2.0]", extra=""))
    assert PolicyContract.from_toml(path).obs_shape == (3,)


# -- other documents users hand us ---------------------------------------------------------------------------------
def test_a_malformed_baseline_is_one_line(cartpole_bundle, tmp_path):
    from inference.report.baseline import check_baseline

    path = tmp_path / "baseline.json"
    for text, expected in [
        ('{"schema": "msrl-consistency/baseline", "metrics": {"a": {"value": 1}, "a": {"value": 9}}}', "twice"),
        ('{"schema": "msrl-consistency/baseline", "metrics": {"a": {"value": NaN}}}', "metrics.a.value is NaN"),
        ('{"schema": "msrl-consistency/baseline", "metrics": {"a": {"margin_abs": 1}}}', "no number value"),
        ('{"schema": "msrl-consistency/baseline", "metrics": {"a": {"value": 1, "margin_rel": -1}}}', "margin_rel"),
        ('{"schema": "msrl-consistency/baseline", "metrics": [1]}', "metrics must be an object"),
        ("[1, 2]", "is not a baseline file"),
    ]:
        path.write_text(text)
        with pytest.raises(UsageError) as info:
            check_baseline(path, None)  # type: ignore[arg-type]  - refused before the result is looked at
        assert expected in str(info.value), (text, str(info.value))
    proc = run_module("msrl_consistency.verify", "--bundle", str(cartpole_bundle.root), "--env-id", "CartPole-v1",
                      "--baseline", str(path), "--out", str(tmp_path / "r"))  # fmt: skip
    assert proc.returncode == 2 and "is not a baseline file" in proc.stderr
    assert "reference" not in proc.stderr  # refused before verify built anything


def test_a_run_record_with_a_repeated_key_is_refused(tmp_path):
    from msrl_consistency.artifacts import run_dir as rd

    (tmp_path / rd.RUN_JSON).write_text('{"schema": "x", "env_id": "CartPole-v1", "env_id": "Pendulum-v1"}')
    with pytest.raises(UsageError, match="key 'env_id' appears twice"):
        rd.read_run_json(tmp_path)
    (tmp_path / rd.RUN_JSON).write_text("[]")
    with pytest.raises(UsageError, match="unsupported run schema None"):
        rd.read_run_json(tmp_path)


# -- golden files --------------------------------------------------------------------------------------------------
def golden_file(path: Path, bundle, manifest_sha256: str | None, meta_text: str | None = None) -> Path:
    """A small golden file of ``bundle``'s graphs (a few rows of zeros), recorded from the manifest hash given."""
    n, arrays = 4, {}
    arrays["obs"] = np.zeros((n, 4), np.float32)
    arrays["source"] = np.array(["stats"] * n).astype("U8")
    arrays["noise/policy_sample"] = np.zeros((n, 2), np.float32)
    for graph in bundle.graphs:
        for out in bundle.graph(graph)["outputs"]:
            arrays[f"out/{graph}/{out['name']}"] = np.zeros((n, *out["shape"][1:]), out["dtype"])
    meta = {"format": "msrl-consistency/golden", "version": 3, "env": "CartPole-v1", "seed": 0, "episodes": 0,
            "manifest_sha256": manifest_sha256}  # fmt: skip
    arrays["meta"] = np.array(meta_text if meta_text is not None else json.dumps(meta))
    np.savez_compressed(path, **arrays)
    return path


def test_a_golden_file_of_another_bundle_is_refused_naming_both_hashes(cartpole_bundle, tmp_path):
    from inference.compare.golden import load_golden

    mine = sha256_file(cartpole_bundle.root / "manifest.json")
    theirs = "ab" * 32
    with pytest.raises(UsageError) as info:
        load_golden(golden_file(tmp_path / "g.npz", cartpole_bundle, theirs), cartpole_bundle)
    message = str(info.value)
    assert "recorded from another bundle" in message and theirs[:12] in message and mine[:12] in message
    assert load_golden(golden_file(tmp_path / "g.npz", cartpole_bundle, mine), cartpole_bundle).origin_unchecked is None
    with pytest.raises(UsageError, match="key 'seed' appears twice"):
        load_golden(golden_file(tmp_path / "g.npz", cartpole_bundle, mine, '{"seed": 0, "seed": 1}'), cartpole_bundle)


@pytest.mark.parametrize(("damage", "message"), [
    ("truncated", "is not a golden file written by verify --save-golden (BadZipFile"),
    ("no-output", "field 'out/policy/logits' is missing"),
    ("fewer-rows", "field 'source' has 4 rows, 'obs' 2"),
    ("narrow-obs", "field 'obs' has rows of shape [3], the bundle's 'policy' takes [4]"),
])  # fmt: skip
def test_a_damaged_golden_file_is_one_line_naming_the_file_and_the_field(cartpole_bundle, tmp_path, damage, message):
    from inference.compare.golden import load_golden

    path = golden_file(tmp_path / "g.npz", cartpole_bundle, sha256_file(cartpole_bundle.root / "manifest.json"))
    if damage == "truncated":
        path.write_bytes(path.read_bytes()[:200])
    else:
        arrays = dict(np.load(path))
        if damage == "no-output":
            del arrays["out/policy/logits"]
        elif damage == "fewer-rows":
            arrays["obs"] = arrays["obs"][:2]
        else:
            arrays["obs"] = arrays["obs"][:, :3]
        np.savez(path, **arrays)
    with pytest.raises(UsageError) as info:
        load_golden(path, cartpole_bundle)
    assert message in str(info.value) and str(path) in str(info.value)


def test_a_golden_file_without_a_manifest_hash_still_loads_with_a_warning(cartpole_bundle, tmp_path):
    """Golden files of a MindIR outside a bundle record ``null``: kept readable, and the report says so."""
    from inference.compare.golden import load_golden

    reference = load_golden(golden_file(tmp_path / "g.npz", cartpole_bundle, None), cartpole_bundle)
    assert "records no manifest hash" in reference.origin_unchecked


def deploy(module: str, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """The deploy side's commands in a process of their own, as on a box without MindSpore; ours in this one."""
    if module.startswith("msrl_consistency."):
        return run_module(module, *args, cwd=cwd)
    return subprocess.run([sys.executable, "-m", module, *args], capture_output=True, text=True, cwd=cwd, timeout=600)


def assert_one_line(proc: subprocess.CompletedProcess[str], expected: str, case: str) -> None:
    """Exit 2 and one ``error:`` line naming the fault, and nothing else on stderr (``--quiet`` where a command
    says what it starts)."""
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2, f"{case}: rc {proc.returncode}\n{proc.stderr[-3000:]}"
    assert len(lines) == 1 and lines[0].startswith("error: ") and expected in lines[0], f"{case}: {proc.stderr[-3000:]}"


def test_the_deploy_check_refuses_another_bundles_golden_file(cartpole_bundle, tmp_path):
    golden = golden_file(tmp_path / "g.npz", cartpole_bundle, "cd" * 32)
    proc = deploy("inference.check", str(cartpole_bundle.root), "--golden", str(golden), "--out", str(tmp_path / "r"),
                  "--quiet", cwd=tmp_path)  # fmt: skip
    assert_one_line(proc, f"was recorded from another bundle (manifest sha256 {'cd' * 6}…)", "check")
    assert not (tmp_path / "r").exists()


@pytest.mark.slow
@pytest.mark.parametrize("name", ["nested 100k deep", "contract obs [10**12]", "NaN normaliser mean",
                                  "duplicate precision", "v1: obs_dim 10**12"])  # fmt: skip
def test_every_command_says_what_is_wrong_with_a_manifest_in_one_line(cartpole_bundle, cartpole_ckpt, tmp_path, name):
    """The deploy commands and verify, on each bad manifest: exit 2 and one ``error:`` line, never a traceback,
    never exit 1 (which means "inconsistent"), never an allocation sized by the manifest."""
    copy = bad_bundle(cartpole_bundle.root, tmp_path, name)
    golden = golden_file(tmp_path / "g.npz", cartpole_bundle, None)
    commands = {
        "check": ("inference.check", str(copy), "--golden", str(golden), "--out", str(tmp_path / "rc")),
        "play": ("inference.play", str(copy), "--episodes", "1"),
        "bench": ("inference.bench", str(copy), "--batch", "1", "--loops", "3", "--json", str(tmp_path / "b.json")),
        "doctor": ("inference.doctor", str(copy)),
        "verify": ("msrl_consistency.verify", "--bundle", str(copy), "--ckpt", str(cartpole_ckpt), "--out",
                   str(tmp_path / "rv"), "--observations", "100", "--episodes", "1"),
    }  # fmt: skip
    for command, args in commands.items():
        assert_one_line(deploy(*args, cwd=tmp_path), BAD_MANIFESTS[name][1], f"{name}: {command}")


@pytest.mark.slow
def test_a_recorded_golden_file_checks_only_against_its_own_bundle(cartpole_bundle, cartpole_ckpt, tmp_path):
    """The golden file of one bundle against another bundle of the same env is exit 2 naming both hashes (it used to
    fail the check as "network: weights or layers differ", exit 1); one without a hash passes with a warning."""
    from inference.compare.golden import save_golden
    from inference.compare.verifier import VerifyOptions
    from msrl_consistency.api import verify_run

    result = verify_run(cartpole_bundle, cartpole_ckpt, VerifyOptions(observations=200, episodes=1, seed=3,
                                                                      runtimes=("onnxruntime",)))  # fmt: skip
    golden = tmp_path / "golden.npz"
    save_golden(golden, result.reference, cartpole_bundle, "CartPole-v1")
    other = bad_bundle(cartpole_bundle.root, tmp_path, "notes")
    args = ("--golden", str(golden), "--runtimes", "onnxruntime", "--quiet")
    proc = deploy("inference.check", str(other), *args, "--out", str(tmp_path / "r1"), cwd=tmp_path)
    mine = sha256_file(other / "manifest.json")[:12]
    theirs = sha256_file(cartpole_bundle.root / "manifest.json")[:12]
    expected = f"was recorded from another bundle (manifest sha256 {theirs}…), not {other} ({mine}…)"
    assert_one_line(proc, expected, "check")
    proc = deploy("inference.check", str(cartpole_bundle.root), *args, "--out", str(tmp_path / "r2"), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    with np.load(golden) as data:
        arrays = dict(data)
    meta = json.loads(str(arrays["meta"]))
    arrays["meta"] = np.array(json.dumps({**meta, "manifest_sha256": None}))
    np.savez_compressed(golden, **arrays)
    proc = deploy("inference.check", str(cartpole_bundle.root), *args, "--out", str(tmp_path / "r3"), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    checks = json.loads((tmp_path / "r3" / "report.json").read_text())["checks"]
    origin = next(c for c in checks if c["name"] == "golden_origin")
    assert origin["status"] == "warn" and "records no manifest hash" in origin["summary"]
