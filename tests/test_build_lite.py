"""build_lite.sh against a Lite SDK at a user-given path: layouts, version detection, the runner's JSON.

The SDK used is the PyPI 2.0.0 wheel's, relocated: headers copied and libraries linked file by file into the
official tarball layout (``mindspore-lite-X.Y.Z-linux-x64/runtime/{include,lib}``) or the wheel layout
(``mindspore_lite/{include,lib,version.py}``), so nothing of ``.lite/`` is reused but the library bytes.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from inference.lite.client import LiteRunner
from inference.lite.common import runner_path

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "inference" / "lite" / "build_lite.sh"
PYPI_SDK = REPO / ".lite" / "sdk"

pytestmark = pytest.mark.skipif(
    not (PYPI_SDK / "include" / "api" / "model.h").is_file(), reason="no PyPI Lite SDK in .lite/sdk (run `make lite`)"
)


def _relocate(dest: Path, layout: str, version_py: str | None = None) -> Path:
    """The PyPI SDK at another path, in the tarball or the wheel layout."""
    base = dest / "runtime" if layout == "tarball" else dest
    shutil.copytree(PYPI_SDK / "include", base / "include")
    (base / "lib").mkdir(parents=True)
    for lib in (PYPI_SDK / "lib").iterdir():
        (base / "lib" / lib.name).symlink_to(lib)
    if version_py is not None:
        (dest / "version.py").write_text(f"__version__ = '{version_py}'\n")
    return dest


def build(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("MSRL_LITE")}
    full_env.update(env or {})
    return subprocess.run(
        ["bash", str(SCRIPT), *args], capture_output=True, text=True, timeout=600, env=full_env, cwd="/"
    )


def detect(sdk: Path, env: dict[str, str] | None = None) -> dict:
    proc = build("--sdk", str(sdk), "--detect", env=env)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


@pytest.fixture(scope="module")
def tarball_build(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, subprocess.CompletedProcess[str]]:
    """One build against a relocated tarball SDK, named as a release inline runs were not tested on (the 2.0.0
    libraries, named 2.3.1): the relocation test and the inline-default test both read it (a build is ~20 s)."""
    root = tmp_path_factory.mktemp("sdk")
    sdk = _relocate(root / "mindspore-lite-2.3.1-linux-x64", "tarball")
    out = root / "out" / "bin"
    return sdk, out, build("--sdk", str(sdk), "--out", str(out), "--runner-only")


@pytest.mark.slow
def test_builds_against_a_relocated_tarball_sdk(tarball_build, tmp_path: Path) -> None:
    sdk, out, proc = tarball_build
    assert proc.returncode == 0, proc.stderr
    info = json.loads((out / "msrl-lite-runner.json").read_text())
    assert info["sdk"] == str(sdk) and info["sdk_layout"] == "tarball" and info["arch"] == "x86_64"
    assert info["lite_version"] == "2.3.1" and info["lite_version_source"] == "directory name"
    # The MindIR limit is Lite's own answer (its refusal of a v2^31-1 header), not a table.
    assert info["max_mind_ir_version"] == 1 and info["mind_ir_rule"].startswith("probe:")
    assert info["converter"] is None and not (out / "msrl-lite-convert").exists()
    runner = out / "msrl-lite-runner"
    assert os.access(runner, os.X_OK) and os.access(out / "msrl-lite-runner-test", os.X_OK)
    # The runner links the relocated libraries (DT_RPATH), not .lite/sdk.
    dyn = subprocess.run(["readelf", "-d", str(runner)], capture_output=True, text=True).stdout
    assert f"[{sdk}/runtime/lib]" in dyn and str(PYPI_SDK) not in dyn
    with LiteRunner(_tiny_ms(tmp_path), runner=runner) as r:
        assert r.lite_version == "2.3.1" and r.infer(np.zeros((3, 4), np.float32))["logits"].shape == (3, 2)
    # A second run with nothing changed rebuilds nothing.
    again = build("--sdk", str(sdk), "--out", str(out), "--runner-only")
    assert again.returncode == 0 and "up to date" in again.stderr


def _tiny_ms(tmp_path: Path) -> Path:
    """A small .ms converted by the default build's converter (the deploy build skips the converter)."""
    from test_lite_runner import CONVERTER, _convert, _mlp_onnx

    if not CONVERTER.is_file():
        pytest.fail(f"{CONVERTER} not built (run `make lite`)")
    _mlp_onnx(tmp_path / "m.onnx")
    res = _convert(tmp_path / "m.onnx", tmp_path / "m.ms")
    assert res.returncode == 0, res.stderr
    return tmp_path / "m.ms"


def test_version_detection_order(tmp_path: Path) -> None:
    """version.h beats version.py beats the directory name; the wheel layout is recognised."""
    wheel = _relocate(tmp_path / "mindspore-lite-9.9.9-linux-x64", "wheel", version_py="2.0.0")
    got = detect(wheel)
    assert (got["sdk_layout"], got["lite_version"], got["lite_version_source"]) == ("wheel", "2.0.0", "version.py")
    assert got["runtime_library"] == "libmindspore-extendrt_python.so"
    (wheel / "include" / "version.h").write_text(
        "const int ms_version_major = 2;\nconst int ms_version_minor = 3;\nconst int ms_version_revision = 1;\n"
    )
    got = detect(wheel)
    assert (got["lite_version"], got["lite_version_source"]) == ("2.3.1", "include/version.h")
    bare = _relocate(tmp_path / "sdk", "wheel")
    assert detect(bare, {"MSRL_LITE_SDK_VERSION": "2.0.0"})["lite_version_source"] == "MSRL_LITE_SDK_VERSION"


