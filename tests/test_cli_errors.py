"""Bad input to export and verify: exit 2 with one ``error:`` line, before any work, nothing written.

Exit 1 from verify only ever means "the runtimes disagree"; each case here was a traceback or a late failure
(some with exit 1) before ``errors.describe`` became the one place that maps exceptions to exit codes.
"""

from __future__ import annotations

import importlib
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from cli_inprocess import run_module


def cli(module: str, *args: str) -> subprocess.CompletedProcess[str]:
    return run_module(f"msrl_consistency.{module}", *args)


def assert_usage_error(proc: subprocess.CompletedProcess[str], message: str) -> None:
    errors = [line for line in proc.stderr.splitlines() if "error: " in line]  # ours, or argparse's usage error
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert len(errors) == 1 and message in errors[0], proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr and "reference ms-cell" not in proc.stderr  # refused before any work


def edited_bundle(bundle, tmp_path: Path, drop: tuple[str, ...]) -> Path:
    copy = tmp_path / "edited"
    shutil.copytree(bundle.root, copy)
    manifest = json.loads((copy / "manifest.json").read_text())
    for key in drop:
        manifest.pop(key)
    (copy / "manifest.json").write_text(json.dumps(manifest))
    return copy


@pytest.mark.slow
def test_verify_refuses_bad_arguments_before_any_work(cartpole_bundle, cartpole_ckpt, pendulum_ckpt, tmp_path):
    base = ["--bundle", str(cartpole_bundle.root), "--ckpt", str(cartpole_ckpt), "--out", str(tmp_path / "r")]
    assert_usage_error(cli("verify", *base, "--runtimes", "nonexistent"), "unknown runtime 'nonexistent'")
    assert_usage_error(cli("verify", *base, "--tol", "typo=1e-3,1e-3"), "unknown output(s) typo")
    assert_usage_error(cli("verify", *base, "--tol", "logits=-1,0"), "non-negative")
    assert_usage_error(cli("verify", *base, "--observations", "3"), "--observations must be >= 16")
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    assert_usage_error(cli("verify", *base[:4], "--out", str(blocker / "reports")), "cannot create the report dir")
    assert_usage_error(cli("verify", *base[:2], "--ckpt", str(pendulum_ckpt)), "was trained on Pendulum-v1")
    assert not (tmp_path / "r" / "report.json").exists()


@pytest.mark.slow
def test_verify_of_a_trainer_manifest_without_env_or_normalisation(cartpole_bundle, cartpole_ckpt, tmp_path):
    """Our trainer's manifest always records the env and the normalisation: one without them is refused (exit 2,
    naming the field), never verified on defaults the verifier picks itself."""
    for fields in (("env_id", "env"), ("normalization",)):
        edited = edited_bundle(cartpole_bundle, tmp_path, fields)
        args = ["--bundle", str(edited), "--ckpt", str(cartpole_ckpt), "--out", str(tmp_path / "r")]
        assert_usage_error(cli("verify", *args, "--env-id", "CartPole-v1"), f"field {fields[0]}: required field")
        shutil.rmtree(edited)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--check-samples", "0"], "--check-samples must be >= 16"),
        (["--formats", "mindir,tflite"], "--formats must be a subset"),
        (["--cell", "nope:make"], "--cell needs --contract"),
    ],
)
def test_export_refuses_bad_arguments(cartpole_ckpt, tmp_path, extra, message):
    assert_usage_error(cli("export", "--ckpt", str(cartpole_ckpt), "--out", str(tmp_path / "b"), *extra), message)
    assert not (tmp_path / "b").exists()


