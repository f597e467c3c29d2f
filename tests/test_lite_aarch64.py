"""lite-aarch64: Lite's ARM kernels, cross-built from PyPI's aarch64 Lite SDK and run under qemu-user. What its build
probed on the emulated CPU, the one line where it cannot run, the CPU model, the ARM kernels inline and handed off,
the in-process library's float mode on aarch64, Lite's float16 switch (ignored by this Lite, and said so), and
verify and inference.check on it: 0 for a genuine bundle, 1 with the layer named for a nudged one.

Under CI (``MSRL_REQUIRE_AARCH64=1``) an unavailable lite-aarch64 fails these tests; elsewhere they skip with the
line that says what to install. Every call under emulation is slow: the tests that start the runner are marked slow.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import lite_build
import numpy as np
import pytest

from inference.lite import emulation as emu
from inference.lite import forks
from inference.lite.client import LiteRunner
from inference.runtimes.base import RuntimeSource
from inference.runtimes.registry import RUNTIMES

REPO = Path(__file__).resolve().parents[1]
FAST = dict(observations=400, episodes=1, seed=3)
WHY_NOT = lite_build.aarch64_why_not()


@pytest.fixture
def arm() -> Path:
    """The aarch64 runner; a test that needs it skips where it cannot run, fails under CI."""
    if WHY_NOT is not None:
        if lite_build.aarch64_required():
            pytest.fail(f"lite-aarch64 is required (MSRL_REQUIRE_AARCH64=1) and unavailable: {WHY_NOT}")
        pytest.skip(WHY_NOT)
    return emu.aarch64_runner()


def arm_runner(path: Path, **kwargs) -> LiteRunner:
    return LiteRunner(path, runner=emu.aarch64_runner(), launcher=emu.launcher(), timeout=600, load_timeout=600,
                      **kwargs)  # fmt: skip


def test_the_build_records_what_it_probed_on_the_emulated_cpu(arm):
    record = json.loads(arm.with_name("msrl-lite-runner.json").read_text())
    assert record["arch"] == "aarch64" and record["lite_version"] == lite_build.VERSION
    # asked of the ARM build itself under qemu, not left unknown because it cannot run on the build host
    assert record["max_mind_ir_version"] == lite_build.MAX_MINDIR
    assert record["mind_ir_rule"].startswith(f"probe (asked under qemu-aarch64 -cpu {emu.DEFAULT_ARM_CPU})")
    assert record["emulation"]["probed_cpu"] == emu.DEFAULT_ARM_CPU and record["emulation"]["qemu"].startswith("qemu")
    assert record["inline"]["default"] is True  # tested below: the ARM kernels inline, bitwise the hand-off's


def _no_bundle():
    """why_not reads the bundle's files only for runtimes with a format; a stand-in with a .ms for every graph."""

    class Stub:
        manifest = {"graphs": {"policy": {"files": {"ms": {"file": "policy.ms"}}}}}

    return Stub()


def test_without_qemu_or_the_cross_compiler_one_line_names_the_debian_packages(tmp_path, monkeypatch):
    packages = "apt-get install g++-aarch64-linux-gnu qemu-user"
    monkeypatch.setattr(emu.shutil, "which", lambda name: None)  # no qemu-aarch64 on this PATH
    why = RUNTIMES["lite-aarch64"].why_not(RuntimeSource(bundle=_no_bundle()))
    assert why is not None and packages in why and "\n" not in why
    bin_dir = tmp_path / "bin"  # the tools the script needs before it asks for the compiler and qemu, and no more
    bin_dir.mkdir()
    for tool in ("dirname", "uname"):
        (bin_dir / tool).symlink_to(subprocess.check_output(["which", tool], text=True).strip())
    env = {k: v for k, v in os.environ.items() if not k.startswith("MSRL_LITE")}
    env.update(PATH=str(bin_dir), CXX="aarch64-linux-gnu-g++")  # neither the compiler nor qemu on this PATH
    script = REPO / "inference" / "lite" / "build_lite.sh"
    proc = subprocess.run(["/bin/bash", str(script), "--arch", "aarch64", "--out", str(tmp_path / "out")],
                          capture_output=True, text=True, env=env, timeout=60)  # fmt: skip
    assert proc.returncode == 1 and proc.stderr.count("\n") == 1 and packages in proc.stderr, proc.stderr
    assert not (tmp_path / "out").exists()


def test_a_runner_that_is_not_executable_is_unavailable_as_on_x86(arm, monkeypatch):
    """Not a runtime defect (exit 1) but a runtime that cannot run here (exit 3), as the x86 runner's check says."""
    access = os.access
    monkeypatch.setattr(emu.os, "access", lambda path, mode: Path(path) != arm and access(path, mode))
    why = RUNTIMES["lite-aarch64"].why_not(RuntimeSource(bundle=_no_bundle()))
    assert why is not None and f"{arm} is not executable" in why


