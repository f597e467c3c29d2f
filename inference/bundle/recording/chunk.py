"""One chunk of a field recording on disk: its file format, written complete or not at all, and its meta and array
headers read without loading the data (``inference.bundle.recording`` indexes and reads whole recordings).

A chunk is an uncompressed ``.npz`` of plain ``.npy`` arrays, never pickles: ``meta`` (a JSON object, fields below
in ``META_FIELDS``) and one row per step of every other array (``recording``'s docstring lists them). Any fault is a
``UsageError`` of one line naming the chunk and the field.
"""

from __future__ import annotations

import json
import os
import re
import zipfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from inference.errors import UsageError, first_line

FORMAT = "msrl-consistency/field-recording"
VERSION = 3
READABLE = (1, 2, 3)
CHUNK = re.compile(r"^chunk-(\d{6})\.npz$")
LOCK_FILE = ".recorder.lock"
MAX_INT = 2**62
STEP_FIELDS = {
    "time_ns": (np.dtype(np.int64), ()),
    "episode": (np.dtype(np.int64), ()),
    "env": (np.dtype(np.int64), ()),
    "reward": (np.dtype(np.float64), ()),
    "done": (np.dtype(bool), ()),
}
# meta key -> (type, required from version): ints are never bools, every number is bounded
META_FIELDS: dict[str, tuple[type | tuple[type, ...], int]] = {
    "format": (str, 1), "version": (int, 1), "manifest_sha256": (str, 1), "graph": (str, 1), "runtime": (str, 1),
    "chunk": (int, 1), "steps": (int, 1), "dropped_steps": (int, 1), "created": (str, 1),
    "env_id": ((str, type(None)), 1), "session": (str, 2), "next_episode": (int, 2), "lost": (list, 2),
    "previous": ((dict, type(None)), 3),
}  # fmt: skip
SHA256 = re.compile(r"^[0-9a-f]{64}$")


def chunk_name(index: int) -> str:
    return f"chunk-{index:06d}.npz"


def write_chunk(path: Path, arrays: Mapping[str, np.ndarray], meta: Mapping[str, Any]) -> None:
    """One chunk, complete or absent: written under a temporary name, flushed to disk, then renamed. A failed write
    (a full disk) leaves nothing behind."""
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        with open(tmp, "wb") as fh:
            # np.savez's own zip file, left open by a failed write, would complain again when collected
            with zipfile.ZipFile(fh, "w", zipfile.ZIP_STORED, allowZip64=True) as z:
                for name, value in {"meta": np.array(json.dumps(meta)), **arrays}.items():
                    with z.open(f"{name}.npy", "w", force_zip64=True) as out:
                        np.lib.format.write_array(out, np.asanyarray(value), allow_pickle=False)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


# -- the meta and the arrays' headers, without loading the data -------------------------------------------------
def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    keys = [k for k, _ in pairs]
    if len(set(keys)) != len(keys):
        raise ValueError(f"duplicate key {next(k for k in keys if keys.count(k) > 1)!r}")
    return dict(pairs)


def chunk_headers(path: Path) -> tuple[dict[str, Any], dict[str, tuple[tuple[int, ...], np.dtype]]]:
    """A chunk's meta and, per array, its shape and dtype (from the ``.npy`` headers: no data is read)."""
    try:
        with zipfile.ZipFile(path) as z:
            headers = {}
            meta_text = None
            for info in z.infolist():
                if not info.filename.endswith(".npy"):
                    raise UsageError(f"{path} is not a recording chunk (member {info.filename!r} is not an array)")
                name = info.filename[: -len(".npy")]
                with z.open(info) as fh:
                    major, _minor = np.lib.format.read_magic(fh)
                    if major not in (1, 2, 3):
                        raise ValueError(f"{info.filename}: .npy format version {major}")
                    read = np.lib.format.read_array_header_1_0 if major == 1 else np.lib.format.read_array_header_2_0
                    shape, _fortran, dtype = read(fh)
                    if dtype.hasobject:
                        raise UsageError(f"{path}: field {name!r} holds Python objects, not numbers")
                    if name == "meta":
                        if dtype.kind != "U" or shape != ():
                            raise UsageError(f"{path}: field 'meta' is {dtype}{list(shape)}, not a JSON string")
                        meta_text = str(np.frombuffer(fh.read(dtype.itemsize), dtype, count=1)[0])
                headers[name] = (tuple(shape), dtype)
    except UsageError:
        raise
    except (zipfile.BadZipFile, EOFError, OSError, ValueError, KeyError) as exc:
        why = f"{type(exc).__name__}: {first_line(exc)}"
        raise UsageError(f"{path} is not a complete recording chunk ({why})") from None
    if meta_text is None:
        raise UsageError(f"{path} is not a recording chunk (no field 'meta')")
    try:
        meta = json.loads(meta_text, object_pairs_hook=_no_duplicates)
    except ValueError as exc:
        raise UsageError(f"{path}: field 'meta' is not valid JSON ({first_line(exc)})") from None
    if not isinstance(meta, dict):
        raise UsageError(f"{path}: field 'meta' is a JSON {type(meta).__name__}, not an object")
    _check_meta(meta, path)
    del headers["meta"]
    return meta, headers


def _check_meta(meta: dict[str, Any], path: Path) -> None:
    """Every meta field of the chunk's version present with its type; numbers in range."""
    if meta.get("format") != FORMAT or meta.get("version") not in READABLE or isinstance(meta.get("version"), bool):
        raise UsageError(f"{path} is not a {FORMAT} chunk of version {' or '.join(map(str, READABLE))} (format "
                         f"{meta.get('format')!r}, version {meta.get('version')!r})")  # fmt: skip
    for key, (kind, since) in META_FIELDS.items():
        if meta["version"] < since:
            continue
        if key not in meta:
            raise UsageError(f"{path}: meta has no {key!r}")
        value = meta[key]
        if not isinstance(value, kind) or isinstance(value, bool):
            raise UsageError(f"{path}: meta {key!r} is {type(value).__name__} {value!r:.40}, expected "
                             f"{getattr(kind, '__name__', 'str or null')}")  # fmt: skip
        if isinstance(value, int) and not 0 <= value < MAX_INT:
            raise UsageError(f"{path}: meta {key!r} is {value:.3g}, out of range")
    if meta["steps"] < 1:
        raise UsageError(f"{path}: meta 'steps' is {meta['steps']}: a chunk holds at least one step")
    previous = meta.get("previous")
    if previous is not None:
        index = previous.get("chunk")
        ok = isinstance(index, int) and not isinstance(index, bool) and 0 <= index < meta["chunk"]
        if not ok or set(previous) != {"chunk", "sha256"} or not SHA256.match(str(previous.get("sha256"))):
            raise UsageError(f"{path}: meta 'previous' holds {previous!r:.80}, expected {{chunk, sha256}} of an "
                             "earlier chunk")  # fmt: skip
    for entry in meta.get("lost", []):
        ok = isinstance(entry, dict) and all(isinstance(entry.get(k), int) and not isinstance(entry.get(k), bool)
                                             and 0 <= entry[k] < MAX_INT for k in ("chunk", "steps"))  # fmt: skip
        if not ok or not isinstance(entry.get("why"), str):
            raise UsageError(f"{path}: meta 'lost' holds {entry!r:.60}, expected {{chunk, steps, why}}")
