"""Typed reads of TOML tables with one-line errors naming the key (the policy contract's parser uses them)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any


class ContractError(ValueError):
    """The contract is malformed or disagrees with the policy it describes (a usage error: exit 2)."""

    exit_code = 2


Numbers = tuple[float, ...]
# Input dtypes a contract may declare: what MindIR, ONNX, Lite's .ms and the runner all carry.
DTYPES = ("float32", "uint8", "int32", "int64")
# Shapes a contract may declare (one row, without the batch dim); the manifest schema's "dim" says the same. Far
# above any policy's observation (a 1080p RGB frame is 6.2M values), and small enough that a shape like [10**12] is
# refused before anything is sized from it.
MAX_DIM = 1 << 20
MAX_RANK = 7  # besides the batch dim: a manifest's tensor shapes have at most 8
MAX_ROW_ELEMENTS = 1 << 24
FLOAT32_MAX = 3.4028234663852886e38  # numbers a contract declares enter float32 graphs and arrays


def get_table(data: Mapping[str, Any], key: str) -> Mapping[str, Any]:
    value = data.get(key)
    if not isinstance(value, Mapping):
        raise ContractError(f"missing table [{key}]")
    return value


def check_known(table: Mapping[str, Any], allowed: Sequence[str], where: str, also: str = "") -> None:
    unknown = sorted(set(table) - set(allowed))
    if unknown:
        raise ContractError(
            f"unknown key(s) in {where}: {', '.join(unknown)} (known: {', '.join(allowed)}"
            f"{'; ' + also if also else ''})"
        )


def get_str(table: Mapping[str, Any], key: str, default: str | None = None) -> str | None:
    value = table.get(key, default)
    if value is not None and not isinstance(value, str):
        raise ContractError(f"{key} must be a string, got {_short(value)}")
    return value


def get_names(table: Mapping[str, Any], key: str) -> str | tuple[str, ...] | None:
    """An output name, or a list of them (one per action head)."""
    value = table.get(key)
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, list) and value and all(isinstance(v, str) and v for v in value):
        return value[0] if len(value) == 1 else tuple(value)
    raise ContractError(f"{key} must be an output name or a list of output names (one per head), got {_short(value)}")


def get_bool(table: Mapping[str, Any], key: str) -> bool:
    value = table.get(key, False)
    if not isinstance(value, bool):
        raise ContractError(f"{key} must be true or false, got {_short(value)}")
    return value


def get_count(table: Mapping[str, Any], key: str) -> int | None:
    """A positive integer (a number of atoms, of discrete observations), or None when absent."""
    value = table.get(key)
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ContractError(f"{key} must be a positive integer, got {_short(value)}")
    return value


def get_numbers(table: Mapping[str, Any], key: str) -> Numbers | None:
    value = table.get(key)
    if value is None:
        return None
    if isinstance(value, int | float) and not isinstance(value, bool):
        value = [value]
    if not isinstance(value, list) or not value or not all(is_number(v) for v in value):
        raise ContractError(f"{key} must be a list of finite numbers, got {_short(value)}")
    if any(abs(v) > FLOAT32_MAX for v in value):
        raise ContractError(f"{key} holds a number beyond float32's range (±{FLOAT32_MAX:.4g}): {_short(value)}")
    return tuple(float(v) for v in value)


def get_name_or_numbers(table: Mapping[str, Any], key: str) -> str | Numbers | None:
    value = table.get(key)
    return value if isinstance(value, str) else get_numbers(table, key)


def is_number(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)


def get_shape(value: Any, where: str) -> tuple[int, ...]:
    if isinstance(value, int) and not isinstance(value, bool):
        value = [value]
    if not isinstance(value, list) or not value or not all(_is_int(d) and d > 0 for d in value):
        raise ContractError(f"{where} must be a shape without the batch dim, e.g. [3], got {_short(value)}")
    check_shape(tuple(value), where)
    return tuple(value)


def check_shape(shape: tuple[int, ...], where: str) -> None:
    """A row's shape within ``MAX_RANK`` dims of at most ``MAX_DIM``, ``MAX_ROW_ELEMENTS`` values in all."""
    if len(shape) > MAX_RANK:
        raise ContractError(f"{where} has {len(shape)} dimensions besides the batch, at most {MAX_RANK}")
    if not all(_is_int(d) and 0 < d <= MAX_DIM for d in shape):
        raise ContractError(f"{where}: every dimension must be 1..{MAX_DIM:,}, got {_short(list(shape))}")
    if math.prod(shape) > MAX_ROW_ELEMENTS:
        raise ContractError(f"{where} {list(shape)} holds {math.prod(shape):,} values per row, at most "
                            f"{MAX_ROW_ELEMENTS:,}")  # fmt: skip


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def get_dtype(value: Any, where: str) -> str:
    if value not in DTYPES:
        raise ContractError(f"{where} must be one of {', '.join(DTYPES)}, got {_short(value)}")
    return value