def test_the_doctor_shows_lite_aarch64_and_the_cpu_it_emulates(arm):
    code = "import sys; sys.modules['mindspore'] = None\nfrom inference.doctor import main\n"
    code += "sys.exit(main(sys.argv[1:]))"
    seen = {}
    for args in ([], ["--arm-cpu", "cortex-a76"]):
        proc = subprocess.run([sys.executable, "-c", code, "--json", *args], capture_output=True, text=True,
                              timeout=120, cwd=REPO)  # fmt: skip
        assert proc.returncode == 0, proc.stderr
        seen[tuple(args)] = json.loads(proc.stdout)["environment"]["lite_aarch64"]
    default, a76 = seen[()], seen[("--arm-cpu", "cortex-a76")]
    assert default["available"] and default["cpu"] == "neoverse-n1" and a76["cpu"] == "cortex-a76"
    assert default["qemu"].startswith("qemu-aarch64") and default["max_mind_ir_version"] == lite_build.MAX_MINDIR
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=REPO)
    row = next(line for line in proc.stdout.splitlines() if line.strip().startswith("lite-aarch64"))
    assert "available:" in row and "emulating neoverse-n1" in row


@pytest.mark.slow
def test_the_arm_kernels_run_inline_bitwise_as_handed_off_and_ignore_the_fp16_switch(arm, cartpole_bundle, tmp_path,
                                                                                      monkeypatch):  # fmt: skip
    """The aarch64 runner serves inline (its default here) with the hand-off's bits; Lite's float16 switch is ignored
    by this Lite, which says so at Build, and the answers stay its float32 ones. The ARM kernels' answers are not
    the x86 kernels' bits, but agree within float32 rounding."""
    from inference.compare.feeds import seeded_feeds
    from inference.runtimes.lite_aarch64 import LiteAarch64Fp16Runtime

    sample = cartpole_bundle.file("policy_sample", "ms")  # observations and noise in, action, log-prob, value out
    feeds = seeded_feeds(cartpole_bundle, 256, seed=0).graph_inputs(cartpole_bundle, "policy_sample")
    calls = [feeds] + [[f[k : k + 1] for f in feeds] for k in range(4)]  # a batch, then rows one by one
    answers = {}
    with arm_runner(sample) as inline, arm_runner(sample, inline=False) as handoff, \
            arm_runner(sample, cpu_fp16=True) as fp16, arm_runner(sample, fork_server=False) as plain, \
            LiteRunner(sample) as x86:  # fmt: skip
        for name, lite in (("inline", inline), ("handoff", handoff), ("fp16", fp16), ("plain", plain), ("x86", x86)):
            answers[name] = [lite.infer(*call) for call in calls]
        said = (inline.runs_inline, handoff.runs_inline, fp16.cpu_fp16_outcome)
        # under emulation a runner is forked from a loaded one, with its own environment (MSRL_LITE_INLINE), and
        # answers with the bits of one started as a plain process
        forked = forks.wanted(emu.launcher())  # unless MSRL_LITE_FORK_SERVER=0
        assert (inline.forked, handoff.forked, fp16.forked, plain.forked, x86.forked) == (forked,) * 3 + (False,) * 2
    assert said[:2] == (True, False)  # the default here serves inline; the hand-off ran on Lite's actor thread
    assert said[2].startswith("ignored: The mindspore-lite library does not support fp16"), said[2]

    def bits(name: str) -> list[bytes]:
        return [a[k].tobytes() for a in answers[name] for k in sorted(a)]

    assert bits("inline") == bits("handoff") == bits("fp16") == bits("plain")  # the float16 switch changes nothing
    for got, want in zip(answers["inline"], answers["x86"], strict=True):
        for k in ("log_prob", "value"):
            assert float(np.abs(got[k] - want[k]).max()) < 1e-4
    # lite-aarch64-fp16 asks that Lite once per build and CPU model, and is unavailable with its words
    monkeypatch.setattr(LiteAarch64Fp16Runtime, "CACHE", f"cpu-fp16-{tmp_path.name}.json")
    cache = arm.with_name(LiteAarch64Fp16Runtime.CACHE)
    try:
        why = LiteAarch64Fp16Runtime.why_not(RuntimeSource(cartpole_bundle))
        assert why is not None and "ignores CPUDeviceInfo::SetEnableFP16" in why and "MSLITE_ENABLE_FP16" in why
        monkeypatch.setattr(LiteAarch64Fp16Runtime, "_fp16_refusal", None)  # asked again, it would fail
        assert LiteAarch64Fp16Runtime.why_not(RuntimeSource(cartpole_bundle)) == why
    finally:
        cache.unlink(missing_ok=True)


