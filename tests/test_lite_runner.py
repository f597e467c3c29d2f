"""End-to-end tests of the Lite deploy path: ONNX -> msrl-lite-convert -> .ms -> msrl-lite-runner <- LiteRunner.

The models are tiny ONNX graphs built with onnx.helper, so no MindSpore is needed except for the one test
that needs a real MindIR v3 file. Everything is skipped only when the binaries have not been built
(`make lite`, which `make test` runs first).
"""

from __future__ import annotations

import importlib.util
import json
import os
import struct
import subprocess
import sys
import time
from pathlib import Path
from typing import NamedTuple

import lite_build
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from inference.bundle.tensors import FeedError, TensorMeta
from inference.lite.client import LiteRunner
from inference.lite.common import (
    DeviceUnavailable,
    LiteRunnerError,
    MindIRVersionError,
    ModelLoadError,
    RunnerCrashed,
    RunnerTimeout,
    RunnerUnavailable,
    runner_available,
    runner_path,
)

CONVERTER = runner_path().with_name("msrl-lite-convert")
TEST_RUNNER = runner_path().with_name("msrl-lite-runner-test")  # the runner plus its fault-injection hook
MAGIC = 0x4D534C52

_ok, _why = runner_available()
pytestmark = [
    pytest.mark.skipif(not _ok, reason=_why),
    pytest.mark.skipif(not CONVERTER.is_file(), reason=f"{CONVERTER} not built (run `make lite`)"),
    pytest.mark.skipif(not TEST_RUNNER.is_file(), reason=f"{TEST_RUNNER} not built (run `make lite`)"),
]


class Mlp(NamedTuple):
    """A converted test model plus the weights to recompute its outputs in NumPy."""

    onnx: Path
    ms: Path
    weights: tuple[np.ndarray, ...]

    def reference(self, obs: np.ndarray) -> np.ndarray:
        w1, b1, w2, b2, w3, b3 = (w.astype(np.float64) for w in self.weights)
        h = np.tanh(obs.astype(np.float64) @ w1 + b1)
        h = np.tanh(h @ w2 + b2)
        return (h @ w3 + b3).astype(np.float32)


