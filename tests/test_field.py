"""Consistency in the field: a device records what it fed its policy and what came back (no MindSpore), the training
box audits that against the training path. Genuine recordings pass, a device running another policy fails at the
network stage, a shifted env is reported as out of distribution, and a killed recorder leaves only whole chunks."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import lite_build
import numpy as np
import pytest
from cli_inprocess import run_module

from inference.bundle import load_bundle, sha256_file
from inference.errors import UsageError
from inference.field import read_recording, recording_chunks
from msrl_consistency.verify import main as verify_main

REPO = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.skipif(not lite_build.BUILT and not lite_build.required(), reason=lite_build.WHY_NOT)


def ctrl_c_as_in_a_terminal() -> None:
    """A child's SIGINT at its default, as in a terminal, even where the suite was started with it ignored (as a
    background job is): the child's Python would keep it ignored, and Ctrl-C would not reach its loop."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def device(code: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """Run ``code`` on the deploy side: a fresh Python without MindSpore."""
    script = "import sys\nsys.modules['mindspore'] = None\n" + textwrap.dedent(code)
    return subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=REPO, timeout=timeout,
                          preexec_fn=ctrl_c_as_in_a_terminal)  # fmt: skip


def play_record(bundle_root: Path, out: Path, *args: str) -> None:
    proc = device(f"""
        from inference.play import main
        sys.exit(main([{str(bundle_root)!r}, "--record", {str(out)!r}, *{list(args)!r}]))
    """)
    assert proc.returncode == 0, proc.stderr[-2000:]


def audit(bundle_root: Path, ckpt: Path, recording: Path, out: Path) -> int:
    return verify_main(["--bundle", str(bundle_root), "--ckpt", str(ckpt), "--audit", str(recording), "--out",
                        str(out), "--quiet"])  # fmt: skip


def report(out: Path) -> dict:
    return json.loads((out / "report.json").read_text())


def test_a_genuine_recording_audits_as_consistent(cartpole_bundle, cartpole_ckpt, tmp_path):
    play_record(cartpole_bundle.root, tmp_path / "rec", "--episodes", "3", "--stochastic")
    rec = read_recording([tmp_path / "rec"], cartpole_bundle)
    assert rec.graph == "policy_sample" and rec.runtime == "lite" and len(rec) > 0
    assert [e for e, _, _ in rec.episode_returns()] == [0, 1, 2]
    assert audit(cartpole_bundle.root, cartpole_ckpt, tmp_path / "rec", tmp_path / "r") == 0
    checks = {c["name"]: c for c in report(tmp_path / "r")["checks"]}
    assert checks["observations.policy_sample"]["status"] == "pass" and "repeatability" not in checks
    assert checks["field.drift"]["status"] == "pass" and checks["field.returns"]["metrics"]["episodes"] == 3
    facts = json.loads((tmp_path / "r" / "audit.json").read_text())
    assert facts["steps"] == len(rec) and sum(w["steps"] for w in facts["windows"]) == len(rec)
    assert (tmp_path / "r" / "audit_timeline.png").stat().st_size > 1000
    assert audit(cartpole_bundle.root, cartpole_ckpt, tmp_path / "rec", tmp_path / "r") == 0  # its own set: replaced