@pytest.mark.slow
def test_export_to_an_unwritable_place_is_a_usage_error(cartpole_ckpt, tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    assert_usage_error(cli("export", "--ckpt", str(cartpole_ckpt), "--out", str(blocker / "b")), "cannot write")
    assert blocker.read_text() == ""


@pytest.mark.slow
def test_export_on_a_full_disk_is_one_line_and_leaves_nothing(cartpole_ckpt, tmp_path):
    """Files may not grow past 20 kB (RLIMIT_FSIZE: writes fail as on a full disk)."""
    code = (
        "import resource, signal\n"
        "signal.signal(signal.SIGXFSZ, signal.SIG_IGN)\n"
        "resource.setrlimit(resource.RLIMIT_FSIZE, (20000, 20000))\n"
        "from inference.errors import run_cli\n"
        "from msrl_consistency.export import main\n"
        "run_cli(main)\n"
    )
    out = tmp_path / "bundles" / "b"
    proc = subprocess.run([sys.executable, "-c", code, "--ckpt", str(cartpole_ckpt), "--out", str(out)],
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    assert_usage_error(proc, "cannot write the bundle")
    assert list(out.parent.iterdir()) == []  # no bundle, no temp dir


@pytest.mark.slow
def test_export_takes_a_run_directory_for_its_checkpoint(cartpole_ckpt, tmp_path):
    proc = cli("export", "--ckpt", str(cartpole_ckpt.parent), "--out", str(tmp_path / "b"), "--formats", "mindir")
    assert proc.returncode == 0, proc.stderr[-2000:]
    source = json.loads((tmp_path / "b" / "manifest.json").read_text())["source"]
    assert source["checkpoint"] == str(cartpole_ckpt.resolve())
    assert_usage_error(cli("export", "--ckpt", str(tmp_path / "b"), "--out", str(tmp_path / "c")),
                       "directory without a checkpoint.ckpt")  # fmt: skip
    assert_usage_error(cli("verify", "--bundle", str(tmp_path / "b"), "--ckpt", str(tmp_path / "nowhere")),
                       "file not found")  # fmt: skip
    assert not (tmp_path / "c").exists()


HELP_LISTS = {
    "msrl_consistency.train": "--graph-kernel",
    "msrl_consistency.export": "--ckpt",
    "msrl_consistency.verify": "--mindir",
    "inference.bench": "--batch",
    "inference.check": "--golden",
    "inference.doctor": "--runner",
    "inference.play": "--episodes",
    "inference.build_runner": "--sdk",
}


@pytest.mark.parametrize("module", sorted(HELP_LISTS))
def test_every_command_prints_its_help(module, capfd):
    """``--help`` exits 0 and lists the command's options: train's help is built from TrainConfig's docstrings,
    and a ``%`` in one of them once made argparse raise instead of printing."""
    try:
        code = importlib.import_module(module).main(["--help"])  # build_runner returns its shell script's code
    except SystemExit as stop:
        code = stop.code
    out = capfd.readouterr().out
    assert code == 0 and HELP_LISTS[module] in out and "Traceback" not in out
    if module == "msrl_consistency.train":
        assert "20-40% off" in out


def test_a_mistyped_bundle_path_is_named_as_typed(cartpole_bundle, tmp_path):
    """``bundles/cartpol`` is said not to exist, not reported as its parent ``bundles`` not being a bundle."""
    typo = cartpole_bundle.root.parent / (cartpole_bundle.root.name[:-1] + "x")
    proc = run_module("inference.play", str(typo), "--episodes", "1")
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert f"{typo} does not exist" in proc.stderr and f"{typo.parent} is not a bundle" not in proc.stderr


@pytest.mark.parametrize(("module", "args"), [
    ("msrl_consistency.train", ["--total-steps", "abc"]), ("msrl_consistency.train", ["--bogus-flag"]),
    ("msrl_consistency.verify", ["--observations", "abc"]), ("msrl_consistency.export", ["--precision", "fp8"]),
    ("inference.play", ["bundles/x", "--episodes", "abc"]),
])  # fmt: skip
def test_a_mistyped_argument_is_one_error_line_not_the_usage_block(module, args):
    proc = run_module(module, *args)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr
    assert lines[0].startswith(("error: argument", "error: unrecognized")), proc.stderr
    assert f"(see python -m {module} --help)" in lines[0] and "usage:" not in proc.stderr
