"""Read ``mind_ir_version`` from a MindIR file without MindSpore (a minimal protobuf scan)."""

from __future__ import annotations

from pathlib import Path

_MIND_IR_VERSION_FIELD = 13  # ModelProto.mind_ir_version (int64) in mind_ir.proto


def _varint(buf: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = buf[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, pos
        shift += 7


def mindir_version(path: str | Path) -> int | None:
    """The MindIR format version a file was written with, or None if absent or unreadable."""
    buf = Path(path).read_bytes()
    pos = 0
    try:
        while pos < len(buf):
            key, pos = _varint(buf, pos)
            field, wire = key >> 3, key & 7
            if wire == 0:
                value, pos = _varint(buf, pos)
                if field == _MIND_IR_VERSION_FIELD:
                    return value
            elif wire == 1:
                pos += 8
            elif wire == 2:
                length, pos = _varint(buf, pos)
                pos += length
            elif wire == 5:
                pos += 4
            else:
                return None
    except IndexError:
        return None
    return None
