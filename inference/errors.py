"""Error types and the one place that turns any exception into a one-line message and an exit code.

The rule every CLI follows: exit 1 means "the runtimes disagree" (verify) or "the written graphs disagree with
their Cell" (export), and only a verdict can produce it: a CLI returns 1 from ``main`` or raises one of the
exception types it declares as ``verdicts``. Everything else a user can cause is 2 (bad input, unwritable
output, a full disk), 3 not verified (a required runtime is unavailable, no runtime was compared, or a runtime
could not be judged), 130 interrupted.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
import traceback
from collections.abc import Callable, Iterator
from typing import NoReturn

EXIT_OK = 0
EXIT_INCONSISTENT = 1
EXIT_USAGE = 2
EXIT_RUNTIME_UNAVAILABLE = 3
EXIT_INTERRUPTED = 130
_INPUT_CODES = (EXIT_USAGE, EXIT_RUNTIME_UNAVAILABLE)
EXIT_CODES = (
    "exit codes: 0 consistent, 1 inconsistent, 2 usage/input error, 3 not verified (nothing compared, a required "
    "runtime unavailable, or a runtime that could not be judged), 130 interrupted"
)


class MsrlError(Exception):
    """Base class: an expected failure with a message meant for the user, never a traceback."""

    exit_code = EXIT_USAGE


class UsageError(MsrlError):
    """Bad flags, bad files, bad environments: the user can fix it (exit 2)."""


class RuntimeUnavailable(MsrlError):
    """A runtime the user required cannot run on this machine (exit 3)."""

    exit_code = EXIT_RUNTIME_UNAVAILABLE


def first_line(exc: BaseException, limit: int = 200) -> str:
    """The first line of an exception's message (MindSpore appends long C++ call stacks), or its type name."""
    text = str(exc).strip()
    return text.splitlines()[0][:limit] if text else type(exc).__name__


def describe(exc: BaseException) -> tuple[str, int]:
    """The message and exit code for an exception that is not a verdict."""
    if isinstance(exc, OSError) and not isinstance(exc, MsrlError):
        where = f" ({exc.filename})" if exc.filename else ""
        return f"{exc.strerror or first_line(exc)}{where}", EXIT_USAGE  # a full disk, a read-only dir...
    code = getattr(exc, "exit_code", None)  # ours, and the deploy side's BundleError, ContractError, FeedError
    if isinstance(code, int) and code in _INPUT_CODES:
        return first_line(exc, 400), code
    if isinstance(exc, MsrlError) or code is not None:
        return first_line(exc, 400), EXIT_USAGE
    hint = "" if os.environ.get("MSRL_DEBUG") else " (internal error; set MSRL_DEBUG=1 for the traceback)"
    return f"{type(exc).__name__}: {first_line(exc)}{hint}", EXIT_USAGE


class Interrupts:
    """Ctrl-C for processes that run MindSpore graphs: one clean ``KeyboardInterrupt``, and a second one exits at once.

    MindSpore 2.10 installs a C-level SIGINT handler when it compiles or runs a graph; that handler ends the
    process by sending it SIGTERM (exit 143, no message, ``finally`` blocks skipped). Python's handlers still
    receive that SIGTERM, so both signals land here: the first raises ``KeyboardInterrupt`` (or, inside
    ``deferred()``, only sets ``requested`` so a training iteration can finish and checkpoint); the second exits
    130 at once. A SIGTERM sent by a job scheduler is therefore also a graceful stop.
    """

    def __init__(self) -> None:
        self.requested = False
        self._defer = False
        self._notice: str | None = None

    def install(self) -> None:
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, self._handle)

    def check(self) -> None:
        """Raise the pending interrupt at a safe point: a ``KeyboardInterrupt`` raised while MindSpore's C++ was on
        the stack can be swallowed or turned into a ``RuntimeError``, so long loops also look at the flag."""
        if self.requested and not self._defer:
            raise KeyboardInterrupt("interrupted")

    def _handle(self, signum: int, _frame: object) -> None:
        if self.requested:
            print("interrupted again: exiting now", file=sys.stderr, flush=True)
            os._exit(EXIT_INTERRUPTED)
        self.requested = True
        if not self._defer:
            raise KeyboardInterrupt(signal.Signals(signum).name)
        if self._notice:
            print(self._notice, file=sys.stderr, flush=True)

    @contextlib.contextmanager
    def deferred(self, notice: str | None = None) -> Iterator[Interrupts]:
        """Inside the block a first signal only sets ``requested`` (and prints ``notice``: what the stop waits for);
        the caller stops at a safe point. Blocks nest (leaving an inner one keeps the outer one's deferral)."""
        outer = self._defer, self._notice
        self._defer, self._notice = True, notice or self._notice
        try:
            yield self
        finally:
            self._defer, self._notice = outer


INTERRUPTS = Interrupts()


@contextlib.contextmanager
def _one_line_argument_errors() -> Iterator[None]:
    """argparse's errors as our one ``error:`` line and exit 2, not its usage block (for the command's run only)."""
    original = argparse.ArgumentParser.error

    def error(self: argparse.ArgumentParser, message: str) -> NoReturn:
        raise UsageError(f"{message} (see {self.prog} --help)")

    argparse.ArgumentParser.error = error  # type: ignore[method-assign]
    try:
        yield
    finally:
        argparse.ArgumentParser.error = original  # type: ignore[method-assign]


def run_cli(
    main: Callable[[list[str] | None], int],
    argv: list[str] | None = None,
    verdicts: tuple[type[BaseException], ...] = (),
) -> NoReturn:
    """Run a CLI entry point: ``error: ...`` on stderr and the exit code from ``describe`` (or 1 for a verdict)."""
    INTERRUPTS.install()
    try:
        with _one_line_argument_errors():
            code = main(argv)
        if code == EXIT_OK:
            INTERRUPTS.check()  # a signal swallowed on its way through C++ still ends the run as interrupted
    except verdicts as exc:
        print(f"error: {exc}", file=sys.stderr)
        code = EXIT_INCONSISTENT
    except KeyboardInterrupt:
        print("interrupted; temporary files removed, nothing half-written left behind", file=sys.stderr)
        code = EXIT_INTERRUPTED
    except Exception as exc:  # noqa: BLE001 - the one place every exception becomes a line and a code
        if INTERRUPTS.requested:  # the interrupt, turned into another exception by a C++ frame
            print("interrupted; temporary files removed, nothing half-written left behind", file=sys.stderr)
            sys.exit(EXIT_INTERRUPTED)
        if os.environ.get("MSRL_DEBUG"):
            traceback.print_exc()
        message, code = describe(exc)
        print(f"error: {message}", file=sys.stderr)
    sys.exit(code)