def _mlp_onnx(
    path: Path, *, obs: int = 4, hidden: int = 64, act: int = 2, argmax: bool = False, seed: int = 0
) -> tuple[np.ndarray, ...]:
    """Gemm+Tanh MLP with a dynamic batch dim, the shape of a small policy network."""
    rng = np.random.default_rng(seed)
    # Usual policy-net init scales (1/sqrt(fan_in), small last layer), so outputs are O(1) like real logits.
    shapes = [(obs, hidden), (hidden,), (hidden, hidden), (hidden,), (hidden, act), (act,)]
    scales = [obs**-0.5, 0.1, hidden**-0.5, 0.1, 0.3 * hidden**-0.5, 0.1]
    weights = tuple((rng.standard_normal(s) * k).astype(np.float32) for s, k in zip(shapes, scales, strict=True))
    names = ["w1", "b1", "w2", "b2", "w3", "b3"]
    nodes = [
        helper.make_node("Gemm", ["obs", "w1", "b1"], ["h1"]),
        helper.make_node("Tanh", ["h1"], ["a1"]),
        helper.make_node("Gemm", ["a1", "w2", "b2"], ["h2"]),
        helper.make_node("Tanh", ["h2"], ["a2"]),
        helper.make_node("Gemm", ["a2", "w3", "b3"], ["logits"]),
    ]
    outputs = [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", act])]
    if argmax:
        nodes.append(helper.make_node("ArgMax", ["logits"], ["action"], axis=1, keepdims=0))
        outputs.append(helper.make_tensor_value_info("action", TensorProto.INT64, ["batch"]))
    graph = helper.make_graph(
        nodes,
        "mlp",
        [helper.make_tensor_value_info("obs", TensorProto.FLOAT, ["batch", obs])],
        outputs,
        [numpy_helper.from_array(w, n) for w, n in zip(weights, names, strict=True)],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return weights


def _convert(
    onnx_path: Path, out: Path, *extra: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(CONVERTER), "--onnx", str(onnx_path), "--out", str(out), *extra],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("lite")


@pytest.fixture(scope="module")
def mlp(model_dir: Path) -> Mlp:
    weights = _mlp_onnx(model_dir / "mlp.onnx")
    res = _convert(model_dir / "mlp.onnx", model_dir / "mlp.ms")
    assert res.returncode == 0, res.stderr
    return Mlp(model_dir / "mlp.onnx", model_dir / "mlp.ms", weights)


@pytest.fixture(scope="module")
def argmax_mlp(model_dir: Path) -> Mlp:
    weights = _mlp_onnx(model_dir / "am.onnx", argmax=True, seed=1)
    res = _convert(model_dir / "am.onnx", model_dir / "am.ms")
    assert res.returncode == 0, res.stderr
    return Mlp(model_dir / "am.onnx", model_dir / "am.ms", weights)


@pytest.fixture(scope="module")
def runner(mlp: Mlp):
    with LiteRunner(mlp.ms, timeout=10.0) as r:
        yield r


def _gone(pid: int) -> bool:
    try:
        os.killpg(pid, 0)  # the runner leads its own process group (start_new_session)
    except ProcessLookupError:
        return True
    return False


# ---- converter ------------------------------------------------------------------------------------------


def test_converter_writes_exact_out_path(mlp: Mlp, tmp_path: Path) -> None:
    out = tmp_path / "policy.ms"
    res = _convert(mlp.onnx, out)
    assert res.returncode == 0, res.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["policy.ms"]
    assert res.stdout == ""


def test_converter_fp16_weights(mlp: Mlp, tmp_path: Path) -> None:
    out = tmp_path / "fp16.ms"
    res = _convert(mlp.onnx, out, "--fp16")
    assert res.returncode == 0, res.stderr
    assert out.stat().st_size < mlp.ms.stat().st_size * 0.7  # weights stored as float16
    obs = np.random.default_rng(5).standard_normal((16, 4)).astype(np.float32)
    with LiteRunner(out) as r:
        np.testing.assert_allclose(r.infer(obs)["logits"], mlp.reference(obs), atol=2e-3)  # seen: 2e-4


def test_int8_calibration_runs_on_one_thread_and_converts_the_same_bytes(tmp_path: Path) -> None:
    """Lite's calibration sessions spin their kernel threads on sched_yield, so the converter tells Lite it has one
    core (its own std::thread::hardware_concurrency, exported for Lite's libraries to bind to); the int8 .ms is the
    one Lite writes with two calibration threads (MSRL_LITE_CONVERT_CORES=2)."""
    from inference.bundle.precision_mode import converter_config
    from msrl_consistency.precision.lowering import (
        batch_one_onnx,
        full_quant_sections,
        quant_section,
        write_calibration,
    )

    symbols = subprocess.run(["nm", "-D", "--defined-only", str(CONVERTER)], capture_output=True, text=True).stdout
    assert "_ZNSt6thread20hardware_concurrencyEv" in symbols
    _mlp_onnx(tmp_path / "dyn.onnx")
    batch_one_onnx(tmp_path / "dyn.onnx", tmp_path / "m.onnx")  # calibration runs the graph at batch 1
    calibration = write_calibration(tmp_path / "obs", np.random.default_rng(3).standard_normal((40, 4), np.float32))
    config = tmp_path / "int8.cfg"
    config.write_text(converter_config("cpu", None, {"common_quant_param": quant_section("full"),
                                                     **full_quant_sections({"obs": calibration})}))  # fmt: skip
    converted = {}
    for cores in ("", "2"):
        env = {k: v for k, v in os.environ.items() if k != "MSRL_LITE_CONVERT_CORES"}
        env.update({"MSRL_LITE_CONVERT_CORES": cores} if cores else {})
        out = tmp_path / f"int8-{cores or 'default'}.ms"
        res = _convert(tmp_path / "m.onnx", out, "--config", str(config), env=env)
        assert res.returncode == 0, res.stderr
        converted[cores] = out.read_bytes()
    assert converted[""] == converted["2"] and len(converted[""]) < (tmp_path / "m.onnx").stat().st_size


def test_converter_reports_one_line_error(tmp_path: Path) -> None:
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"\x08\x01garbage" * 10)
    res = _convert(bad, tmp_path / "bad.ms")
    assert res.returncode != 0
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("msrl-lite-convert: error:"), res.stderr
    assert not (tmp_path / "bad.ms").exists()
    assert _convert(tmp_path / "missing.onnx", tmp_path / "x.ms").returncode != 0


# ---- inference ------------------------------------------------------------------------------------------


def test_handshake_metadata(runner: LiteRunner, mlp: Mlp) -> None:
    assert runner.lite_version.count(".") >= 1
    assert runner.device == "cpu"
    assert runner.inputs == [TensorMeta("obs", np.dtype(np.float32), (-1, 4))]
    assert [o.name for o in runner.outputs] == ["logits"]
    assert runner.ping() > 0  # a round trip (its latency is measured in bench/, not judged here)


def test_batch_matches_numpy(runner: LiteRunner, mlp: Mlp) -> None:
    obs = np.random.default_rng(1).standard_normal((256, 4)).astype(np.float32)
    out = runner.infer(obs)
    assert list(out) == ["logits"]
    assert out["logits"].shape == (256, 2) and out["logits"].dtype == np.float32
    np.testing.assert_allclose(out["logits"], mlp.reference(obs), atol=1e-5)


def test_single_steps(runner: LiteRunner, mlp: Mlp) -> None:
    rng = np.random.default_rng(2)
    for _ in range(200):
        obs = rng.standard_normal((1, 4)).astype(np.float32)
        np.testing.assert_allclose(runner.infer(obs)["logits"], mlp.reference(obs), atol=1e-5)


def test_batch_size_changes(runner: LiteRunner, mlp: Mlp) -> None:
    rng = np.random.default_rng(3)
    for batch in (1, 7, 1, 64, 3, 3, 1):
        obs = rng.standard_normal((batch, 4)).astype(np.float32)
        logits = runner.infer(obs)["logits"]
        assert logits.shape == (batch, 2)
        np.testing.assert_allclose(logits, mlp.reference(obs), atol=1e-5)


def test_int_output(argmax_mlp: Mlp) -> None:
    obs = np.random.default_rng(4).standard_normal((50, 4)).astype(np.float32)
    with LiteRunner(argmax_mlp.ms) as r:
        assert [(o.name, o.dtype) for o in r.outputs] == [("logits", np.float32), ("action", np.int32)]
        out = r.infer(obs)
    np.testing.assert_array_equal(out["action"], np.argmax(argmax_mlp.reference(obs), axis=1))


def _actor_threads_cpu_ns(pid: int) -> int:
    """CPU time (ns, /proc schedstat) of Lite's actor threads in process ``pid``."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        if (task / "comm").read_text().startswith("ActorThread"):
            total += int((task / "schedstat").read_text().split()[0])
    return total


def test_the_runner_runs_the_graph_on_its_serving_thread(mlp: Mlp, monkeypatch: pytest.MonkeyPatch) -> None:
    """Inline (the default), Lite's actor thread stays idle while requests are served; with MSRL_LITE_INLINE=0 it
    runs every graph (and spins between them)."""
    obs = np.random.default_rng(0).standard_normal((1, 4)).astype(np.float32)
    used, said = {}, {}
    for inline in ("1", "0"):
        monkeypatch.setenv("MSRL_LITE_INLINE", inline)
        with LiteRunner(mlp.ms) as r:
            r.infer(obs)
            before = _actor_threads_cpu_ns(r.pid)
            for _ in range(2000):
                r.infer(obs)
            used[inline] = _actor_threads_cpu_ns(r.pid) - before
            said[inline] = r.inline_stats()
    # 2,000 graphs: well under 1 ms on Lite's thread, against at least a microsecond each (tens of ms on a slow CPU)
    assert used["1"] < 1e6 and used["0"] > 2e6, used
    # and the runner says so of its model: every call on its serving thread, or none
    assert said == {"1": {"calls": 2001, "inline_calls": 2001, "requested": True},
                    "0": {"calls": 2001, "inline_calls": 0, "requested": False}}  # fmt: skip


def test_client_side_feed_errors(runner: LiteRunner) -> None:
    good = np.zeros((2, 4), np.float32)
    for bad_args in [(good.astype(np.float64),), (good[:, :3],), (good[None],), (), (good, good)]:
        with pytest.raises(FeedError):
            runner.infer(*bad_args)
    assert runner.infer(good)["logits"].shape == (2, 2)


def test_runner_side_bad_request_keeps_runner_alive(mlp: Mlp) -> None:
    with LiteRunner(mlp.ms) as r:
        r.inputs = [TensorMeta("obs", np.dtype(np.float32), (-1, -1))]  # disable the client-side dim check
        with pytest.raises(FeedError, match="runner: .*dim 1 is 3"):
            r.infer(np.zeros((2, 3), np.float32))
        assert r.infer(np.zeros((2, 4), np.float32))["logits"].shape == (2, 2)


def test_raw_protocol(mlp: Mlp) -> None:
    """Drives the binary directly, so the wire format documented in inference.lite.client is pinned down."""
    proc = subprocess.Popen(
        [str(runner_path()), "--model", str(mlp.ms)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )
    assert proc.stdin is not None and proc.stdout is not None
    hello = json.loads(proc.stdout.readline())
    assert hello["ok"] and hello["inputs"] == [{"name": "obs", "dtype": "float32", "shape": [-1, 4]}]

    def request(frame: bytes) -> tuple[int, bytes]:
        proc.stdin.write(frame)
        proc.stdin.flush()
        magic, status = struct.unpack("<II", proc.stdout.read(8))
        assert magic == MAGIC
        if status != 0:
            (n,) = struct.unpack("<I", proc.stdout.read(4))
            return status, proc.stdout.read(n)
        return status, b""

    def infer_frame(dtype: int, dims: tuple[int, ...], payload: bytes, n_inputs: int = 1) -> bytes:
        head = struct.pack("<IIIII", MAGIC, 1, n_inputs, dtype, len(dims)) + struct.pack(f"<{len(dims)}q", *dims)
        return head + struct.pack("<Q", len(payload)) + payload

    obs = np.arange(8, dtype=np.float32).reshape(2, 4) / 8
    assert request(infer_frame(0, (2, 4), obs.tobytes()[:-4])) == (1, b"input 0 'obs': nbytes 28 != 32")
    status, msg = request(infer_frame(3, (2, 4), obs.astype(np.int64).tobytes()))
    assert status == 1 and b"dtype" in msg
    assert request(struct.pack("<III", MAGIC, 1, 0))[0] == 1
    assert request(struct.pack("<II", MAGIC, 2)) == (0, b"")
    assert struct.unpack("<I", proc.stdout.read(4)) == (0,)  # ping: zero outputs

    assert request(infer_frame(0, (2, 4), obs.tobytes())) == (0, b"")
    (n_out, name_len) = struct.unpack("<II", proc.stdout.read(8))
    assert (n_out, proc.stdout.read(name_len)) == (1, b"logits")
    dtype, ndim = struct.unpack("<II", proc.stdout.read(8))
    dims = struct.unpack(f"<{ndim}q", proc.stdout.read(8 * ndim))
    (nbytes,) = struct.unpack("<Q", proc.stdout.read(8))
    logits = np.frombuffer(proc.stdout.read(nbytes), np.float32).reshape(dims)
    assert dtype == 0 and dims == (2, 2)
    np.testing.assert_allclose(logits, mlp.reference(obs), atol=1e-5)

    proc.stdin.close()  # EOF is a clean shutdown
    assert proc.wait(timeout=10) == 0


# ---- failure handling -----------------------------------------------------------------------------------


def test_hang_times_out_and_kills(mlp: Mlp, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MSRL_LITE_RUNNER_FAULT", "hang")
    r = LiteRunner(mlp.ms, runner=TEST_RUNNER, timeout=1.0, max_restarts=0)
    pid = r.pid
    assert pid is not None
    with pytest.raises(RunnerTimeout, match="within the timeout"):
        r.infer(np.zeros((1, 4), np.float32))
    assert _gone(pid)
    with pytest.raises(RunnerCrashed, match="down after: timeout .* not restarting it .*max_restarts=0"):
        r.ping()
    r.close()


def test_the_wait_follows_the_work_and_a_hang_is_still_bounded(mlp: Mlp, monkeypatch: pytest.MonkeyPatch) -> None:
    """A large first request is preceded by one row that measures the model's cost; a request may then take its rows
    times that cost (with slack) beyond the timeout, and a runner that never answers is still killed."""
    monkeypatch.setenv("MSRL_LITE_RUNNER_FAULT", "hang:500")  # only 500-row requests hang
    with LiteRunner(mlp.ms, runner=TEST_RUNNER, timeout=1.0, max_restarts=0) as r:
        assert r._timeout_for(10_000) == 1.0  # nothing measured yet
        obs = np.random.default_rng(5).standard_normal((400, 4)).astype(np.float32)
        np.testing.assert_allclose(r.infer(obs)["logits"], mlp.reference(obs), atol=1e-5)
        assert r._row_cost is not None and r._row_cost > 0
        assert r._timeout_for(10_000) > r._timeout_for(1) > 1.0
        bound = r._timeout_for(500)
        started = time.monotonic()
        with pytest.raises(RunnerTimeout, match="within the timeout"):
            r.infer(np.zeros((500, 4), np.float32))
        assert bound <= time.monotonic() - started < bound + 10


def test_crash_is_reported(mlp: Mlp, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MSRL_LITE_RUNNER_FAULT", "crash")
    r = LiteRunner(mlp.ms, runner=TEST_RUNNER)
    pid = r.pid
    assert pid is not None
    with pytest.raises(RunnerCrashed, match="SIGABRT"):
        r.infer(np.zeros((1, 4), np.float32))
    assert _gone(pid)
    r.close()


def test_shipped_runner_has_no_fault_hook(mlp: Mlp, monkeypatch: pytest.MonkeyPatch) -> None:
    """The fault injector exists only in the test binary: the shipped one ignores the variable entirely."""
    assert b"MSRL_LITE_RUNNER_FAULT" not in runner_path().read_bytes()
    assert b"MSRL_LITE_RUNNER_FAULT" in TEST_RUNNER.read_bytes()
    monkeypatch.setenv("MSRL_LITE_RUNNER_FAULT", "crash")
    obs = np.random.default_rng(6).standard_normal((3, 4)).astype(np.float32)
    with LiteRunner(mlp.ms) as r:
        np.testing.assert_allclose(r.infer(obs)["logits"], mlp.reference(obs), atol=1e-5)


@pytest.mark.slow
def test_runner_restarts_after_a_timeout(mlp: Mlp, monkeypatch: pytest.MonkeyPatch, caplog) -> None:
    """A long-lived loop survives one bad request: it raises, and the next request gets a fresh runner."""
    monkeypatch.setenv("MSRL_LITE_RUNNER_FAULT", "hang:3")  # only 3-row requests hang
    obs = np.random.default_rng(7).standard_normal((1, 4)).astype(np.float32)
    with LiteRunner(mlp.ms, runner=TEST_RUNNER, timeout=1.0, max_restarts=1) as r:
        first = r.pid
        with pytest.raises(RunnerTimeout):
            r.infer(np.zeros((3, 4), np.float32))
        assert first is not None and _gone(first)
        with caplog.at_level("WARNING", logger="inference.lite.client"):
            np.testing.assert_allclose(r.infer(obs)["logits"], mlp.reference(obs), atol=1e-5)
        assert r.pid not in (None, first) and r.restarts == 1
        assert "restarting the Lite runner" in caplog.text and "timeout" in caplog.text
        # Served requests reset the bound: a second bad request is survived the same way.
        with pytest.raises(RunnerTimeout):
            r.infer(np.zeros((3, 4), np.float32))
        assert r.infer(obs)["logits"].shape == (1, 2) and r.restarts == 2


def test_restarts_are_bounded(mlp: Mlp, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MSRL_LITE_RUNNER_FAULT", "crash")  # every request kills the runner
    r = LiteRunner(mlp.ms, runner=TEST_RUNNER, max_restarts=2)
    x = np.zeros((1, 4), np.float32)
    for _ in range(3):  # the first runner, then two restarts, each crash on their request
        with pytest.raises(RunnerCrashed, match="SIGABRT"):
            r.infer(x)
    with pytest.raises(RunnerCrashed, match=r"not restarting it \(2 restart\(s\) in a row served no request"):
        r.infer(x)
    assert r.restarts == 2 and r.pid is None
    r.close()


def test_closed_runner_is_not_restarted(mlp: Mlp) -> None:
    r = LiteRunner(mlp.ms)
    r.close()
    with pytest.raises(LiteRunnerError, match="closed"):
        r.infer(np.zeros((1, 4), np.float32))
    assert r.pid is None and r.restarts == 0


def test_row_cap_refuses_oversized_batches_without_growing(mlp: Mlp) -> None:
    """One 1e6-row batch used to leave the runner at ~800 MB for life; now it is refused, unbuffered."""
    with LiteRunner(mlp.ms, max_rows=1000) as r:
        with pytest.raises(FeedError, match="1001 rows exceed the cap of 1000"):
            r.infer(np.zeros((1001, 4), np.float32))  # refused client-side
        assert r.infer(np.zeros((1000, 4), np.float32))["logits"].shape == (1000, 2)
        r.max_rows = 10**7  # as if the client did not know the cap: the runner refuses on its own
        with pytest.raises(FeedError, match="runner: input 0 'obs': 1000000 rows exceed the runner's cap of 1000"):
            r.infer(np.zeros((1_000_000, 4), np.float32))  # its RSS stays flat: bench/runner_row_cap.py
        assert r.infer(np.zeros((2, 4), np.float32))["logits"].shape == (2, 2)
    with pytest.raises(ValueError, match="max_rows"):
        LiteRunner(mlp.ms, max_rows=0)


def _mindir_header(version: int) -> bytes:
    """A header-only MindIR: producer_name, model_version (where MindSpore 2.x puts its version), version."""

    def varint(v: int) -> bytes:
        out = bytearray()
        while v >= 0x80:
            out.append(v & 0x7F | 0x80)
            v >>= 7
        return bytes(out + bytes([v]))

    def string(field: int, text: bytes) -> bytes:
        return varint(field << 3 | 2) + varint(len(text)) + text

    return string(2, b"MindSpore") + string(5, b"9.9.9") + varint(13 << 3) + varint(version)


@pytest.mark.parametrize("version", [lite_build.MAX_MINDIR + 1, lite_build.MAX_MINDIR + 6, 300])
def test_mindir_reader_agrees_with_lite(tmp_path: Path, version: int) -> None:
    """inference.bundle.mindir (our one reading rule) and Lite's own loader read the same version from the same file."""
    from inference.bundle.mindir import read_header

    path = tmp_path / f"v{version}.mindir"
    path.write_bytes(_mindir_header(version))
    assert read_header(path).mind_ir_version == version and read_header(path).mindspore_version == "9.9.9"
    with pytest.raises(MindIRVersionError) as info:
        LiteRunner(path)
    assert info.value.mind_ir_version == version and info.value.max_mind_ir_version == lite_build.MAX_MINDIR
    expected = f"MindIR v{version} written by MindSpore 9.9.9; this Lite ({lite_build.VERSION}) reads <= v"
    assert str(info.value).startswith(expected + str(lite_build.MAX_MINDIR))
    assert info.value.exit_code == 3


def test_runner_info_reports_the_mindir_versions_lite_accepts() -> None:
    """The runner's own --info agrees with what the build recorded from the SDK."""
    info = json.loads(subprocess.run([str(runner_path()), "--info"], capture_output=True, timeout=60).stdout)
    assert info["lite_version"] == lite_build.VERSION != "?"
    assert info["max_mind_ir_version"] == lite_build.MAX_MINDIR >= 0


def test_close_is_idempotent(mlp: Mlp) -> None:
    r = LiteRunner(mlp.ms)
    proc = r._proc
    assert proc is not None
    r.close()
    r.close()
    assert proc.returncode == 0
    with pytest.raises(LiteRunnerError):
        r.infer(np.zeros((1, 4), np.float32))


def test_missing_model(tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError, match="not found") as info:
        LiteRunner(tmp_path / "nope.ms")
    assert info.value.exit_code == 3


@pytest.mark.parametrize("content", ["truncated", "garbage", "empty"])
def test_corrupt_model(mlp: Mlp, tmp_path: Path, content: str) -> None:
    data = {"truncated": mlp.ms.read_bytes()[:4000], "garbage": os.urandom(3000), "empty": b""}[content]
    bad = tmp_path / "bad.ms"
    bad.write_bytes(data)
    with pytest.raises(ModelLoadError):
        LiteRunner(bad, load_timeout=20.0)


def test_runner_binary_missing(mlp: Mlp, tmp_path: Path) -> None:
    with pytest.raises(RunnerUnavailable) as info:
        LiteRunner(mlp.ms, runner=tmp_path / "no-runner")
    assert info.value.exit_code == 3


def test_ascend_unavailable(mlp: Mlp) -> None:
    with pytest.raises(DeviceUnavailable, match="ascend") as info:
        LiteRunner(mlp.ms, device="ascend", device_id=0, precision_mode="enforce_origin")
    assert info.value.exit_code == 3 and "precision mode enforce_origin" in str(info.value)


def test_ascend_without_a_precision_mode_is_refused_naming_lites_default(mlp: Mlp) -> None:
    with pytest.raises(ModelLoadError, match="enforce_fp16"):
        LiteRunner(mlp.ms, device="ascend", device_id=0)


_EXPORT_MINDIR = """
import sys
import numpy as np
import mindspore as ms
from mindspore import nn

ms.export(nn.Dense(4, 2), ms.Tensor(np.zeros((1, 4), np.float32)), file_name=sys.argv[1], file_format="MINDIR")
"""


@pytest.mark.skipif(importlib.util.find_spec("mindspore") is None, reason="mindspore not installed")
def test_mindir_v3_is_refused_with_versions(tmp_path: Path) -> None:
    # MindSpore runs in its own process: its libmindspore_core.so clashes with Lite's.
    script = tmp_path / "export_mindir.py"
    script.write_text(_EXPORT_MINDIR)
    subprocess.run(
        [sys.executable, str(script), str(tmp_path / "dense")],
        check=True,
        capture_output=True,
        timeout=120,
        env={**os.environ, "GLOG_v": "3"},
    )
    with pytest.raises(MindIRVersionError) as info:
        LiteRunner(tmp_path / "dense.mindir")
    msg = str(info.value)
    assert "MindIR v3" in msg and "MindSpore 2." in msg and "<= v1" in msg and ".ms" in msg
    assert info.value.exit_code == 3 and isinstance(info.value, ModelLoadError)


def _leaky_relu_as_exported(path: Path, alpha: float = 0.2) -> np.ndarray:
    """Gemm → ``Max(Mul(a, h), h)``: how MindSpore 2.10 exports ``nn.LeakyReLU(a)``. Returns the Gemm weight."""
    weight = np.random.default_rng(3).standard_normal((8, 4)).astype(np.float32)
    inits = [numpy_helper.from_array(weight, "w"), numpy_helper.from_array(np.zeros(8, np.float32), "b"),
             numpy_helper.from_array(np.array(alpha, np.float32), "a")]  # fmt: skip
    nodes = [helper.make_node("Gemm", ["obs", "w", "b"], ["h"], transB=1), helper.make_node("Mul", ["a", "h"], ["m"]),
             helper.make_node("Max", ["m", "h"], ["y"])]  # fmt: skip
    graph = helper.make_graph(nodes, "leaky", [helper.make_tensor_value_info("obs", TensorProto.FLOAT, ["batch", 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 8])], inits)  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 11)])
    model.ir_version = 7
    onnx.save(model, str(path))
    return weight