@pytest.mark.slow
def test_a_device_running_another_policy_fails_at_the_network_stage(cartpole_bundle, cartpole_ckpt, tmp_path):
    """The device's bundle had its .ms swapped for a nudged policy's (hashes updated, as a careless deploy would):
    its recording audits against the training path as inconsistent, the network named, its layer too."""
    from msrl_consistency.agent import PolicySpec
    from msrl_consistency.api import export_run
    from msrl_consistency.artifacts import run_dir as rd
    from msrl_consistency.artifacts.bundle import ExportOptions
    from msrl_consistency.artifacts.checkpoint import load_policy

    policy = load_policy(cartpole_ckpt, PolicySpec.from_dict(rd.read_run_json(cartpole_ckpt.parent)["policy_spec"]))
    weight = policy.actor.layers[2].weight
    weight.set_data(type(weight.value())(weight.asnumpy() * 1.5))
    nudged = export_run(cartpole_ckpt, tmp_path / "nudged", ExportOptions(formats=("onnx", "ms")), policy=policy)
    root = tmp_path / "device-bundle"
    shutil.copytree(cartpole_bundle.root, root)
    manifest = json.loads((root / "manifest.json").read_text())
    for graph, meta in manifest["graphs"].items():
        shutil.copy(nudged.file(graph, "ms"), root / meta["files"]["ms"]["file"])
        meta["files"]["ms"]["sha256"] = sha256_file(root / meta["files"]["ms"]["file"])
    (root / "manifest.json").write_text(json.dumps(manifest, indent=1))
    play_record(root, tmp_path / "rec", "--episodes", "2")
    assert audit(root, cartpole_ckpt, tmp_path / "rec", tmp_path / "r") == 1
    failed = {c["name"]: c for c in report(tmp_path / "r")["checks"] if c["status"] == "fail"}
    # the drift check says when (every window is beyond tolerance); the actions follow the outputs, if any flipped
    assert (
        {"observations.policy", "field.drift"} <= set(failed) <= {"observations.policy", "field.drift", "field.actions"}
    )
    assert failed["observations.policy"]["diagnosis"]["stage"] == "network"
    windows = failed["field.drift"]["metrics"]["windows"]
    assert f"beyond tolerance in {len(windows)} of them" in failed["field.drift"]["summary"]
    assert report(tmp_path / "r")["localization"]["field:lite"]["first_diverging_layer"] == "actor.layers.2"
    # The genuine bundle refuses that recording: it was made with another manifest.
    with pytest.raises(UsageError, match="recorded with another bundle"):
        read_recording([tmp_path / "rec"], load_bundle(cartpole_bundle.root))


SHIFTED = """
    import numpy as np
    import gymnasium as gym
    import inference
    policy = inference.load({bundle!r}, record={out!r})
    rng = np.random.default_rng(0)
    env = gym.make("CartPole-v1")
    for episode in range({episodes}):
        obs, _ = env.reset(seed=episode)
        if {spread} > 0:  # the device's world: the pole starts far from upright, the cart off centre
            env.unwrapped.state = rng.uniform(-{spread}, {spread}, 4)
            obs = np.array(env.unwrapped.state, np.float32)
        policy.reset()
        done = False
        while not done:
            obs, reward, terminated, truncated, _ = env.step(int(policy.act(obs)))
            done = terminated or truncated
            policy.observe(reward, done)
    policy.close()
"""


def test_a_shifted_env_is_reported_out_of_distribution(cartpole_bundle, cartpole_ckpt, tmp_path):
    shares = {}
    for name, spread in (("home", 0.0), ("shifted", 0.6)):
        code = SHIFTED.format(bundle=str(cartpole_bundle.root), out=str(tmp_path / name), episodes=8, spread=spread)
        proc = device(code)
        assert proc.returncode == 0, proc.stderr[-2000:]
        assert audit(cartpole_bundle.root, cartpole_ckpt, tmp_path / name, tmp_path / f"r-{name}") == 0
        checks = {c["name"]: c for c in report(tmp_path / f"r-{name}")["checks"]}
        shares[name] = checks["field.out_of_distribution"]
    shifted, home = shares["shifted"]["metrics"], shares["home"]["metrics"]
    assert shares["shifted"]["status"] == "warn" and "states training did not cover" in shares["shifted"]["summary"]
    assert shifted["share_beyond_sigma"] > 2 * home["share_beyond_sigma"] and shifted["share_beyond_sigma"] > 0.05
    worst = max(shifted["per_dimension"], key=lambda d: d["max_abs_z"])
    assert worst["max_abs_z"] > 4


README_LOOP = """
    import os, signal
    import gymnasium as gym
    import inference
    policy = inference.load({bundle!r}, record={out!r}, chunk_steps=512)
    env = gym.make("CartPole-v1")
    obs, _ = env.reset(seed=0)
    for t in range(1, 3001):
        action = policy.act(obs)
        obs, reward, terminated, truncated, _ = env.step(int(action))
        policy.observe(reward, terminated or truncated)
        if terminated or truncated:
            obs, _ = env.reset()
            policy.reset()
        if t == 1700:
            {ending}
    print("the loop ended")
"""
ENDINGS = {"normal exit": ("pass", (0,), 3000), "exception": ("raise RuntimeError('the loop failed')", (1,), 1700),
           "Ctrl-C": ("os.kill(os.getpid(), signal.SIGINT)", (-signal.SIGINT,), 1700),
           "SIGTERM": ("os.kill(os.getpid(), signal.SIGTERM)", (143,), 1700)}  # fmt: skip


