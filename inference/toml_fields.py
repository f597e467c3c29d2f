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


def get_table(data: Mapping[str, Any], key: str) -> Mapping[str, Any]:
    value = data.get(key)
    if not isinstance(value, Mapping):
        raise ContractError(f"missing table [{key}]")
    return value


def check_known(table: Mapping[str, Any], allowed: Sequence[str], where: str, also: str = "") -> None:
    unknown = sorted(set(table) - set(allowed))
    if unknown:
        raise ContractError(f"unknown key(s) in {where}: {', '.join(unknown)} (known: {', '.join(allowed)}"
                            f"{'; ' + also if also else ''})")


def get_str(table: Mapping[str, Any], key: str, default: str | None = None) -> str | None:
    value = table.get(key, default)
    if value is not None and not isinstance(value, str):
        raise ContractError(f"{key} must be a string, got {value!r}")
    return value


def get_names(table: Mapping[str, Any], key: str) -> str | tuple[str, ...] | None:
    """An output name, or a list of them (one per action head)."""
    value = table.get(key)
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, list) and value and all(isinstance(v, str) and v for v in value):
        return value[0] if len(value) == 1 else tuple(value)
    raise ContractError(f"{key} must be an output name or a list of output names (one per head), got {value!r}")


def get_bool(table: Mapping[str, Any], key: str) -> bool:
    value = table.get(key, False)
    if not isinstance(value, bool):
        raise ContractError(f"{key} must be true or false, got {value!r}")
    return value


def get_count(table: Mapping[str, Any], key: str) -> int | None:
    """A positive integer (a number of atoms, of discrete observations), or None when absent."""
    value = table.get(key)
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ContractError(f"{key} must be a positive integer, got {value!r}")
    return value


def get_numbers(table: Mapping[str, Any], key: str) -> Numbers | None:
    value = table.get(key)
    if value is None:
        return None
    if isinstance(value, int | float) and not isinstance(value, bool):
        value = [value]
    if not isinstance(value, list) or not value or not all(is_number(v) for v in value):
        raise ContractError(f"{key} must be a list of finite numbers, got {value!r}")
    return tuple(float(v) for v in value)


def get_name_or_numbers(table: Mapping[str, Any], key: str) -> str | Numbers | None:
    value = table.get(key)
    return value if isinstance(value, str) else get_numbers(table, key)


def is_number(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)


def get_shape(value: Any, where: str) -> tuple[int, ...]:
    if isinstance(value, int) and not isinstance(value, bool):
        value = [value]
    if not isinstance(value, list) or not value or not all(isinstance(d, int) and d > 0 for d in value):
        raise ContractError(f"{where} must be a shape without the batch dim, e.g. [3], got {value!r}")
    return tuple(value)


def get_dtype(value: Any, where: str) -> str:
    if value not in DTYPES:
        raise ContractError(f"{where} must be one of {', '.join(DTYPES)}, got {value!r}")
    return value
