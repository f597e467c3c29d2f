"""inference.doctor: this box against a bundle's pins; exit 0 compatible, 1 an incompatible pair, 2 bad input."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import lite_build
import numpy as np
import pytest

import inference.doctor.lite_rows as doctor_lite
from inference.bundle import sha256_file
from inference.doctor import INCOMPATIBLE, OK, WARN, device_check, inline_bits_check
from inference.lite.common import runner_available
from inference.lite.runner_info import runner_info
from inference.machine.facts import parse_cpuinfo, simd_level

pytestmark = pytest.mark.skipif(not runner_available()[0], reason=runner_available()[1])


def doctor(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    # MindSpore is made unimportable: the doctor reads its version from package metadata only.
    code = (
        "import sys; sys.modules['mindspore'] = None\nfrom inference.doctor import main\nsys.exit(main(sys.argv[1:]))"
    )
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=120, env=env)


def _copy(bundle_root: Path, tmp_path: Path, edit=None) -> Path:
    copy = tmp_path / "bundle"
    shutil.copytree(bundle_root, copy)
    if edit is not None:
        manifest = json.loads((copy / "manifest.json").read_text())
        edit(manifest, copy)
        (copy / "manifest.json").write_text(json.dumps(manifest))
    return copy


def _by_name(report: dict) -> dict[str, dict]:
    return {c["name"]: c for c in report["checks"]}


def test_genuine_bundle_is_compatible_through_the_ms_route(cartpole_bundle):
    proc = doctor(str(cartpole_bundle.root), "--json")
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    checks = _by_name(report)
    assert report["compatible"] and report["environment"]["lite"]["max_mind_ir_version"] == lite_build.MAX_MINDIR
    assert checks["policy.ms"]["status"] == OK and checks["policy_sample.ms"]["status"] == OK
    # MindSpore 2.10 writes MindIR v3; a Lite that loads less (2.0.0: <= v1) is a warning only: the .ms route works.
    old_lite = lite_build.MAX_MINDIR < 3
    assert checks["policy.mindir"]["status"] == ("warn" if old_lite else OK)
    assert not old_lite or "other route is used" in checks["policy.mindir"]["detail"]
    assert checks["policy.mindir"]["bundle"] == "MindIR v3"
    assert report["environment"]["mindspore"] == cartpole_bundle.manifest["exporter"]["mindspore"]
    table = doctor(str(cartpole_bundle.root))
    assert table.returncode == 0 and table.stdout.rstrip().endswith("compatible")


def test_the_doctor_says_where_lite_runs_the_graph(cartpole_bundle):
    """One seeded call in the doctor's own process: on the calling thread, or (hand-off restored) a warning."""
    check = _by_name(json.loads(doctor(str(cartpole_bundle.root), "--json").stdout))["lite-in-process"]
    assert (check["status"], check["here"], check["bundle"]) == (OK, "on the calling thread", "policy.ms")
    env = {**os.environ, "MSRL_LITE_INLINE": "0"}
    proc = doctor(str(cartpole_bundle.root), "--json", env=env)
    check = _by_name(json.loads(proc.stdout))["lite-in-process"]
    assert proc.returncode == 0 and (check["status"], check["here"]) == ("warn", "on Lite's actor thread")
    assert "two thread wake-ups" in check["detail"]


def test_the_doctor_runs_the_bundle_inline_and_handed_off_and_compares_the_bits(cartpole_bundle):
    """Every graph opened both ways Lite runs it here, whatever the default: a row in the table and the JSON."""
    for env in (None, {**os.environ, "MSRL_LITE_INLINE": "0"}):  # a hand-off default still compares both ways
        proc = doctor(str(cartpole_bundle.root), "--json", env=env)
        check = _by_name(json.loads(proc.stdout))["lite-inline-vs-handoff"]
        assert proc.returncode == 0 and check["status"] == OK, check
        assert check["here"] == "bitwise equal (in this process)" and check["bundle"] == "policy.ms, policy_sample.ms"
        assert check["detail"].startswith("bitwise equal: 9 calls per way (64 seeded rows as a batch and 8 singly)")
    table = doctor(str(cartpole_bundle.root)).stdout
    assert "lite-inline-vs-handoff" in table and "inline runs on by default (Lite 2.0.0 on x86_64" in table