@pytest.mark.parametrize("ending", list(ENDINGS))
def test_the_readme_loop_leaves_a_complete_recording(cartpole_bundle, cartpole_ckpt, tmp_path, ending):
    """The README's loop in a plain script, without close(): whether it ends, raises, or is stopped by Ctrl-C or
    SIGTERM, every step it took is recorded, and the recording audits as consistent."""
    code, exits, steps = ENDINGS[ending]
    proc = device(README_LOOP.format(bundle=str(cartpole_bundle.root), out=str(tmp_path / "rec"), ending=code))
    assert proc.returncode in exits, proc.stderr[-2000:]
    assert ("the loop ended" in proc.stdout) == (ending == "normal exit")
    rec = read_recording([tmp_path / "rec"], cartpole_bundle)
    assert len(rec) == steps and len(recording_chunks([tmp_path / "rec"])) == -(-steps // 512)
    assert all(r <= 500 for *_, r in rec.episode_returns())  # CartPole's maximum: no two episodes merged
    assert audit(cartpole_bundle.root, cartpole_ckpt, tmp_path / "rec", tmp_path / "r") == 0


RECORD_FOREVER = """
    import numpy as np
    import inference
    policy = inference.load({bundle!r}, record={out!r}, chunk_steps=64)
    obs = np.random.default_rng(0).standard_normal((1, 4)).astype(np.float32)
    print("recording", flush=True)
    steps = 0
    try:
        while True:
            policy.act(obs)
            policy.observe(1.0)
            steps += 1
    finally:
        print(steps, flush=True)
"""


def _record_until(bundle, out, chunks: int) -> subprocess.Popen:
    """A deploy-side process recording forever into ``out``, once ``chunks`` chunks are on disk."""
    script = "import sys\nsys.modules['mindspore'] = None\n" + textwrap.dedent(
        RECORD_FOREVER.format(bundle=str(bundle.root), out=str(out)))  # fmt: skip
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True, cwd=REPO,
                            preexec_fn=ctrl_c_as_in_a_terminal)  # fmt: skip
    assert proc.stdout.readline().strip() == "recording"
    deadline = time.monotonic() + 60
    while len(list(out.glob("chunk-*.npz"))) < chunks and time.monotonic() < deadline:
        time.sleep(0.05)
    return proc


def test_kill_9_while_recording_leaves_only_whole_chunks(cartpole_bundle, tmp_path):
    out = tmp_path / "rec"
    proc = _record_until(cartpole_bundle, out, chunks=5)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    chunks = recording_chunks([out])
    assert len(chunks) >= 5
    rec = read_recording([out], cartpole_bundle)  # every chunk present is whole (a partial one would raise)
    assert len(rec) == 64 * len(chunks) and np.isfinite(rec.reward).all()


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_from_outside_leaves_every_step_recorded(cartpole_bundle, tmp_path, sig):
    """``kill`` (a service manager's stop) or Ctrl-C while the loop runs: the chunk in progress is written too."""
    out = tmp_path / "rec"
    proc = _record_until(cartpole_bundle, out, chunks=3)
    try:
        proc.send_signal(sig)
        stepped = int(proc.stdout.readline())
    finally:
        proc.wait(timeout=60)
    assert proc.returncode == {signal.SIGTERM: 143, signal.SIGINT: -signal.SIGINT}[sig]  # Python's own for Ctrl-C
    rec = read_recording([out], cartpole_bundle)
    # every step is there, or announced as dropped (the disk fell behind chunks of 64 steps): nothing lost unsaid;
    # + 1: the act() whose observe() the signal cut off
    assert len(rec) + rec.dropped_steps in (stepped, stepped + 1)


