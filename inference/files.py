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
    "atomic_path", "json_default", "read_document", "replace_dir", "sha256_file", "write_atomic",
    "write_bytes_atomic", "write_json_atomic",
]  # fmt: skip


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(1 << 20):
            digest.update(block)
    return digest.hexdigest()


def read_document(path: str | Path, what: str, error: type[Exception]) -> Any:
    """A JSON (``*.json``) or TOML file's content. A missing file, a directory or a file that does not parse is
    ``error`` with one line naming ``what`` (e.g. "config file") and the path, never a traceback."""
    path = Path(path)
    kind = "JSON" if path.suffix == ".json" else "TOML"
    if path.is_dir():
        raise error(f"{what} {path} is a directory; pass a {kind} file")
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise error(f"{what} not found: {path}") from None
    except OSError as exc:
        raise error(f"cannot read {what} {path}: {exc.strerror or exc}") from None
    try:
        return json.loads(text) if kind == "JSON" else tomllib.loads(text)
    except (json.JSONDecodeError, tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise error(f"{what} {path} is not valid {kind}: {exc}") from None


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


def json_default(obj: Any) -> Any:
    import numpy as np

    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    if isinstance(obj, Path):
        return str(obj)
    raise TypeError(f"not JSON serialisable: {type(obj).__name__}")
