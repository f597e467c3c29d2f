"""The device, threads, seeds and compute dtypes MindSpore runs with (one device per process)."""

from __future__ import annotations

import os

import mindspore as ms
import numpy as np

from msrl_consistency.compat.graph import execution_mode

DEVICES = {"cpu": "CPU", "gpu": "GPU", "ascend": "Ascend"}
_configured: dict[str, object] = {}


def mindspore_version() -> str:
    return ms.__version__


def set_device(device: str = "cpu", device_id: int = 0) -> None:
    """Select the device once per process (``ms.set_device``; ``set_context(device_target=)`` is deprecated).

    Raises ``ValueError`` with a readable reason when the device is not available here.
    """
    target = check_device(device)
    if _configured.get("device") == (target, device_id):
        return
    if target == "CPU":
        gemm_convolutions()
    if "device" in _configured:
        raise ValueError(f"device already set to {_configured['device']}; one device per process")
    try:
        ms.set_device(target, device_id)
    except RuntimeError:
        # The caller ran a kernel first (a library user who loads and runs a policy, then exports it): MindSpore
        # then keeps the device it started on, which is fine when it is the one asked for.
        if ms.get_context("device_target") != target:
            raise ValueError(f"MindSpore already runs on {ms.get_context('device_target')}, not {device!r}: select the "
                             "device before running any Cell") from None  # fmt: skip
    _configured["device"] = (target, device_id)


# oneDNN 3.10 (MindSpore 2.10's CPU convolutions) on a CPU with AVX-512 runs MindSpore's plain NCHW convolutions
# through ``jit_uni_ncsp:conv+ref``, a reference inner loop: 30 ms per 84x84x4 frame for an Atari torso's first
# convolution, where its GEMM path (``gemm:jit``, chosen up to AVX2) takes 0.7 ms (measured on a 2-core Xeon with
# AVX-512/AMX; an MLP's speed is unchanged). A user's own ONEDNN_MAX_CPU_ISA is kept.
ONEDNN_ISA = "AVX2"


def gemm_convolutions() -> None:
    """Cap oneDNN's instruction set at AVX2 (its GEMM convolutions) before its first kernel reads it."""
    os.environ.setdefault("ONEDNN_MAX_CPU_ISA", ONEDNN_ISA)


def check_device(device: str) -> str:
    """MindSpore's name for ``device`` if this build can use it, else ``ValueError`` (nothing is initialised)."""
    key = device.lower()
    if key not in DEVICES:
        raise ValueError(f"unknown device {device!r}; choose one of {', '.join(DEVICES)}")
    target = DEVICES[key]
    if not ms.hal.is_available(target):
        raise ValueError(
            f"device {device!r} is not available in this MindSpore build ({mindspore_version()}); "
            "install the matching MindSpore package or use --device cpu"
        )
    return target


def select_device(device: str = "cpu", device_id: int = 0) -> str | None:
    """``set_device`` before any kernel runs (MindSpore refuses it afterwards); returns why not instead of raising,
    so that a missing backend is reported by the runtimes that need it (unavailable, exit 3)."""
    try:
        set_device(device, device_id)
    except ValueError as exc:
        return str(exc)
    return None


def set_threads(num_threads: int) -> None:
    """Pin CPU op threads; MindSpore lets this be set only once per process, so later calls are ignored."""
    if "threads" in _configured or num_threads <= 0:
        return
    ms.device_context.cpu.op_tuning.threads_num(num_threads)
    _configured["threads"] = num_threads


def check_compute_dtype(dtype_name: str) -> None:
    """Compile and run a tiny dense layer forward and backward in ``dtype_name`` on the current device.

    Raises ``ValueError`` with MindSpore's reason when the backend has no kernel for it (CPU: no bfloat16
    Dense/MatMul in 2.10), so a run fails before training instead of at its first update.
    """
    from mindspore import ops

    dtype = {"fp16": ms.float16, "bf16": ms.bfloat16}[dtype_name]

    def loss(w: ms.Tensor, x: ms.Tensor) -> ms.Tensor:
        return ops.tanh(ops.dense(x.astype(dtype), w.astype(dtype))).astype(ms.float32).sum()

    w, x = ms.Tensor(np.ones((2, 2), np.float32)), ms.Tensor(np.ones((2, 2), np.float32))
    try:
        with execution_mode(graph=False):
            ms.grad(loss)(w, x).asnumpy()
    except (RuntimeError, TypeError, ValueError) as exc:
        reason = next((line.strip() for line in str(exc).splitlines() if "nsupported" in line), "no kernel")
        device = ms.get_context("device_target")
        raise ValueError(
            f"--update-precision {dtype_name} is not supported by MindSpore {mindspore_version()} on {device}: {reason}"
        ) from None


def set_seed(seed: int) -> None:
    """Seed MindSpore's global RNG: used only by weight initialisers (all sampling noise comes from the host)."""
    ms.set_seed(seed)