def test_a_failing_lite_kernel_is_named_and_leaky_relu_runs_once_rewritten(model_dir: Path) -> None:
    """Lite fuses the exported Mul + Max into PReLU, whose kernel cannot size a 2-D tensor: Predict says only "Common
    error code", Lite's log names the kernel, and so does the error. As ONNX's own LeakyRelu the graph runs."""
    from msrl_consistency.artifacts.onnx_patterns import fuse_leaky_relu

    weight = _leaky_relu_as_exported(model_dir / "leaky.onnx")
    assert _convert(model_dir / "leaky.onnx", model_dir / "leaky.ms").returncode == 0
    obs = np.random.default_rng(4).standard_normal((5, 4)).astype(np.float32)
    with LiteRunner(model_dir / "leaky.ms") as r, pytest.raises(LiteRunnerError) as info:
        r.infer(obs)
    assert "Common error code" in str(info.value)
    assert "Lite kernel" in str(info.value) and "prelu_fp32.cc ReSize: get channel failed" in str(info.value)
    model = onnx.load(str(model_dir / "leaky.onnx"))
    assert fuse_leaky_relu(model) == 1 and [n.op_type for n in model.graph.node] == ["Gemm", "LeakyRelu"]
    onnx.save(model, str(model_dir / "leaky_fused.onnx"))
    assert _convert(model_dir / "leaky_fused.onnx", model_dir / "leaky_fused.ms").returncode == 0
    with LiteRunner(model_dir / "leaky_fused.ms") as r:
        got = r.infer(obs)["y"]
    h = obs @ weight.T
    np.testing.assert_allclose(got, np.maximum(h, 0.2 * h), rtol=1e-5, atol=1e-6)


