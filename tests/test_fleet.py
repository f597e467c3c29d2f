"""verify --fleet: every device's recording audited, locally or on Ray workers, with the same report."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from inference.bundle import load_bundle
from inference.errors import UsageError
from msrl_consistency.verify import main as verify_main

REPO = Path(__file__).resolve().parents[1]
RECORD = """
    import sys
    sys.modules["mindspore"] = None
    import numpy as np
    import inference
    bundle, out, steps, seed = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    rng = np.random.default_rng(seed)
    policy = inference.load(bundle, record=out, chunk_steps=256)
    for _ in range(steps // 16):
        policy.act((rng.standard_normal((16, 4)) * 0.3).astype(np.float32))
        policy.observe(np.ones(16), rng.random(16) < 0.02)
    policy.close()
"""


def record(bundle_root: Path, devices: dict[str, int], fleet: Path, steps: int = 768) -> None:
    """One recording per device, recorded on the deploy side (no MindSpore), in parallel; ``devices``: name -> seed."""
    script = textwrap.dedent(RECORD)
    procs = [subprocess.Popen([sys.executable, "-c", script, str(bundle_root), str(fleet / name), str(steps),
                               str(seed)], stderr=subprocess.PIPE, text=True, cwd=REPO)
             for name, seed in devices.items()]  # fmt: skip
    for proc in procs:
        _, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err[-2000:]


def tamper(recording: Path) -> None:
    """The device's answers moved on its last chunk (a kernel that computes otherwise): the chain of chunks holds,
    the outputs do not."""
    last = sorted(recording.glob("chunk-*.npz"))[-1]
    with np.load(last) as data:
        arrays = {k: data[k] for k in data.files}
    arrays["output/logits"] = arrays["output/logits"] * 1.5
    np.savez(last, **arrays)


@pytest.fixture(scope="module")
def fleet(cartpole_bundle, tmp_path_factory) -> Path:
    """Two genuine devices, one whose answers changed, one with a truncated chunk."""
    root = tmp_path_factory.mktemp("fleet") / "fleet"
    record(cartpole_bundle.root, {"dev-a": 1, "dev-b": 2}, root)
    shutil.copytree(root / "dev-b", root / "dev-c")  # the same device's recording, its answers then moved
    shutil.copytree(root / "dev-a", root / "dev-d")
    tamper(root / "dev-c")
    chunk = root / "dev-d" / "chunk-000001.npz"
    chunk.write_bytes(chunk.read_bytes()[:200])
    return root


def fleet_args(bundle: Path, ckpt: Path, fleet: Path, out: Path, *extra: str) -> list[str]:
    return ["--bundle", str(bundle), "--ckpt", str(ckpt), "--fleet", str(fleet), "--out", str(out), "--quiet", *extra]


def report(out: Path) -> dict:
    return json.loads((out / "report.json").read_text())


def test_a_fleet_names_its_failing_devices_first_and_audits_the_rest(cartpole_bundle, cartpole_ckpt, fleet, tmp_path):
    out = tmp_path / "r"
    assert verify_main(fleet_args(cartpole_bundle.root, cartpole_ckpt, fleet, out)) == 1
    data = report(out)
    status = {r["device"]: r["status"] for r in data["devices"]}
    assert status == {"dev-a": "consistent", "dev-b": "consistent", "dev-c": "inconsistent", "dev-d": "unreadable"}
    assert [r["device"] for r in data["devices"]][:2] == ["dev-c", "dev-d"]  # failing first
    row = {r["device"]: r for r in data["devices"]}
    assert "chunk-000001.npz is not a complete recording chunk" in row["dev-d"]["detail"]
    assert "observations.policy (network)" in row["dev-c"]["detail"] and row["dev-c"]["worst_ratio"] > 1
    assert row["dev-a"]["steps"] == 768 and row["dev-a"]["worst_ratio"] < 1
    assert data["distributions"]["steps"]["devices"] == 3 and data["run"]["engine"] == "local"
    # each device's evidence: the audit's own report set, whole for the failing one
    assert {p.name for p in (out / "devices" / "dev-c").iterdir()} >= {"report.json", "audit.json", "report.html"}
    device = json.loads((out / "devices" / "dev-a" / "report.json").read_text())
    assert device["exit_code"] == 0 and device["checks"]
    junit = (out / "junit.xml").read_text()
    assert junit.count("<testcase") == 4 and 'failures="1"' in junit and 'errors="1"' in junit
    assert "dev-c" in (out / "report.html").read_text()
    assert "| dev-c | inconsistent |" in (out / "report.md").read_text()


def test_fleet_exit_codes(cartpole_bundle, cartpole_ckpt, fleet, tmp_path):
    """Only the unreadable device: nothing audited, exit 3; bad arguments: usage errors before any work."""
    only_bad = tmp_path / "bad"
    only_bad.mkdir()
    (only_bad / "dev-d").symlink_to(fleet / "dev-d")
    assert verify_main(fleet_args(cartpole_bundle.root, cartpole_ckpt, only_bad, tmp_path / "r")) == 3
    assert report(tmp_path / "r")["verdict"] == "NOT VERIFIED"
    empty = tmp_path / "empty"
    empty.mkdir()
    bundle, ckpt = str(cartpole_bundle.root), str(cartpole_ckpt)
    for args in (
        ["--bundle", bundle, "--ckpt", ckpt, "--engine", "ray", "--out", str(tmp_path / "x")],
        ["--bundle", bundle, "--ckpt", ckpt, "--fleet", str(tmp_path / "missing"), "--out", str(tmp_path / "x")],
        ["--bundle", bundle, "--ckpt", ckpt, "--fleet", str(fleet), "--ray-address", "auto", "--out", str(tmp_path)],
        ["--bundle", bundle, "--ckpt", ckpt, "--fleet", str(fleet), "--audit", str(fleet / "dev-a")],
        ["--bundle", bundle, "--ckpt", ckpt, "--fleet", str(empty), "--out", str(tmp_path / "x")],
    ):
        with pytest.raises(UsageError):  # exit 2 (``inference.errors.run_cli``), before any work
            verify_main(args)
    assert not (tmp_path / "x").exists()


@pytest.mark.slow
def test_ray_gives_the_local_report_and_names_a_nudged_bundles_device(cartpole_bundle, cartpole_ckpt, fleet,
                                                                       tmp_path):  # fmt: skip
    """A device running a bundle exported from a nudged checkpoint is named (its recording belongs to another
    bundle); both engines write the same report.json apart from how it ran."""
    from msrl_consistency.agent import PolicySpec
    from msrl_consistency.api import export_run
    from msrl_consistency.artifacts import run_dir as rd
    from msrl_consistency.artifacts.bundle import ExportOptions
    from msrl_consistency.artifacts.checkpoint import load_policy

    policy = load_policy(cartpole_ckpt, PolicySpec.from_dict(rd.read_run_json(cartpole_ckpt.parent)["policy_spec"]))
    weight = policy.actor.layers[2].weight
    weight.set_data(type(weight.value())(weight.asnumpy() * 1.5))
    nudged = export_run(cartpole_ckpt, tmp_path / "nudged", ExportOptions(formats=("onnx", "ms")), policy=policy)
    mixed = tmp_path / "fleet"
    mixed.mkdir()
    for device in ("dev-a", "dev-b", "dev-c"):
        (mixed / device).symlink_to(fleet / device)
    record(nudged.root, {"dev-nudged": 5}, mixed)
    reports = {}
    for engine in ("local", "ray"):
        out = tmp_path / engine
        assert verify_main(fleet_args(cartpole_bundle.root, cartpole_ckpt, mixed, out, "--engine", engine)) == 1
        reports[engine] = report(out)
    status = {r["device"]: r["status"] for r in reports["ray"]["devices"]}
    assert status == {"dev-a": "consistent", "dev-b": "consistent", "dev-c": "inconsistent",
                      "dev-nudged": "another bundle"}  # fmt: skip
    assert reports["ray"]["run"]["engine"] == "ray" and reports["ray"]["run"]["workers"] >= 1
    assert {k: v for k, v in reports["ray"].items() if k != "run"} == {
        k: v for k, v in reports["local"].items() if k != "run"
    }


def audited(bundle: Path, ckpt: Path, fleet: Path, engine, progress=lambda _m: None) -> dict[str, str]:
    """Every device's row of the fleet report (as JSON) from ``audit_fleet`` on ``engine``."""
    from msrl_consistency.artifacts.cells import TrainerCells
    from msrl_consistency.fleet import audit_fleet
    from msrl_consistency.fleet.report import device_row

    loaded = load_bundle(bundle)
    devices = audit_fleet(loaded, fleet, TrainerCells(ckpt, loaded.policy_spec), ckpt, engine, progress=progress)
    return {d.name: json.dumps(device_row(d), sort_keys=True, default=str) for d in devices}


def local_rows(bundle, ckpt: Path, fleet: Path) -> dict[str, str]:
    from msrl_consistency.artifacts.cells import TrainerCells
    from msrl_consistency.fleet.engines import LocalEngine

    engine = LocalEngine(TrainerCells(ckpt, bundle.policy_spec), "cpu")
    try:
        return audited(bundle.root, ckpt, fleet, engine)
    finally:
        engine.close()


@pytest.mark.slow
def test_a_killed_worker_has_its_chunks_judged_again(cartpole_bundle, cartpole_ckpt, fleet):
    from msrl_consistency.artifacts.cells import TrainerCells
    from msrl_consistency.fleet.engines import RayEngine

    expected = local_rows(cartpole_bundle, cartpole_ckpt, fleet)
    engine = RayEngine(TrainerCells(cartpole_ckpt, cartpole_bundle.policy_spec), "cpu")
    try:
        assert len(engine.workers) == os.cpu_count()  # a local Ray on this machine's cores
        victim = engine.pids()[0]
        killed = []

        def kill_once(message: str) -> None:  # as the first device finishes, chunks of the others are in flight
            if not killed and message.endswith("devices)"):
                os.kill(victim, signal.SIGKILL)
                killed.append(victim)

        assert audited(cartpole_bundle.root, cartpole_ckpt, fleet, engine, kill_once) == expected
        retries = engine.facts()["retries"]
    finally:
        engine.close()
    assert killed and retries and all(r["why"] and r["chunks"] >= 1 for r in retries)
    assert {r["device"] for r in retries} <= {"dev-b", "dev-c"}  # devices still in flight when the worker died


@pytest.mark.slow
def test_ray_on_two_simulated_nodes(cartpole_bundle, cartpole_ckpt, fleet):
    import ray
    from ray.cluster_utils import Cluster

    from msrl_consistency.artifacts.cells import TrainerCells
    from msrl_consistency.fleet.engines import RayEngine

    expected = local_rows(cartpole_bundle, cartpole_ckpt, fleet)
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1})
    try:
        cluster.add_node(num_cpus=1)
        engine = RayEngine(TrainerCells(cartpole_ckpt, cartpole_bundle.policy_spec), "cpu", address=cluster.address)
        try:
            nodes = ray.get([w.node.remote() for w in engine.workers])
            assert len(nodes) == 2 and len(set(nodes)) == 2  # one worker on each node
            assert audited(cartpole_bundle.root, cartpole_ckpt, fleet, engine) == expected
        finally:
            engine.close()
    finally:
        ray.shutdown()
        cluster.shutdown()


@pytest.mark.slow
def test_ctrl_c_stops_a_ray_fleet_cleanly(cartpole_bundle, cartpole_ckpt, fleet, tmp_path):
    out = tmp_path / "r"
    args = fleet_args(cartpole_bundle.root, cartpole_ckpt, fleet, out, "--engine", "ray")
    args.remove("--quiet")
    proc = subprocess.Popen([sys.executable, "-m", "msrl_consistency.verify", *args], stderr=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})  # fmt: skip
    seen = [proc.stderr.readline()]
    while seen[-1] and "engine ray" not in seen[-1]:  # Ray started: the chunks are about to go to its workers
        seen.append(proc.stderr.readline())
    proc.send_signal(signal.SIGINT)
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 130, "".join(seen) + stderr[-2000:]
    assert "interrupted" in stderr and not out.exists()