@pytest.mark.slow
def test_the_in_process_library_on_aarch64_keeps_the_callers_float_mode_and_the_runners_bits(arm, tmp_path):
    """libmsrl-lite.so for aarch64, driven from C under qemu (no aarch64 Python here): loading Lite switches the
    caller's thread to flush denormals (FPCR.FZ) and the library gives its mode back; the graph computes in Lite's
    mode inline and handed off alike, as the runner does (a 1e30 gain on denormal inputs tells them apart)."""
    import mindspore as ms
    from mindspore import nn

    from msrl_consistency.api import export_policy

    gain = nn.Dense(4, 2, weight_init=ms.Tensor(np.full((2, 4), 1e30, np.float32)), bias_init="zeros")
    contract = {"input": {"obs": [4]}, "outputs": {"names": ["logits"]},
                "action": {"kind": "categorical", "logits": "logits"}}  # fmt: skip
    model = export_policy(gain, contract, tmp_path / "gain").file("policy", "ms")
    driver = tmp_path / "driver"
    subprocess.run(["aarch64-linux-gnu-gcc", "-O2", str(REPO / "tests" / "lite_inprocess_driver.c"), "-o",
                    str(driver), "-ldl"], check=True, timeout=120)  # fmt: skip
    proc = subprocess.run([*emu.launcher(), str(driver), str(arm.parent), str(model), "3", "4", "1e-39"],
                          capture_output=True, text=True, timeout=600)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    seen = json.loads(proc.stdout.strip().splitlines()[-1])
    assert seen["mode_before"] == 0 and seen["mode_loaded"] == 1 << 24  # Lite's load sets FPCR.FZ
    inline, handoff = seen["inline"], seen["handoff"]
    assert (inline["mode_after"], handoff["mode_after"]) == (0, 0)  # the caller's own mode, after every call
    assert (inline["inline_calls"], handoff["inline_calls"]) == (1, 0)
    with arm_runner(model) as runner:
        answer = runner.infer(np.full((3, 4), 1e-39, np.float32))["logits"]
    assert inline["bytes"] == handoff["bytes"] == answer.tobytes().hex() == "00" * 24  # flushed, every way


@pytest.mark.slow
def test_verify_on_lite_aarch64_names_the_layer_of_a_nudged_bundle(arm, cartpole_ckpt, tmp_path):
    """A bundle exported with one hidden layer changed: inconsistent on the ARM kernels, the layer named by their own
    tap request, and the report says they ran under emulation. (A genuine bundle's 0: the check below and the gate,
    make gate-aarch64.)"""
    from test_localize import scaled_export

    from inference.compare.verifier import VerifyOptions
    from inference.report.writers import write_reports
    from msrl_consistency.api import verify_run

    options = VerifyOptions(**FAST, runtimes=("lite-aarch64",), required=("lite-aarch64",))
    nudged = verify_run(scaled_export(cartpole_ckpt, tmp_path / "nudged", "actor"), cartpole_ckpt, options)
    assert nudged.exit_code == 1
    assert {c.diagnosis["stage"] for c in nudged.failed if c.diagnosis} == {"network"}
    loc = nudged.localizations["lite-aarch64"]
    assert loc.first == "actor.layers.2", loc.line()
    table = nudged.console_table()
    assert "lite-aarch64: first diverging layer: actor.layers.2 (Dense)" in table
    assert "lite-aarch64: ARM kernels under instruction emulation" in table and "-cpu neoverse-n1" in table
    versions = nudged.runtimes["lite-aarch64"]["versions"]
    assert versions["arch"] == "aarch64" and "instruction emulation" in versions["emulation"]
    assert "instruction emulation" in write_reports(nudged, tmp_path / "report")["md"].read_text()


@pytest.mark.slow
def test_inference_check_on_lite_aarch64_names_the_layer_from_a_golden_file(arm, cartpole_bundle, cartpole_ckpt,
                                                                             tmp_path):  # fmt: skip
    from test_localize import scaled_export

    from msrl_consistency.verify import main as verify_main

    faulty = scaled_export(cartpole_ckpt, tmp_path / "faulty", "actor")
    verdicts = {}
    for name, bundle in (("genuine", cartpole_bundle.root), ("nudged", faulty.root)):
        # a golden file checks only against its own bundle: the training box records one for each
        golden = tmp_path / f"{name}.golden.npz"
        verify_main(["--bundle", str(bundle), "--ckpt", str(cartpole_ckpt), "--runtimes", "onnxruntime",
                     "--observations", "400", "--episodes", "1", "--save-golden", str(golden), "--golden-layers",
                     "--out", str(tmp_path / f"r-{name}"), "--quiet"])  # fmt: skip
        script = (
            "import sys; sys.modules['mindspore'] = None\nfrom inference.check import main\n"
            f"sys.exit(main([{str(bundle)!r}, '--golden', {str(golden)!r}, '--runtimes', 'lite-aarch64', '--require', "
            f"'lite-aarch64', '--arm-cpu', 'cortex-a76', '--out', {str(tmp_path / name)!r}]))"
        )
        proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=900, cwd=REPO)
        verdicts[name] = (proc.returncode, proc.stdout)
    assert verdicts["genuine"][0] == 0, verdicts["genuine"][1][-3000:]
    assert verdicts["nudged"][0] == 1, verdicts["nudged"][1][-3000:]
    assert "lite-aarch64: first diverging layer: actor.layers.2 (Dense)" in verdicts["nudged"][1]
    report = json.loads((tmp_path / "nudged" / "report.json").read_text())
    assert "-cpu cortex-a76" in report["runtimes"]["lite-aarch64"]["versions"]["emulation"]
