"""What the two ways of running Lite share: the runner process (``client``) and the in-process library
(``inprocess``). The error taxonomy (each error carries a distinct CLI exit code), the tensor dtypes both
speak, where the runner lives, and Lite's refusal to load a model as an exception.

NumPy and the standard library only: this runs on a deploy box without any framework installed.
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

import numpy as np

from inference.bundle.mindir import read_header
from inference.errors import EXIT_RUNTIME_UNAVAILABLE

DTYPES: tuple[np.dtype, ...] = tuple(
    np.dtype(t) for t in (np.float32, np.float16, np.int32, np.int64, np.uint8, np.bool_)
)

_REPO = Path(__file__).resolve().parents[2]
RUNNER_NAME = "msrl-lite-runner"
DEFAULT_MAX_ROWS = 65536  # the runner's own default for --max-rows


class LiteRunnerError(RuntimeError):
    """Base of all runner failures: a runtime that could not load or answer, which a CLI reports with exit 3
    (``inference.errors.describe``), whichever failure it was; the subclasses tell them apart in code."""

    exit_code = EXIT_RUNTIME_UNAVAILABLE


class RunnerUnavailable(LiteRunnerError):
    """The runner binary is missing or not executable (not built: run ``make lite``)."""


class ModelLoadError(LiteRunnerError):
    """Lite could not load the model (missing, corrupt, unsupported, bad arguments)."""


class MindIRVersionError(ModelLoadError):
    """The MindIR was written by a newer MindSpore than this Lite can read; the bundle's .ms is the way out."""

    mind_ir_version: int | None = None
    max_mind_ir_version: int | None = None


class DeviceUnavailable(LiteRunnerError):
    """The requested device (e.g. Ascend) cannot be initialised on this machine."""


def forked_child(owner: int, what: str) -> LiteRunnerError:
    """The one line a forked child gets for its parent's Lite state (a model in the process, a runner's pipes): it
    never touches them (Lite's threads, the runner's requests are the parent's); it loads its own."""
    return LiteRunnerError(
        f"{what} was opened by process {owner}; this forked child (pid {os.getpid()}) cannot use "
        "it: load the bundle again in the child (inference.load)"
    )


class RunnerTimeout(LiteRunnerError, TimeoutError):
    """The runner did not answer in time; it has been killed."""


class RunnerCrashed(LiteRunnerError):
    """The runner exited unexpectedly (crash, signal, protocol breakage); ``signal`` is the signal that ended it."""

    signal: int | None = None

    @property
    def killed_from_outside(self) -> bool:
        """Ended by a signal a model cannot raise itself (SIGKILL, SIGTERM, SIGHUP, SIGINT): another process, the
        OOM killer or the user, not the graph (a crashing kernel dies of SIGSEGV, SIGABRT, SIGBUS or SIGFPE)."""
        return self.signal in EXTERNAL_SIGNALS


EXTERNAL_SIGNALS = frozenset({signal.SIGKILL, signal.SIGTERM, signal.SIGHUP, signal.SIGINT})


class InferenceError(LiteRunnerError):
    """Lite accepted the feeds but Resize/Predict failed; the runner is still alive."""


_KIND_ERRORS: dict[str, type[LiteRunnerError]] = {
    "load": ModelLoadError,
    "missing": ModelLoadError,
    "args": ModelLoadError,
    "mindir_version": MindIRVersionError,
    "device": DeviceUnavailable,
}


def lite_precision_args(
    model_path: str | os.PathLike[str], device: str, precision_mode: str | None, config: str | None
) -> tuple[str, str]:
    """The precision mode and runtime configuration Lite is given for a model: the caller's, else those of the bundle
    the file sits in (``bundle.precision.lite_precision``: an Ascend target's mode, an fp16 plan's execution plan
    where this Lite build has fp16 kernels). An Ascend run that would leave the mode to Lite's default (fp16) is a
    ``ModelLoadError`` naming the default and how to choose. Returns ``(mode, config)``, ``""`` for none."""
    import platform

    from inference.bundle.precision_mode import (
        PrecisionModeMissing,
        bundle_of_model,
        file_entry,
        lite_precision,
        refusal,
    )

    if precision_mode is not None:
        return precision_mode, config or ""
    manifest = bundle_of_model(model_path)
    if manifest is None:
        if device == "ascend":
            raise ModelLoadError(refusal(f"{Path(model_path).name} (not in a bundle; pass precision_mode=)"))
        return "", config or ""
    try:
        chosen = lite_precision(manifest, device, platform.machine(), f"the bundle of {Path(model_path).name}")
    except PrecisionModeMissing as exc:
        raise ModelLoadError(str(exc)) from None
    runtime = file_entry(manifest, Path(model_path).name).get("runtime_config") or {}
    if config is None and chosen.precision_mode == "enforce_fp16" and device == "cpu" and runtime.get("file"):
        config = str(Path(model_path).with_name(runtime["file"]))
    return chosen.precision_mode or "", config or ""


def runner_path() -> Path:
    """Runner binary: ``$MSRL_LITE_RUNNER`` if set, else the one ``make lite`` builds in this checkout, else
    the one ``build_lite.sh --out $VIRTUAL_ENV/bin`` put next to this environment's Python.

    The checkout comes first so a source tree always runs its own build; an installed deploy package has no
    checkout and finds the runner in its environment's ``bin``.
    """
    env = os.environ.get("MSRL_LITE_RUNNER")
    if env:
        return Path(env)
    checkout = _REPO / ".lite" / "bin" / RUNNER_NAME
    in_env = Path(sys.prefix) / "bin" / RUNNER_NAME
    if checkout.is_file() or not in_env.is_file() and (_REPO / ".lite").is_dir():
        return checkout  # a source checkout runs its own build (or says where `make lite` puts it)
    return in_env  # an installed deploy package: its environment's bin, built there or not yet


def runner_available() -> tuple[bool, str]:
    """Whether the runner binary can be started, with the path or the reason it cannot."""
    path = runner_path()
    if not path.is_file():
        return False, (
            f"Lite runner not found at {path} (build: bash inference/lite/build_lite.sh; or set MSRL_LITE_RUNNER)"
        )
    if not os.access(path, os.X_OK):
        return False, f"Lite runner at {path} is not executable"
    return True, str(path)


def load_refusal(
    kind: str, msg: str, model_path: str, mind_ir_version: int | None = None, max_mind_ir_version: int | None = None
) -> LiteRunnerError:
    """The exception for Lite's refusal to load a model (the runner's handshake or the in-process library); a MindIR
    version refusal also names the MindSpore that wrote the file."""
    error = _KIND_ERRORS.get(kind, ModelLoadError)(msg)
    if isinstance(error, MindIRVersionError):
        error.mind_ir_version, error.max_mind_ir_version = mind_ir_version, max_mind_ir_version
        try:
            producer = read_header(model_path).mindspore_version
        except OSError:
            producer = None
        tag = f"MindIR v{mind_ir_version}"
        if producer and msg.startswith(tag):
            error.args = (f"{tag} written by MindSpore {producer}{msg[len(tag) :]}",)
    return error
