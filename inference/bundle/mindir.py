"""Read a MindIR file's header fields (``mind_ir_version``, producer) without MindSpore: a minimal protobuf scan.

This is the project's one MindIR reading rule: the training side (``inference.bundle.mindir``)
re-exports it, and the Lite runner never parses MindIR itself (on a refusal it reports the versions Lite read,
and the client adds the producer from here). Field numbers are ``mind_ir.proto``'s ``ModelProto``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

_PRODUCER_NAME, _PRODUCER_VERSION, _MODEL_VERSION, _MIND_IR_VERSION = 2, 3, 5, 13
_MAX_HEADER_STRING = 256  # header strings are short; a longer length-delimited field is graph payload


@dataclass(frozen=True)
class MindIRHeader:
    mind_ir_version: int | None  # None: absent (MindSpore then treats the file as version 0) or unreadable
    producer_name: str | None = None
    producer_version: str | None = None  # MindSpore 2.x writes its version in model_version instead
    model_version: str | None = None

    @property
    def mindspore_version(self) -> str | None:
        """The writing MindSpore's version, wherever this MindSpore release put it."""
        return self.producer_version or self.model_version


def _varint(fh: BinaryIO) -> int | None:
    value = shift = 0
    while shift < 64:
        byte = fh.read(1)
        if not byte:
            return None
        value |= (byte[0] & 0x7F) << shift
        if not byte[0] & 0x80:
            return value
        shift += 7
    return None


def read_header(path: str | Path) -> MindIRHeader:
    """Walks the top-level fields of ``ModelProto``, seeking over the (large) graph payloads."""
    version: int | None = None
    strings: dict[int, str] = {}
    with open(path, "rb") as fh:
        while (key := _varint(fh)) is not None:
            field, wire = key >> 3, key & 7
            if wire == 0:
                value = _varint(fh)
                if value is None:
                    break
                if field == _MIND_IR_VERSION and version is None:
                    version = value
            elif wire == 2:
                length = _varint(fh)
                if length is None:
                    break
                if field in (_PRODUCER_NAME, _PRODUCER_VERSION, _MODEL_VERSION) and length <= _MAX_HEADER_STRING:
                    strings.setdefault(field, fh.read(length).decode("utf-8", errors="replace"))
                else:
                    fh.seek(length, 1)
            elif wire in (1, 5):
                fh.seek(8 if wire == 1 else 4, 1)
            else:
                break  # groups or garbage: not a ModelProto we can walk
    return MindIRHeader(
        version, strings.get(_PRODUCER_NAME), strings.get(_PRODUCER_VERSION), strings.get(_MODEL_VERSION)
    )


def mindir_version(path: str | Path) -> int | None:
    """The MindIR format version a file was written with, or None if absent or unreadable."""
    return read_header(path).mind_ir_version