class _Fake:
    """A model whose inline answer differs from the hand-off's in one bit of one row (or runs on Lite's thread)."""

    def __init__(self, inline: bool, differ: bool, takes: bool = True) -> None:
        self.inline, self.differ, self.runs_inline = inline, differ, inline and takes

    def infer(self, obs: np.ndarray, *noise: np.ndarray) -> dict[str, np.ndarray]:
        logits = np.repeat(obs.sum(1, keepdims=True), 2, 1).astype(np.float32)
        if self.inline and self.differ and len(obs) > 3:
            logits[3, 1] = np.nextafter(logits[3, 1], np.float32(np.inf))
        return {"logits": logits}

    def close(self) -> None:
        pass


def test_a_difference_between_inline_and_hand_off_is_a_warning_with_the_evidence(cartpole_bundle, monkeypatch):
    info = runner_info()
    monkeypatch.setattr(doctor_lite, "open_lite", lambda path, inline: _Fake(inline, differ=True))
    check = inline_bits_check(cartpole_bundle, info)
    assert check.status == WARN and check.here.startswith("differ") and "inline and hand-off differ" in check.detail
    assert check.evidence and check.evidence[0].startswith("policy:logits (batch): 1 of 64 rows differ, max |diff|")
    assert "row 3: " in check.evidence[0] and "inline vs" in check.evidence[0]
    monkeypatch.setattr(doctor_lite, "open_lite", lambda path, inline: _Fake(inline, differ=False, takes=False))
    check = inline_bits_check(cartpole_bundle, info)
    assert check.status == WARN and check.here.startswith("inline does not take")
    assert "does not bind to libmsrl-lite-inline.so" in check.detail


def test_a_failed_ms_is_a_row_of_the_doctors_table_not_an_error(cartpole_bundle, tmp_path):
    def fail_ms(manifest, _copy):
        manifest["graphs"]["policy"]["files"]["ms"]["failed"] = "lite: outputs differ from the Cell"

    proc = doctor(str(_copy(cartpole_bundle.root, tmp_path, fail_ms)), "--json")
    assert proc.returncode in (0, 1), proc.stderr  # a verdict, never a usage error
    check = _by_name(json.loads(proc.stdout))["lite-in-process"]
    assert check["status"] == "info" and "policy.ms failed at export: lite: outputs differ" in check["detail"]
    checks = json.loads(proc.stdout)["checks"]
    route = [c for c in checks if c["name"] == "policy.ms" and c["bundle"] == "failed at export"]
    assert route and route[0]["detail"] == "lite: outputs differ from the Cell"


@pytest.mark.skipif(lite_build.MAX_MINDIR >= 3, reason="this Lite reads the MindIR v3 MindSpore 2.10 writes")
def test_mindir_too_new_and_no_ms_is_incompatible(cartpole_bundle, tmp_path):
    def drop_ms(m, copy):
        for graph in m["graphs"].values():
            graph["files"]["ms"] = {"skipped": "removed for the test"}
            (copy / f"{graph['files']['mindir']['file'].rsplit('.', 1)[0]}.ms").unlink()

    proc = doctor(str(_copy(cartpole_bundle.root, tmp_path, drop_ms)))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert proc.stdout.rstrip().splitlines()[-1] == "incompatible: policy.mindir, policy_sample.mindir"
    assert f"Lite {lite_build.VERSION} loads MindIR <= v{lite_build.MAX_MINDIR}" in proc.stdout


