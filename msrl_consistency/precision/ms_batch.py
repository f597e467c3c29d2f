"""A Lite ``.ms`` converted at a fixed batch, given back its dynamic batch.

Lite's full quantization calibrates by running the graph on the calibration files, which needs every input's shape:
the ONNX graph is converted with its batch fixed at 1. The graph's operations keep working at any batch (Lite
resizes every kernel when the feeds change), but the file then declares its inputs and outputs with batch 1,
which the runner's feed check refuses at another batch. This rewrites those declared batch dimensions to -1 in the
file's flatbuffer (``MetaGraph.allTensors[inputIndex | outputIndex].dims[0]``), in place: no other byte moves.
The plan's tests and verify's batch-invariance matrix check that the answers do not depend on the batch.
"""

from __future__ import annotations

import struct
from pathlib import Path

# Lite's schema (mindspore/lite/schema/model.fbs): MetaGraph's fields and Tensor's ``dims``.
_META_INPUTS, _META_OUTPUTS, _META_TENSORS = 3, 4, 7
_TENSOR_DIMS = 2


def _u32(b: bytes | bytearray, at: int) -> int:
    return struct.unpack_from("<I", b, at)[0]


def _field(b: bytes | bytearray, table: int, index: int) -> int | None:
    vtable = table - struct.unpack_from("<i", b, table)[0]
    size = struct.unpack_from("<H", b, vtable)[0]
    if 4 + 2 * index >= size:
        return None
    offset = struct.unpack_from("<H", b, vtable + 4 + 2 * index)[0]
    return table + offset if offset else None


def _vector(b: bytes | bytearray, at: int) -> tuple[int, int]:
    start = at + _u32(b, at)
    return start + 4, _u32(b, start)


def dynamic_batch(path: Path) -> int:
    """Declare every graph input and output of the ``.ms`` at ``path`` with a dynamic (-1) batch where it is 1;
    returns how many were rewritten."""
    data = bytearray(path.read_bytes())
    if data[4:8] not in (b"MSL2", b"MSL1", b"MSL0"):
        raise ValueError(f"{path} is not a MindSpore Lite model (file identifier {bytes(data[4:8])!r})")
    root = _u32(data, 0)
    tensors_at = _field(data, root, _META_TENSORS)
    if tensors_at is None:
        raise ValueError(f"{path}: no tensors")
    tensors, count = _vector(data, tensors_at)
    changed = 0
    for which in (_META_INPUTS, _META_OUTPUTS):
        at = _field(data, root, which)
        if at is None:
            continue
        indices, n = _vector(data, at)
        for k in range(n):
            index = _u32(data, indices + 4 * k)
            if index >= count:
                raise ValueError(f"{path}: tensor index {index} out of range")
            table = tensors + 4 * index
            table += _u32(data, table)
            dims_at = _field(data, table, _TENSOR_DIMS)
            if dims_at is None:
                continue
            dims, rank = _vector(data, dims_at)
            if rank and struct.unpack_from("<i", data, dims)[0] == 1:
                struct.pack_into("<i", data, dims, -1)
                changed += 1
    path.write_bytes(bytes(data))
    return changed
