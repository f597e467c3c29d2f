"""Ctrl-C while MindSpore runs graphs: exit 130 with one line, no temp files left, a second Ctrl-C exits at once.

MindSpore turns SIGINT into a SIGTERM that kills the process (exit 143) unless we catch it; these tests send a
real SIGINT to a real CLI in the middle of its work.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from inference.bundle.precision_mode import CONVERTER_CONFIG


def start(*args: str, cwd: Path | None = None) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen([sys.executable, "-m", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            cwd=cwd, env=env)  # fmt: skip


def wait_for(condition, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "the CLI never reached the point to interrupt"
        time.sleep(0.05)


def test_ctrl_c_during_export_leaves_no_temp_dir(cartpole_ckpt, tmp_path):
    out = tmp_path / "bundles" / "b"
    proc = start("msrl_consistency.export", "--ckpt", str(cartpole_ckpt), "--out", str(out))
    # Interrupt once the bundle's temp dir holds a written graph (MindSpore has compiled and exported by then).
    wait_for(lambda: any(p.name.startswith(".b.") and any(p.iterdir()) for p in out.parent.glob(".b.*")))
    proc.send_signal(signal.SIGINT)
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 130, stderr[-2000:]
    assert stderr.strip().splitlines()[-1].startswith("error: ") is False and "interrupted" in stderr
    assert list(out.parent.iterdir()) == []  # neither the bundle nor its temp dir


def test_ctrl_c_while_export_compiles_says_one_line_not_mindspores_log(cartpole_ckpt, tmp_path):
    """The first graph compiles right after the bundle's temp dir receives its converter configuration: MindSpore's
    C++ log of the interrupted compile (its pipeline error and the Cell's source lines) stays out of the console."""
    out = tmp_path / "bundles" / "b"
    proc = start("msrl_consistency.export", "--ckpt", str(cartpole_ckpt), "--out", str(out))
    wait_for(lambda: any(out.parent.glob(f".b.*/{CONVERTER_CONFIG}")) or proc.poll() is not None, timeout=120)
    proc.send_signal(signal.SIGINT)
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 130, stderr[-2000:]
    assert "[ERROR]" not in stderr and "# In file" not in stderr, stderr[-2000:]
    assert len(stderr.strip().splitlines()) == 1 and "interrupted" in stderr


@pytest.mark.slow
def test_ctrl_c_during_verify_exits_130_and_twice_exits_at_once(cartpole_bundle, cartpole_ckpt, tmp_path):
    args = ("msrl_consistency.verify", "--bundle", str(cartpole_bundle.root), "--ckpt", str(cartpole_ckpt),
            "--out", str(tmp_path / "r"), "--episodes", "20")  # fmt: skip
    proc = start(*args)
    lines: list[str] = []
    # the first runtime judged: the reference's graphs have run (MindSpore's handler installed), more runtimes follow
    wait_for(lambda: bool(lines.append(proc.stderr.readline()) or any(" s)" in line for line in lines)))
    proc.send_signal(signal.SIGINT)
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 130, "".join(lines) + stderr[-2000:]
    assert "interrupted" in stderr and not (tmp_path / "r").exists()  # no report set, not even an empty --out
    proc = start(*args)
    lines = []
    wait_for(lambda: bool(lines.append(proc.stderr.readline()) or any("reference" in line for line in lines)))
    proc.send_signal(signal.SIGINT)
    proc.send_signal(signal.SIGINT)
    proc.communicate(timeout=60)
    assert proc.returncode == 130


@pytest.mark.parametrize("sig", [signal.SIGTERM])
def test_a_scheduler_sigterm_is_a_graceful_stop_too(cartpole_bundle, cartpole_ckpt, tmp_path, sig):
    proc = start("msrl_consistency.verify", "--bundle", str(cartpole_bundle.root), "--ckpt", str(cartpole_ckpt),
                 "--out", str(tmp_path / "r"))  # fmt: skip
    lines: list[str] = []
    wait_for(lambda: bool(lines.append(proc.stderr.readline()) or any("reference" in line for line in lines)))
    proc.send_signal(sig)
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 130 and "interrupted" in stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # nothing half-written: no --out, no temp dir


INTERRUPTED = "interrupted; temporary files removed, nothing half-written left behind"


def _importing_mindspore(pid: int) -> bool:
    """MindSpore's C++ core is mapped into the process: its import has started (~1 s of it remains)."""
    try:
        return "_c_expression" in Path(f"/proc/{pid}/maps").read_text()
    except OSError:
        return False


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/maps").exists(), reason="needs /proc to see MindSpore's import start")
def test_a_signal_while_mindspore_imports_exits_130_with_one_line(cartpole_bundle, cartpole_ckpt, tmp_path):
    """A Ctrl-C or SIGTERM during MindSpore's import used to land inside it and abort the interpreter at exit ("Fatal
    Python error ... the GIL is released", -6); each signal is sent at several points of the import."""
    commands = {
        "verify": ("msrl_consistency.verify", "--bundle", str(cartpole_bundle.root), "--ckpt", str(cartpole_ckpt),
                   "--observations", "100", "--episodes", "1"),
        "export": ("msrl_consistency.export", "--ckpt", str(cartpole_ckpt), "--formats", "mindir"),
    }  # fmt: skip
    cases = [("verify", signal.SIGINT, d) for d in (0.0, 0.3, 0.6)]
    cases += [("verify", signal.SIGTERM, d) for d in (0.0, 0.4)] + [("export", signal.SIGINT, 0.2)]
    for k, (command, sig, delay) in enumerate(cases):
        out = tmp_path / f"out{k}"
        proc = start(*commands[command], "--out", str(out / "target"))
        wait_for(lambda: _importing_mindspore(proc.pid) or proc.poll() is not None, timeout=60)  # noqa: B023
        time.sleep(delay)
        proc.send_signal(sig)
        _, stderr = proc.communicate(timeout=120)
        case = f"{command} {sig.name} {delay} s into the import: rc {proc.returncode}\n{stderr[-3000:]}"
        assert proc.returncode == 130, case
        assert stderr.strip().splitlines() == [INTERRUPTED], case
        assert not out.exists(), case


def test_deferred_blocks_nest():
    """Leaving an inner ``deferred()`` (MindSpore's import inside a training iteration) keeps the outer deferral."""
    from inference.errors import Interrupts

    interrupts = Interrupts()
    with interrupts.deferred():
        with interrupts.deferred():
            pass
        interrupts._handle(signal.SIGINT, None)  # deferred: noted, not raised
        assert interrupts.requested
        interrupts.check()  # still deferred: no raise
    with pytest.raises(KeyboardInterrupt):
        interrupts.check()
