"""Error types that the CLIs turn into one-line messages and documented exit codes."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import NoReturn

EXIT_OK = 0
EXIT_INCONSISTENT = 1
EXIT_USAGE = 2
EXIT_RUNTIME_UNAVAILABLE = 3


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


def run_cli(main: Callable[[list[str] | None], int], argv: list[str] | None = None) -> NoReturn:
    """Run a CLI entry point, mapping expected errors to ``error: ...`` on stderr and their exit code."""
    try:
        code = main(argv)
    except MsrlError as exc:
        print(f"error: {exc}", file=sys.stderr)
        code = exc.exit_code
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        code = 130
    sys.exit(code)
