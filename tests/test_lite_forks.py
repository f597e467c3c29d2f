"""Runners forked from a loaded one (``msrl-lite-runner --fork-server``, ``inference.lite.forks``): what lite-aarch64
starts under qemu-user. A forked runner must be indistinguishable from a plain start to the client: the same answers
bit for bit, its own process group, its own environment, and every fault reported as a plain runner's is; where the
fork server cannot serve, the runner starts as a plain process. Natively, so these run in a second each.
"""

from __future__ import annotations

import os
import signal
import stat
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
from test_lite_runner import TEST_RUNNER, Mlp, _convert, _gone, _mlp_onnx, pytestmark  # noqa: F401 - skips alike

from inference.lite import forks
from inference.lite.client import LiteRunner
from inference.lite.common import RunnerCrashed, RunnerTimeout, runner_path


@pytest.fixture(scope="module")
def mlp(tmp_path_factory: pytest.TempPathFactory) -> Mlp:
    where = tmp_path_factory.mktemp("forks")
    weights = _mlp_onnx(where / "mlp.onnx", seed=3)
    res = _convert(where / "mlp.onnx", where / "mlp.ms")
    assert res.returncode == 0, res.stderr
    return Mlp(where / "mlp.onnx", where / "mlp.ms", weights)


@pytest.fixture(autouse=True)
def _fresh_servers():
    forks.close_all()
    yield
    forks.close_all()


def _servers() -> list[forks.ForkServer]:
    return [s for s in forks._servers.values() if not s.dead]


OBS = np.random.default_rng(11).standard_normal((33, 4)).astype(np.float32)


def test_forked_runners_answer_bitwise_as_a_plain_start_from_one_server(mlp: Mlp) -> None:
    with LiteRunner(mlp.ms, fork_server=False) as plain:
        expected = plain.infer(OBS)["logits"]
        assert not plain.forked
    with LiteRunner(mlp.ms, fork_server=True) as a, LiteRunner(mlp.ms, fork_server=True) as b:
        assert a.forked and b.forked and a.pid != b.pid
        assert len(_servers()) == 1
        for r in (a, b):
            assert os.getpgid(r.pid) == r.pid  # its own session, as a plain start (the client kills the group)
            np.testing.assert_array_equal(r.infer(OBS)["logits"], expected)
            np.testing.assert_array_equal(r.infer(OBS[:1])["logits"], expected[:1])
            assert r.runs_inline == plain.inline_requested
        pid = a.pid
    assert _gone(pid)
    assert all(r.returncode == 0 for r in (a._proc, b._proc) if r is not None)


