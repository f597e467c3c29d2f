"""``cli_inprocess.run_module``: what the CLI tests run in their own process says and exits as a real ``python -m``
process does, and leaves the test process as it found it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from cli_inprocess import run_module

from inference.errors import INTERRUPTS


@pytest.mark.parametrize("module", ["msrl_consistency.verify", "msrl_consistency.export"])
def test_a_usage_error_reads_as_from_a_real_process(module, tmp_path):
    args = ["--ckpt", str(tmp_path / "missing.ckpt"), "--out", str(tmp_path / "out")]
    if module.endswith("verify"):
        args = ["--bundle", str(tmp_path / "missing"), *args]
    real = subprocess.run([sys.executable, "-m", module, *args], capture_output=True, text=True, cwd=tmp_path,
                          timeout=300)  # fmt: skip
    handlers = [signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)]
    here = run_module(module, *args, cwd=tmp_path)
    assert real.returncode == 2 and real.stderr.startswith("error: ")
    assert (here.returncode, here.stdout, here.stderr) == (real.returncode, real.stdout, real.stderr)
    # The CLI's Ctrl-C handling was not installed here: this process's dispositions are what later processes inherit.
    assert [signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)] == handlers
    assert "install" not in vars(INTERRUPTS)


def test_the_working_directory_environment_modules_and_signals_are_put_back(tmp_path, monkeypatch):
    """The call sees its working directory first on sys.path (a module there shadows one imported before); what it
    sets or imports does not outlive it."""
    (tmp_path / "shadow_mod.py").write_text("WHERE = 'cwd'\n")
    (tmp_path / "ours").mkdir()  # a package this process imported from the same directory, as the checkout's own
    (tmp_path / "ours" / "__init__.py").write_text("")
    (tmp_path / "ours" / "late.py").write_text("")
    (tmp_path / "probe_cli.py").write_text(
        "import os, signal, sys\nimport ours.late, shadow_mod\n"
        "print(shadow_mod.WHERE, os.getcwd() == sys.argv[1], sys.argv[2:])\n"
        "os.environ['LEAKED'] = '1'\nos.environ.pop('GONE')\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        "os.write(2, b'from fd 2\\n')\nsys.exit(5)\n"
    )
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "shadow_mod.py").write_text("WHERE = 'elsewhere'\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.syspath_prepend(str(elsewhere))
    import ours
    import shadow_mod

    monkeypatch.setenv("GONE", "x")
    before = (os.getcwd(), list(sys.path), signal.getsignal(signal.SIGTERM))
    proc = run_module("probe_cli", str(tmp_path), "a", "b", cwd=tmp_path, env={"GIVEN": "1"})
    assert proc.returncode == 5 and proc.stdout == "cwd True ['a', 'b']\n" and proc.stderr == "from fd 2\n"
    assert (os.getcwd(), list(sys.path), signal.getsignal(signal.SIGTERM)) == before
    assert "LEAKED" not in os.environ and "GIVEN" not in os.environ and os.environ["GONE"] == "x"
    assert sys.modules["shadow_mod"] is shadow_mod and shadow_mod.WHERE == "elsewhere"
    assert "probe_cli" not in sys.modules
    # A submodule it imported of a package loaded before stays, as one module: it is this process's too.
    assert sys.modules["ours"] is ours and sys.modules["ours.late"] is ours.late


def test_pythonpath_needs_a_process(tmp_path):
    with pytest.raises(ValueError, match="start a process"):
        run_module("msrl_consistency.verify", cwd=Path(tmp_path), env={"PYTHONPATH": str(tmp_path)})


def test_a_hang_past_the_timeout_ends_the_process_with_the_stacks(tmp_path):
    (tmp_path / "hangs.py").write_text("import time\ntime.sleep(60)\n")
    code = f"import sys\nsys.path.insert(0, {str(Path(__file__).parent)!r})\nfrom cli_inprocess import run_module\n"
    code += f"run_module('hangs', cwd={str(tmp_path)!r}, timeout=1)\nprint('returned')"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0 and "returned" not in proc.stdout
    assert "Timeout (0:00:01)!" in proc.stderr and "hangs.py" in proc.stderr, proc.stderr[-2000:]