def test_ms_from_another_lite_release_is_incompatible(cartpole_bundle, tmp_path):
    """A .ms records its converter's release; one from Lite 1.9 cannot back up a MindIR Lite 2.0 refuses."""

    def older_converter(m, copy):
        for graph in m["graphs"].values():
            entry = graph["files"]["ms"]
            path = copy / entry["file"]
            data = path.read_bytes()
            ours, older = f"MindSpore Lite {lite_build.VERSION}".encode(), b"MindSpore Lite 1.9.0"
            assert ours in data and len(ours) == len(older)  # same length: the flatbuffer's offsets hold
            path.write_bytes(data.replace(ours, older))
            entry["sha256"] = sha256_file(path)

    proc = doctor(str(_copy(cartpole_bundle.root, tmp_path, older_converter)), "--json")
    assert proc.returncode == 1, proc.stderr
    checks = _by_name(json.loads(proc.stdout))
    assert checks["policy.ms"]["status"] == INCOMPATIBLE and checks["policy.ms"]["bundle"] == "converted by Lite 1.9.0"
    assert checks["policy.mindir"]["status"] == INCOMPATIBLE


@pytest.mark.parametrize("case", ["missing", "corrupt", "tampered", "runner"])
def test_bad_input_exits_2_with_one_line(cartpole_bundle, tmp_path, case):
    args = [str(tmp_path / "nope")]
    if case == "corrupt":
        copy = _copy(cartpole_bundle.root, tmp_path)
        (copy / "manifest.json").write_text("{not json")
        args = [str(copy)]
    elif case == "tampered":
        copy = _copy(cartpole_bundle.root, tmp_path)
        (copy / "policy.ms").write_bytes(b"\0" * 64)
        args = [str(copy)]
    elif case == "runner":
        args = [str(cartpole_bundle.root), "--runner", str(tmp_path / "no-runner")]
    proc = doctor(*args)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.startswith("error: ") and len(proc.stderr.strip().splitlines()) == 1


def test_cann_toolkit_is_read_from_its_install_info(tmp_path):
    latest = tmp_path / "ascend-toolkit" / "latest"
    (latest / "x86_64-linux").mkdir(parents=True)
    (latest / "x86_64-linux" / "ascend_toolkit_install.info").write_text(
        "package_name=Ascend-cann-toolkit\nversion=7.0.RC1\narch=x86_64\n"
    )
    env = {"PATH": "/usr/bin:/bin", "ASCEND_HOME_PATH": str(latest)}
    proc = doctor("--json", env=env)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["environment"]["cann"]["version"] == "7.0.RC1"
    assert "cann         7.0.RC1" in doctor(env=env).stdout


def test_ascend_device_pair():
    env = {"simd": "NEON", "cann": None, "ascend_devices": []}
    check = device_check(env, None, "ascend")
    assert check.status == INCOMPATIBLE and "no CANN toolkit" in check.detail and "no /dev/davinciN" in check.detail
    env = {"simd": "NEON", "cann": {"version": "8.0.0", "path": "x"}, "ascend_devices": ["/dev/davinci0"]}
    assert device_check(env, None, "ascend").status == OK
    assert device_check({"simd": "AVX2", "cann": None, "ascend_devices": []}, None, "cpu").status == OK


X86 = "processor\t: 0\nmodel name\t: Intel(R) Xeon(R) Gold 6248\nflags\t\t: fpu sse2 sse4_2 avx avx2 fma avx512f\n"
KUNPENG = (
    "processor\t: 0\nBogoMIPS\t: 200.00\nFeatures\t: fp asimd evtstrm aes crc32\n"
    "CPU implementer\t: 0x48\nCPU part\t: 0xd01\n"
)


def test_cpu_model_and_simd_level_from_cpuinfo():
    model, flags = parse_cpuinfo(X86)
    assert model == "Intel(R) Xeon(R) Gold 6248" and simd_level(flags, "x86_64") == "AVX-512"
    assert simd_level(flags - {"avx512f"}, "x86_64") == "AVX2+FMA"
    assert simd_level({"sse2"}, "x86_64") == "SSE2"
    model, flags = parse_cpuinfo(KUNPENG)
    assert model == "HiSilicon CPU part 0xd01" and simd_level(flags, "aarch64") == "NEON"
    assert simd_level(flags | {"sve"}, "aarch64") == "NEON+SVE"
