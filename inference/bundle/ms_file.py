"""What a Lite ``.ms`` file holds, read from its bytes: each tensor's data type and whether it carries quantization
parameters (their scales and zero points). Enough to check a claim about the file (an int8 plan's ``.ms`` holds int8
weights; a policy trained in int8 was converted with the scales it was trained with) without Lite.

A ``.ms`` is a FlatBuffer with the identifier ``MSL2`` (``MSL1`` before Lite 1.2) whose root is Lite's
``MetaGraph`` (``mindspore/lite/schema/model.fbs``): field 7 ``allTensors: [Tensor]``; a ``Tensor`` has ``nodeType``
(0), ``dataType`` (1, MindSpore's TypeId), ``data: [ubyte]`` (6), ``quantParams`` (7: ``QuantParam`` tables, ``scale``
double at 0, ``zeroPoint`` int at 1) and ``name`` (9). FlatBuffers
only ever append fields, so these indices hold in every Lite version. Only the standard library reads it: the deploy
side needs nothing more.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path

IDENTIFIER = (b"MSL1", b"MSL2")  # the schema before and after Lite 1.2's unified operators
# MindSpore's TypeId numbers (``mindspore/core/ir/dtype/type_id.h``) of the types a weight is stored in
TYPE_IDS = {32: "int8", 33: "int16", 34: "int32", 35: "int64", 37: "uint8", 42: "float16", 43: "float32",
            44: "float64"}  # fmt: skip
_META_ALL_TENSORS, _T_DATA_TYPE, _T_DATA, _T_QUANT, _T_NAME = 7, 1, 6, 7, 9


class MsFileError(ValueError):
    """The file is not a Lite model this reader understands."""


@dataclass(frozen=True)
class MsTensor:
    name: str
    dtype: str  # TYPE_IDS' name, or "type <id>"
    data_bytes: int  # the constant data it carries (0: an activation or an input)
    quantized: bool  # carries quantization parameters
    scales: tuple[float, ...] = ()  # its quantization parameters' scales (one per channel for a per-channel weight)
    zero_points: tuple[int, ...] = ()


class _Table:
    """One FlatBuffers table: its fields by index through the vtable."""

    def __init__(self, buf: bytes, pos: int) -> None:
        self.buf, self.pos = buf, pos
        self.vtable = pos - _i32(buf, pos)
        self.vsize = _u16(buf, self.vtable)

    def offset(self, field: int) -> int:
        at = 4 + 2 * field
        return _u16(self.buf, self.vtable + at) if at < self.vsize else 0

    def int32(self, field: int, default: int = 0) -> int:
        off = self.offset(field)
        return _i32(self.buf, self.pos + off) if off else default

    def float64(self, field: int, default: float = 0.0) -> float:
        off = self.offset(field)
        return struct.unpack_from("<d", self.buf, self.pos + off)[0] if off else default

    def vector(self, field: int) -> tuple[int, int]:
        """(start, length) of a vector field; (0, 0) when absent."""
        off = self.offset(field)
        if not off:
            return 0, 0
        at = self.pos + off
        start = at + _u32(self.buf, at)
        return start + 4, _u32(self.buf, start)

    def table(self, start: int, k: int) -> _Table:
        at = start + 4 * k
        return _Table(self.buf, at + _u32(self.buf, at))

    def string(self, field: int) -> str:
        start, length = self.vector(field)
        return self.buf[start : start + length].decode("utf-8", "replace") if start else ""


def _u16(buf: bytes, at: int) -> int:
    return struct.unpack_from("<H", buf, at)[0]


def _u32(buf: bytes, at: int) -> int:
    return struct.unpack_from("<I", buf, at)[0]


def _i32(buf: bytes, at: int) -> int:
    return struct.unpack_from("<i", buf, at)[0]


def ms_tensors(path: str | Path) -> list[MsTensor]:
    """Every tensor of the ``.ms`` file at ``path`` (``MsFileError`` for a file that is not one)."""
    buf = Path(path).read_bytes()
    if len(buf) < 8 or buf[4:8] not in IDENTIFIER:
        raise MsFileError(f"{path} is not a MindSpore Lite model (no MSL1 or MSL2 identifier)")
    try:
        root = _Table(buf, _u32(buf, 0))
        start, count = root.vector(_META_ALL_TENSORS)
        out = []
        for k in range(count):
            t = root.table(start, k)
            type_id = t.int32(_T_DATA_TYPE)
            q_start, q_count = t.vector(_T_QUANT)
            quant = [t.table(q_start, j) for j in range(q_count)]  # QuantParam: scale (0, double), zeroPoint (1)
            out.append(
                MsTensor(
                    t.string(_T_NAME),
                    TYPE_IDS.get(type_id, f"type {type_id}"),
                    t.vector(_T_DATA)[1],
                    q_count > 0,
                    tuple(q.float64(0) for q in quant),
                    tuple(q.int32(1) for q in quant),
                )
            )
        return out
    except (struct.error, UnicodeDecodeError, IndexError) as exc:
        raise MsFileError(f"{path}: its tensor table cannot be read ({exc})") from None
