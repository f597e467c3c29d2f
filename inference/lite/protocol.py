"""The wire format between ``LiteRunner`` (``client.py``) and ``msrl-lite-runner`` (``runner/``).

Protocol (all integers little-endian), over the runner's stdin/stdout:

* Handshake: after loading, the runner writes one JSON line, ``{"ok": true, "lite_version", "model",
  "device", "max_rows", "inline", "cpu_fp16", "inputs": [{"name", "dtype", "shape"}], "outputs": [...]}`` (``inline``:
  whether it runs the graph on its serving thread, inference/lite/runner/inline_run.h; ``cpu_fp16``: what became of
  ``--cpu-fp16``, "off", "on" or "ignored: " and Lite's own words) or ``{"ok": false, "kind":
  "load"|"mindir_version"|"device"|"args"|"missing", "error"}`` and exits with 4/5/6/2/3 respectively
  (``mindir_version`` adds ``mind_ir_version`` and ``max_mind_ir_version``, both as Lite read them).
* Request: ``u32 magic, u32 op`` (1 infer, 2 ping, 3 quit, 4 tap, 5 stats); infer and tap add ``u32 n_inputs`` and per
  input ``u32 dtype, u32 ndim, i64 dims[ndim], u64 nbytes, bytes``, in the model's input order.
* Response: ``u32 magic, u32 status`` (0 ok, 1 bad request, 2 inference failure); if ok ``u32 n_outputs``
  and per output ``u32 name_len, name, u32 dtype, u32 ndim, i64 dims[ndim], u64 nbytes, bytes``, else
  ``u32 msg_len, msg``. Ping answers status 0 with no outputs; quit and EOF end the process with code 0. A tap
  answers ``u32 n_kernels`` and per kernel, in execution order, ``u32 name_len, name, u32 type_len, type, u32
  n_outputs`` and its outputs framed as above (every kernel's outputs: layer localisation). Stats answers ``u64
  calls, u64 inline_calls, u32 inline``: the model's Predicts so far and how many ran on the serving thread.
* Dtype codes: 0 float32, 1 float16, 2 int32, 3 int64, 4 uint8, 5 bool (one byte).
* A request whose first dimension exceeds ``max_rows`` (``--max-rows``, default 65536) is refused with status 1
  and its payload skipped unbuffered: one huge batch would otherwise grow Lite's buffers for the runner's life.

``msrl-lite-runner --info`` prints ``{"lite_version", "max_mind_ir_version", ...}`` and exits (``runner_info.py``).
"""

from __future__ import annotations

import re
import struct
from dataclasses import dataclass
from typing import Any

import numpy as np

from inference.bundle.tensors import FeedError, TensorMeta
from inference.lite.common import DTYPES, InferenceError

MAGIC = 0x4D534C52
OP_INFER, OP_PING, OP_QUIT, OP_TAP, OP_STATS = 1, 2, 3, 4, 5
STATUS_OK, STATUS_BAD_REQUEST, STATUS_INFER_FAILED = 0, 1, 2
DTYPE_CODE = {dt: code for code, dt in enumerate(DTYPES)}
DTYPE_BY_NAME = {dt.name: dt for dt in DTYPES}

U32 = struct.Struct("<I")
U32X2 = struct.Struct("<II")
U32X3 = struct.Struct("<III")
U64 = struct.Struct("<Q")
STATS = struct.Struct("<QQI")
PING = U32X2.pack(MAGIC, OP_PING)
QUIT = U32X2.pack(MAGIC, OP_QUIT)
KERNEL_FAILED = re.compile(r"run kernel (?:PreProcess |Run )?failed, name: (\S+)")
LOG_SOURCE = re.compile(r"\[(?:\S*/)?([\w.]+\.cc):\d+\] (\w+)\] (.*)$")  # [path/prelu_fp32.cc:90] ReSize] msg


@dataclass(frozen=True)
class KernelOutputs:
    """One Lite kernel's outputs from a tap request: its name (the converter's node name), type and tensors."""

    name: str
    kind: str
    outputs: dict[str, np.ndarray]


STATUS_ERRORS: dict[int, type[Exception]] = {
    STATUS_BAD_REQUEST: FeedError,
    STATUS_INFER_FAILED: InferenceError,
}


def tensor_meta(t: dict[str, Any]) -> TensorMeta:
    """An input or output as the handshake describes it."""
    return TensorMeta(t["name"], DTYPE_BY_NAME[t["dtype"]], tuple(int(d) for d in t["shape"]))


def feed_head(meta: TensorMeta, arr: np.ndarray) -> bytes:
    """Validates one feed against the model input and packs its frame header (dtype, dims, nbytes)."""
    if arr.dtype != meta.dtype:
        raise FeedError(f"input '{meta.name}': dtype {arr.dtype} != expected {meta.dtype}")
    if arr.ndim != len(meta.shape):
        raise FeedError(
            f"input '{meta.name}': shape {arr.shape} has rank {arr.ndim}, expected rank {len(meta.shape)} {meta.shape}"
        )
    # The batch dim is the runner's to resize (as in the in-process library): a model converted at a fixed batch,
    # e.g. calibrated for full quantization at batch 1, runs at any batch.
    if any(want >= 0 and d > 0 and got != want for d, (got, want) in enumerate(zip(arr.shape, meta.shape,
                                                                                    strict=True))):  # fmt: skip
        raise FeedError(f"input '{meta.name}': shape {arr.shape} does not match {meta.shape}")
    return (
        U32X2.pack(DTYPE_CODE[meta.dtype], arr.ndim) + struct.pack(f"<{arr.ndim}q", *arr.shape) + U64.pack(arr.nbytes)
    )


def kernel_failure(log_text: str) -> str:
    """The Lite kernel that failed, from Lite's own error log: Predict's status names no op ("Common error code"), its
    log does (``run kernel failed, name: prelu_4Max`` after ``prelu_fp32.cc ... ReSize] get channel failed``)."""
    lines = [line for line in log_text.splitlines() if "[ERROR]" in line]
    failed = [(k, m.group(1)) for k, line in enumerate(lines) if (m := KERNEL_FAILED.search(line))
              and "SubGraph" not in m.group(1)]  # fmt: skip
    if not failed:
        return ""
    at, kernel = next((k, name) for k, name in failed if name == failed[-1][1])
    kernel_lines = (m for line in reversed(lines[:at]) if (m := LOG_SOURCE.search(line)) and "/kernel/" in line)
    cause = next(kernel_lines, None)
    why = f": {cause.group(1)} {cause.group(2)}: {cause.group(3).strip()}" if cause else ""
    return f" (Lite kernel {kernel} failed{why})"


def one_line(text: str) -> str:
    """Lite's multi-line log as one line of an error message."""
    return " | ".join(part.strip() for part in text.splitlines() if part.strip())
