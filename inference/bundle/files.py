"""Files in and out: atomic writes (a crash never leaves a half-written artefact behind), hashing, and reading the
JSON/TOML documents users hand us with one-line errors."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import tempfile
import tomllib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

__all__ = [
    "MAX_DEPTH", "MAX_DOCUMENT_BYTES", "MAX_INT_DIGITS", "atomic_path", "json_default", "loads_strict",
    "loads_toml_strict", "read_document", "replace_dir", "sha256_file", "write_atomic", "write_bytes_atomic",
    "write_json_atomic",
]  # fmt: skip


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(1 << 20):
            digest.update(block)
    return digest.hexdigest()


# Limits for the documents users and other machines hand us (manifests, contracts, configs, run records, baselines,
# golden-file and recording metadata). Generous for what we write (a manifest is ~10 kB; a normaliser over 100k
# observation dimensions stays under 5 MB) and small enough that a hostile file is one line, not a hang, a
# RecursionError or an int conversion that takes minutes.
MAX_DOCUMENT_BYTES = 16 << 20
MAX_DEPTH = 64  # nesting levels of objects/arrays (tables); ours are at most 6 deep
MAX_INT_DIGITS = 40  # every integer we read (seeds, sizes, shapes) fits in 128 bits


class _Refused(ValueError):
    """A document's content we refuse while parsing it (the message says why; the caller adds where)."""


