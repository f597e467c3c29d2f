"""``python -m MODULE ARGS`` run inside the test's own process, for the tests whose subject is what a CLI says and
writes, not the process around it.

The module's ``__main__`` block runs as ``python -m`` runs it (``runpy``, ``sys.argv``, the working directory first
on ``sys.path``, a module of that directory shadowing another copy of it imported before), its output is read from
file descriptors 1 and 2 (MindSpore's and Lite's C++ lines included) and its exit code from ``SystemExit``. Nothing
it changes outlives the call: the environment, the working directory, ``sys.path``, the signal handlers and the
modules it imported from the working directory are put back. It installs no Ctrl-C handling: a signal disposition
of this process is inherited by every process the tests start later. What it saves is the second interpreter: a
MindSpore CLI pays ~1.5 CPU-s to start before it does anything.

Where the process itself is the subject (a signal, a kill, a deploy box without MindSpore, an import's own cost, a
compile cache across processes) the tests start a real one.
"""

from __future__ import annotations

import contextlib
import faulthandler
import io
import os
import runpy
import signal
import subprocess
import sys
import tempfile
import warnings
from collections.abc import Iterator
from pathlib import Path

from inference.errors import INTERRUPTS

SIGNALS = (signal.SIGINT, signal.SIGTERM)


def run_module(
    module: str, *args: str, cwd: Path | str | None = None, env: dict[str, str] | None = None, timeout: float = 600
) -> subprocess.CompletedProcess[str]:
    """``subprocess.run([python, "-m", module, *args], cwd=cwd, env={**os.environ, **env}, capture_output=True,
    text=True, timeout=timeout)``, in this process. Past ``timeout`` every thread's stack goes to the process's
    stderr and the process exits (``faulthandler``): a hang fails the run as ``subprocess.run``'s timeout did."""
    if env and "PYTHONPATH" in env:
        raise ValueError("PYTHONPATH is read as an interpreter starts: start a process for it")
    where = Path(cwd or os.getcwd()).resolve()
    argv = [sys.executable, "-m", module, *args]
    with _process_state(where, env or {}), _deadline(timeout), _captured() as (out, err):
        sys.argv = [sys.executable, *args]  # runpy replaces argv[0] with the module's path, as -m does
        try:
            with warnings.catch_warnings():  # imported before by the tests: its code runs again as __main__, as
                warnings.filterwarnings("ignore", "'.*' found in sys.modules", RuntimeWarning)  # python -m runs it
                runpy.run_module(module, run_name="__main__", alter_sys=True)
            code = 0
        except SystemExit as exc:
            code = _exit_code(exc.code)
    return subprocess.CompletedProcess(argv, code, out.getvalue(), err.getvalue())


@contextlib.contextmanager
def _deadline(seconds: float) -> Iterator[None]:
    """Past ``seconds``, the stacks on this process's own stderr (not the call's captured one), then exit."""
    stream = os.fdopen(os.dup(2), "w")
    faulthandler.dump_traceback_later(seconds, exit=True, file=stream)
    try:
        yield
    finally:
        faulthandler.cancel_dump_traceback_later()
        stream.close()


def _exit_code(code: object) -> int:
    """What the interpreter makes of ``sys.exit(code)``: None is 0, a message is printed and is 1."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)
    return 1


@contextlib.contextmanager
def _process_state(cwd: Path, env: dict[str, str]) -> Iterator[None]:
    """A fresh ``python -m`` process's view of the environment, the working directory and its modules; all of it
    restored at exit."""
    saved_env, saved_cwd, saved_path, saved_argv = dict(os.environ), os.getcwd(), list(sys.path), list(sys.argv)
    saved_signals = {sig: signal.getsignal(sig) for sig in SIGNALS}  # None: a handler set from C (MindSpore's)
    saved_interrupts = (INTERRUPTS.requested, INTERRUPTS._defer)
    shadowed = {name: sys.modules.pop(name) for name in _local_modules(cwd)
                if name in sys.modules and not _from(sys.modules[name], cwd)}  # fmt: skip
    before = set(sys.modules)
    try:
        INTERRUPTS.install = lambda: None  # the CLI's Ctrl-C handling is tested in processes of their own
        os.environ.update(env)
        os.chdir(cwd)
        sys.path.insert(0, str(cwd))
        yield
    finally:
        # What it imported from its working directory goes with it: a module or package new to this process, and
        # its submodules. (New submodules of packages loaded before stay: they are this process's own.)
        local = {name for name in set(sys.modules) - before if "." not in name and _from(sys.modules[name], cwd)}
        for name in [n for n in sys.modules if n.partition(".")[0] in local]:
            del sys.modules[name]
        sys.modules.update(shadowed)
        for sig, handler in saved_signals.items():
            if handler is not None and signal.getsignal(sig) is not handler:
                signal.signal(sig, handler)
        INTERRUPTS.requested, INTERRUPTS._defer = saved_interrupts
        del INTERRUPTS.install  # the class's own again
        sys.argv, sys.path[:] = saved_argv, saved_path
        os.chdir(saved_cwd)
        os.environ.clear()
        os.environ.update(saved_env)


def _from(module: object, directory: Path) -> bool:
    """Whether a top-level module or package was imported from ``directory``."""
    file = getattr(module, "__file__", None)
    if not file:
        return False
    path = Path(file).resolve()
    return (path.parent.parent if path.name == "__init__.py" else path.parent) == directory


def _local_modules(cwd: Path) -> set[str]:
    """The top-level modules and packages a process started in ``cwd`` would import from there."""
    return {p.stem for p in cwd.glob("*.py")} | {p.parent.name for p in cwd.glob("*/__init__.py")}


@contextlib.contextmanager
def _captured() -> Iterator[tuple[io.StringIO, io.StringIO]]:
    """Everything written to file descriptors 1 and 2 and to ``sys.stdout``/``sys.stderr`` inside the block."""
    out, err = io.StringIO(), io.StringIO()
    with tempfile.TemporaryFile() as fout, tempfile.TemporaryFile() as ferr:
        sys.stdout.flush()
        sys.stderr.flush()
        saved_fds = (os.dup(1), os.dup(2))
        saved_streams = (sys.stdout, sys.stderr)
        os.dup2(fout.fileno(), 1)
        os.dup2(ferr.fileno(), 2)
        try:
            sys.stdout = open(1, "w", buffering=1, closefd=False)  # noqa: SIM115 - closed below
            sys.stderr = open(2, "w", buffering=1, closefd=False)  # noqa: SIM115 - closed below
            yield out, err
        finally:
            for stream in {sys.stdout, sys.stderr} - set(saved_streams):
                stream.flush()
                stream.close()
            sys.stdout, sys.stderr = saved_streams
            os.dup2(saved_fds[0], 1)
            os.dup2(saved_fds[1], 2)
            for fd in saved_fds:
                os.close(fd)
            for target, file in ((out, fout), (err, ferr)):
                file.seek(0)
                target.write(file.read().decode(errors="replace"))