@pytest.mark.slow
def test_bad_recordings_are_one_line_errors(cartpole_bundle, cartpole_ckpt, tmp_path):
    play_record(cartpole_bundle.root, tmp_path / "rec", "--episodes", "1")
    chunk = recording_chunks([tmp_path / "rec"])[0]
    truncated = tmp_path / "truncated" / chunk.name
    truncated.parent.mkdir()
    truncated.write_bytes(chunk.read_bytes()[: chunk.stat().st_size // 2])
    stranger = tmp_path / "stranger.npz"
    np.savez(stranger, x=np.zeros(3))
    text = tmp_path / "notes.txt"
    text.write_text("not a recording")
    renamed = tmp_path / "renamed"
    renamed.mkdir()
    shutil.copy(chunk, renamed / chunk.name)
    shutil.copy(chunk, renamed / "chunk-000002.npz")
    floats = tmp_path / "floats"
    floats.mkdir()
    with np.load(chunk) as data:
        arrays = {k: data[k] for k in data.files}
    np.savez(floats / chunk.name, **{**arrays, "episode": arrays["episode"].astype(np.float64)})
    cases = [
        (truncated.parent, "not a complete recording chunk"),
        (stranger, "not a recording chunk"),
        (text, "not a complete recording chunk"),
        (tmp_path / "missing", "recording not found"),
        (renamed, "chunk-000002.npz holds chunk 0 of its recording"),
        (floats, "field 'episode' is float64, expected int64"),
    ]
    for bad, message in cases:
        proc = run_module("msrl_consistency.verify", "--bundle", str(cartpole_bundle.root), "--ckpt",
                          str(cartpole_ckpt), "--audit", str(bad), "--out", str(tmp_path / "r"), cwd=REPO,
                          timeout=300)  # fmt: skip
        assert proc.returncode == 2, (bad, proc.stderr[-1500:])
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], (bad, lines)


@pytest.mark.slow
@pytest.mark.parametrize("shape", ["dict", "two_head"])
def test_dict_and_multi_head_policies_record_on_the_device_and_audit_from_the_library(tmp_path, shape):
    """A Dict observation and two action heads through ``inference.load(record=)`` in a team's own loop (no
    MindSpore), then ``msrl_consistency.audit.audit_recordings`` called as a library in a fresh process."""
    import foreign_policies as fp

    from msrl_consistency.api import export_policy

    make, contract = {"dict": ("make_dict_policy", fp.DICT_CONTRACT),
                      "two_head": ("make_two_head", fp.TWO_HEAD_CONTRACT)}[shape]  # fmt: skip
    bundle = export_policy(getattr(fp, make)(), contract, tmp_path / "bundle")
    recording = tmp_path / "rec"
    proc = device(f"""
        sys.path.insert(0, {str(REPO / "tests")!r})
        import numpy as np
        import foreign_envs as fe
        import inference
        env = fe.{"make_dict" if shape == "dict" else "make_two_head"}()
        policy = inference.load({str(bundle.root)!r}, record={str(recording)!r})
        for episode in range(2):
            obs, _ = env.reset(seed=episode)
            done = False
            while not done:
                action = policy.act(obs)
                obs, reward, term, trunc, _ = env.step(action if action.ndim else int(action))
                done = term or trunc
                policy.observe(reward, done)
            policy.reset()
        policy.close()
    """)
    assert proc.returncode == 0, proc.stderr[-2000:]
    audit_code = textwrap.dedent(f"""
        import sys
        from pathlib import Path
        sys.path.insert(0, {str(REPO / "tests")!r})
        import foreign_policies as fp
        from inference.bundle import load_bundle
        from msrl_consistency.artifacts.cells import UserCells
        from msrl_consistency.audit import audit_recordings
        result, _ = audit_recordings(load_bundle({str(bundle.root)!r}), [Path({str(recording)!r})],
                                     UserCells(fp.{make}, None), None)
        print([c.name for c in result.checks if c.status == "pass"])
        sys.exit(result.exit_code)
    """)
    proc = subprocess.run([sys.executable, "-c", audit_code], capture_output=True, text=True, cwd=REPO, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "observations.policy" in proc.stdout and "field.returns" in proc.stdout