def test_a_relative_model_path_is_read_where_the_caller_is_now(mlp: Mlp, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    LiteRunner(mlp.ms, fork_server=True).close()  # the fork server starts here
    monkeypatch.chdir(mlp.ms.parent)
    with LiteRunner(mlp.ms.name, fork_server=True) as r:
        assert r.forked
        np.testing.assert_allclose(r.infer(OBS)["logits"], mlp.reference(OBS), atol=1e-5)


def test_threads_starting_runners_at_once_each_get_their_own(mlp: Mlp) -> None:
    def one(_: int) -> tuple[int, np.ndarray]:
        with LiteRunner(mlp.ms, fork_server=True) as r:
            assert r.forked
            return r.pid, r.infer(OBS)["logits"]

    with ThreadPoolExecutor(6) as pool:
        got = list(pool.map(one, range(12)))
    assert len({pid for pid, _ in got}) == 12 and len(_servers()) == 1
    for _, logits in got[1:]:
        np.testing.assert_array_equal(logits, got[0][1])


def test_a_forked_runners_faults_are_reported_as_a_plain_ones(mlp: Mlp, monkeypatch: pytest.MonkeyPatch) -> None:
    # The server starts without a fault; each runner takes the environment it is started with.
    with LiteRunner(mlp.ms, runner=TEST_RUNNER, fork_server=True) as healthy:
        np.testing.assert_allclose(healthy.infer(OBS)["logits"], mlp.reference(OBS), atol=1e-5)
    monkeypatch.setenv("MSRL_LITE_RUNNER_FAULT", "crash")
    with LiteRunner(mlp.ms, runner=TEST_RUNNER, fork_server=True, max_restarts=0) as r:
        assert r.forked
        with pytest.raises(RunnerCrashed, match="SIGABRT"):
            r.infer(OBS)
    monkeypatch.setenv("MSRL_LITE_RUNNER_FAULT", "hang")
    with LiteRunner(mlp.ms, runner=TEST_RUNNER, fork_server=True, timeout=1.0, max_restarts=0) as r:
        pid = r.pid
        with pytest.raises(RunnerTimeout, match="within the timeout"):
            r.infer(OBS)
        assert _gone(pid)
    monkeypatch.delenv("MSRL_LITE_RUNNER_FAULT")
    with LiteRunner(mlp.ms, runner=TEST_RUNNER, fork_server=True, max_restarts=1) as r:
        os.kill(r.pid, signal.SIGKILL)  # from outside: the OOM killer, an operator
        with pytest.raises(RunnerCrashed, match="killed by SIGKILL") as killed:
            r.infer(OBS)
        assert killed.value.signal == signal.SIGKILL
        np.testing.assert_allclose(r.infer(OBS)["logits"], mlp.reference(OBS), atol=1e-5)
        assert r.forked and r.restarts == 1
    assert len(_servers()) == 1


def test_runners_of_a_fork_server_that_died_go_with_it_and_the_next_start_gets_a_new_one(mlp: Mlp) -> None:
    r = LiteRunner(mlp.ms, fork_server=True, max_restarts=1)
    (server,) = _servers()
    first = r.pid
    os.killpg(server._proc.pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while not _gone(first) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _gone(first)  # PR_SET_PDEATHSIG: no runner outlives its fork server
    with pytest.raises(RunnerCrashed, match="killed by SIGKILL"):
        r.infer(OBS)
    np.testing.assert_allclose(r.infer(OBS)["logits"], mlp.reference(OBS), atol=1e-5)
    assert r.forked and r.pid != first and _servers() and _servers()[0] is not server
    r.close()


def test_a_runner_without_a_fork_server_starts_as_a_plain_process(mlp: Mlp, tmp_path: Path, caplog) -> None:
    """A runner built before ``--fork-server`` existed refuses it: the start falls back, and says so."""
    old, asked = tmp_path / "msrl-lite-runner", tmp_path / "asked"
    old.write_text(f'#!/bin/sh\n[ "$1" = --fork-server ] && echo >> {asked} && exit 2\nexec {runner_path()} "$@"\n')
    old.chmod(old.stat().st_mode | stat.S_IXUSR)
    with caplog.at_level("WARNING", logger="inference.lite.client"):
        for _ in range(3):
            with LiteRunner(mlp.ms, runner=old, fork_server=True) as r:
                assert not r.forked
                np.testing.assert_allclose(r.infer(OBS)["logits"], mlp.reference(OBS), atol=1e-5)
    said = [rec for rec in caplog.records if "as a plain process: fork server died while starting" in rec.getMessage()]
    assert len(said) == 1  # a warning once, not one per runner
    assert asked.read_text() == "\n"  # asked once: the later starts do not pay a failed server start first


def test_the_fork_server_is_for_launchers_and_callers_that_ask_and_can_be_turned_off(monkeypatch) -> None:
    assert not forks.wanted(()) and forks.wanted(("qemu-aarch64", "-cpu", "max")) and forks.wanted((), True)
    monkeypatch.setenv("MSRL_LITE_FORK_SERVER", "0")
    assert not forks.wanted(("qemu-aarch64",)) and not forks.wanted((), True)