def test_a_runner_that_never_starts_is_waited_for_once(mlp: Mlp, tmp_path: Path) -> None:
    """The fork server cannot fork it in time, and the plain start after that gets only what is left of the one
    start-up budget (not a second ``load_timeout``)."""
    silent = tmp_path / "msrl-lite-runner"
    silent.write_text("#!/bin/sh\nexec sleep 600\n")
    silent.chmod(0o755)
    started = time.monotonic()
    with pytest.raises(Exception, match="no answer|did not|not start|handshake|timeout"):
        LiteRunner(mlp.ms, runner=silent, load_timeout=3.0, fork_server=True)
    took = time.monotonic() - started
    assert 3.0 <= took < 3.0 + 0.75 + 2.5, took  # the budget, its last quarter for the plain start, the clean-up


def test_an_installed_package_names_its_own_runner_paths_when_none_is_built(tmp_path, monkeypatch):
    """Installed (no checkout with a .lite beside the package), the runners not built yet: the paths said are the
    environment's (where build_runner puts them), not ones inside site-packages."""
    from inference.lite import common, emulation

    monkeypatch.delenv("MSRL_LITE_RUNNER", raising=False)
    monkeypatch.delenv("MSRL_LITE_AARCH64_RUNNER", raising=False)
    monkeypatch.setattr(common, "_REPO", tmp_path / "site-packages")
    monkeypatch.setattr(emulation, "_REPO", tmp_path / "site-packages")
    monkeypatch.setattr(emulation, "native", lambda: False)
    monkeypatch.setattr(sys, "prefix", str(tmp_path / "env"))
    assert common.runner_path() == tmp_path / "env" / "bin" / common.RUNNER_NAME
    assert emulation.aarch64_runner() == tmp_path / "env" / "share" / "msrl-lite" / "bin-aarch64" / common.RUNNER_NAME