def test_bad_sdks_fail_with_one_error_line(tmp_path: Path) -> None:
    not_sdk = tmp_path / "empty"
    not_sdk.mkdir()
    proc = build("--sdk", str(not_sdk), "--detect")
    assert proc.returncode == 1 and proc.stderr.startswith("error: ") and "is not a Lite SDK" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
    bare = _relocate(tmp_path / "sdk", "wheel")  # no version anywhere
    proc = build("--sdk", str(bare), "--detect")
    assert proc.returncode == 1 and "set MSRL_LITE_SDK_VERSION" in proc.stderr
    proc = build("--sdk", str(tmp_path / "missing"))
    assert proc.returncode == 1 and "not found" in proc.stderr


def test_cross_compiler_mismatch_is_refused(tmp_path: Path) -> None:
    """An aarch64 compiler against an x86_64 SDK (or the reverse) is named before anything compiles."""
    fake = tmp_path / "aarch64-linux-gnu-g++"
    fake.write_text('#!/bin/sh\n[ "$1" = -dumpmachine ] && echo aarch64-linux-gnu && exit 0\nexit 1\n')
    fake.chmod(0o755)
    sdk = _relocate(tmp_path / "mindspore-lite-2.0.0-linux-x64", "tarball")
    proc = build("--sdk", str(sdk), "--out", str(tmp_path / "out"), env={"CXX": str(fake)})
    assert proc.returncode == 1
    assert "the SDK is built for x86_64 but" in proc.stderr and "aarch64-linux-gnu" in proc.stderr


def test_default_build_records_the_pypi_sdk() -> None:
    info = json.loads(runner_path().with_name("msrl-lite-runner.json").read_text())
    assert info["lite_version"] == "2.0.0" and info["lite_version_source"] == "version.py"
    assert info["max_mind_ir_version"] == 1 and info["converter"] == "msrl-lite-convert"


def test_inline_runs_are_on_by_default_only_for_tested_builds(tmp_path: Path) -> None:
    """The build decides from the SDK's version and architecture against its list of tested builds: PyPI's 2.0.0
    x86_64 runs graphs on the calling thread by default, another release does not (and says how to ask)."""
    tested = detect(_relocate(tmp_path / "mindspore-lite-2.0.0-linux-x64", "tarball"))["inline"]
    assert tested["default"] is True and "2.0.0 x86_64" in tested["tested"]
    assert "MSRL_LITE_INLINE=0" in tested["why"]
    other = detect(_relocate(tmp_path / "mindspore-lite-2.3.1-linux-x64", "tarball"))["inline"]
    assert other["default"] is False and other["tested"] == tested["tested"]
    assert other["why"].startswith("Lite 2.3.1 on x86_64 is not a build inline runs were tested on")
    assert "MSRL_LITE_INLINE=1" in other["why"]


@pytest.mark.slow
def test_a_build_not_tested_inline_hands_off_unless_asked(tarball_build, tmp_path: Path) -> None:
    """Built for a Lite release the inline runs were not tested on, the runner and the in-process library both leave
    the graph on Lite's actor thread; MSRL_LITE_INLINE=1 asks for inline runs, and both obey it."""
    _sdk, out, proc = tarball_build  # the 2.0.0 libraries, named 2.3.1
    assert proc.returncode == 0, proc.stderr
    record = json.loads((out / "msrl-lite-runner.json").read_text())
    assert record["lite_version"] == "2.3.1" and record["inline"]["default"] is False
    assert "inline runs by default: false" in proc.stderr
    model = _tiny_ms(tmp_path)
    runner = out / "msrl-lite-runner"
    with LiteRunner(model, runner=runner) as r, LiteRunner(model, runner=runner, inline=True) as asked:
        for lite in (r, asked):
            lite.infer(np.zeros((3, 4), np.float32))
        assert (r.runs_inline, asked.runs_inline) == (False, True)
    code = (
        "import json, os, sys; sys.modules['mindspore'] = None\n"
        "import numpy as np\nfrom inference.lite.inprocess import LiteModel\n"
        f"m = LiteModel({str(model)!r}); m.infer(np.zeros((3, 4), np.float32))\n"
        "print(json.dumps([m.runs_inline, m.inline_stats()['requested']]))"
    )
    seen = {}
    for asked_env in ("", "1"):
        env = {k: v for k, v in os.environ.items() if k != "MSRL_LITE_INLINE"}
        env.update({"MSRL_LITE_RUNNER": str(runner), "PYTHONPATH": str(REPO)})
        if asked_env:
            env["MSRL_LITE_INLINE"] = asked_env
        run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
        assert run.returncode == 0, run.stderr
        seen[asked_env] = json.loads(run.stdout.splitlines()[-1])
    assert seen == {"": [False, False], "1": [True, True]}


# Measured numbers belong in bench/results/ (dated, with the CPU and the command), not in the comments of the code.
MEASUREMENT = re.compile(r"\d(?:[\d.,]*\d)?(?:-\d[\d.]*)? ?(?:µs|us|ms|ns)\b|\b\d+(?:\.\d+)?x (?:faster|slower)\b")


def test_the_lite_sources_carry_no_measured_numbers() -> None:
    sources = [*(REPO / "inference" / "lite" / "runner").iterdir(), SCRIPT, *(REPO / "inference" / "lite").glob("*.py"),
               *(REPO / "inference" / "runtimes").glob("lite*.py")]  # fmt: skip
    found = [f"{p.relative_to(REPO)}:{n}: {line.strip()}" for p in sources if p.suffix in (".cc", ".h", ".py", ".sh")
             for n, line in enumerate(p.read_text().splitlines(), 1) if MEASUREMENT.search(line)]  # fmt: skip
    assert found == []