def read_document(path: str | Path, what: str, error: type[Exception]) -> Any:
    """A JSON (``*.json``) or TOML file's content, parsed strictly (``loads_strict``). A missing file, a directory,
    one larger than ``MAX_DOCUMENT_BYTES`` or one that does not parse is ``error`` with one line naming ``what``
    (e.g. "config file") and the path, never a traceback."""
    path = Path(path)
    kind = "JSON" if path.suffix == ".json" else "TOML"
    if path.is_dir():
        raise error(f"{what} {path} is a directory; pass a {kind} file")
    try:
        with open(path, "rb") as fh:
            data = fh.read(MAX_DOCUMENT_BYTES + 1)
    except FileNotFoundError:
        raise error(f"{what} not found: {path}") from None
    except OSError as exc:
        raise error(f"cannot read {what} {path}: {exc.strerror or exc}") from None
    if len(data) > MAX_DOCUMENT_BYTES:
        raise error(f"{what} {path} is larger than {MAX_DOCUMENT_BYTES >> 20} MB; no {what} is that large")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise error(f"{what} {path} is not valid {kind}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    if kind == "TOML":
        return loads_toml_strict(text, f"{what} {path}", error)
    return loads_strict(text, f"{what} {path}", error)


def loads_strict(text: str, what: str, error: type[Exception]) -> Any:
    """A JSON document from text we did not write ourselves: ``error`` (one line starting with ``what``) for text
    that is not JSON, larger than ``MAX_DOCUMENT_BYTES``, nested deeper than ``MAX_DEPTH``, with a key twice in one
    object (JSON parsers keep the last one silently: a second ``"precision"`` would win), an integer of more than
    ``MAX_INT_DIGITS`` digits, or a ``NaN``. ``Infinity`` is read (Python writes it for unbounded observation
    dimensions); whether a field may be infinite is its schema's business."""
    if len(text) > MAX_DOCUMENT_BYTES:
        raise error(f"{what} is larger than {MAX_DOCUMENT_BYTES >> 20} MB")
    try:
        data = json.loads(text, object_pairs_hook=_unique_keys, parse_int=_bounded_int)
    except _Refused as exc:
        raise error(f"{what}: {exc}") from None
    except RecursionError:
        raise error(f"{what} is nested more than {MAX_DEPTH} levels deep") from None
    except json.JSONDecodeError as exc:
        raise error(f"{what} is not valid JSON: {exc}") from None
    _check_tree(data, what, error)
    return data


def loads_toml_strict(text: str, what: str, error: type[Exception]) -> dict[str, Any]:
    """A TOML document (TOML itself refuses repeated keys) under the same limits as ``loads_strict``."""
    if len(text) > MAX_DOCUMENT_BYTES:
        raise error(f"{what} is larger than {MAX_DOCUMENT_BYTES >> 20} MB")
    try:
        data = tomllib.loads(text)
    except RecursionError:
        raise error(f"{what} is nested more than {MAX_DEPTH} levels deep") from None
    except tomllib.TOMLDecodeError as exc:
        raise error(f"{what} is not valid TOML: {exc}") from None
    except ValueError:  # Python's int conversion limit (4300 digits), raised through tomllib
        raise error(f"{what}: an integer has more than {MAX_INT_DIGITS} digits") from None
    _check_tree(data, what, error)
    return data


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    data: dict[str, Any] = {}
    for key, value in pairs:
        if key in data:
            raise _Refused(f"key {key!r} appears twice in one object (JSON readers would keep the last one silently)")
        data[key] = value
    return data


def _bounded_int(text: str) -> int:
    if len(text.lstrip("-")) > MAX_INT_DIGITS:
        raise _Refused(f"an integer has {len(text.lstrip('-'))} digits (at most {MAX_INT_DIGITS})")
    return int(text)


def _check_tree(data: Any, what: str, error: type[Exception]) -> None:
    """Depth, integer size and NaN, naming the field (``normalization.mean[2]``) of the first offender. Scalars are
    looked at in place (a normaliser's long lists stay cheap); only containers go on the stack."""
    limit = 10**MAX_INT_DIGITS
    root = (data, "", 0) if isinstance(data, dict | list) else ({"the document": data}, "", -1)
    stack: list[tuple[Any, str, int]] = [root]
    while stack:
        value, where, depth = stack.pop()
        if depth >= MAX_DEPTH:
            raise error(f"{what} is nested more than {MAX_DEPTH} levels deep")
        items = value.items() if isinstance(value, dict) else enumerate(value)
        children = []
        for key, item in items:
            if isinstance(item, dict | list):
                children.append((item, _sub(where, key, value), depth + 1))
            elif isinstance(item, float):
                if item != item:  # NaN
                    raise error(f"{what}: {_sub(where, key, value)} is NaN; no field takes NaN")
            elif isinstance(item, int) and not isinstance(item, bool) and not -limit < item < limit:
                raise error(f"{what}: {_sub(where, key, value)} is an integer of more than {MAX_INT_DIGITS} digits")
        stack.extend(reversed(children))  # popped in document order


def _sub(where: str, key: Any, container: Any) -> str:
    if isinstance(container, list):
        return f"{where}[{key}]"
    return f"{where}.{key}" if where else str(key)


@contextlib.contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """Yield a temp path in the same directory; rename it over ``path`` only if the block succeeds."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        yield Path(tmp)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def write_atomic(path: str | Path, writer: Callable[[Path], None]) -> None:
    with atomic_path(path) as tmp:
        writer(tmp)


def write_bytes_atomic(path: str | Path, data: bytes) -> None:
    write_atomic(path, lambda tmp: tmp.write_bytes(data))


def write_json_atomic(path: str | Path, data: Any) -> None:
    text = json.dumps(data, indent=2, sort_keys=False, default=json_default) + "\n"
    write_atomic(path, lambda tmp: tmp.write_text(text))


def replace_dir(tmp: Path, out: Path) -> None:
    """Swap a finished directory into place; an existing one is moved aside first and removed after."""
    old = None
    if out.exists():
        old = out.with_name(f".{out.name}.old")
        shutil.rmtree(old, ignore_errors=True)
        out.rename(old)
    tmp.rename(out)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


@contextlib.contextmanager
def staged_dir(out: Path) -> Iterator[Path]:
    """A temporary directory beside ``out`` that a whole set is written into, swapped into place (``replace_dir``)
    when the block ends without an error and removed in any case: ``out`` holds a whole set or its earlier one."""
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        yield tmp
        replace_dir(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def json_default(obj: Any) -> Any:
    import numpy as np

    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    if isinstance(obj, Path):
        return str(obj)
    raise TypeError(f"not JSON serialisable: {type(obj).__name__}")
