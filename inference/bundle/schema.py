"""Validate JSON documents against the JSON Schemas the deploy side ships (``manifest.schema.json``).

The deploy box installs NumPy and Gymnasium only, so this is a small validator for the part of JSON Schema
(draft 2020-12) the shipped schemas use: ``type``, ``const``, ``enum``, ``required``, ``properties``,
``additionalProperties``, ``items``, ``minItems``, ``maxItems``, ``minLength``, ``minimum``, ``maximum``,
``exclusiveMinimum``, ``pattern``, ``minProperties``, ``dependentRequired``, ``allOf``, ``oneOf``, ``if``/``then``
and local ``$ref``. A keyword outside that set is a ``SchemaError`` when the schema is loaded, never silently
ignored. The test suite checks that this validator and the reference implementation (``jsonschema``) agree on the
shipped schema.

``partial=True`` checks a document written before its schema existed (a schema-version-1 manifest): every field it
holds against its type and range, without the fields the schema requires or the ones it does not know.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

MANIFEST_SCHEMA = Path(__file__).with_name("manifest.schema.json")
_ANNOTATIONS = {"$schema", "$id", "$defs", "title", "description", "default"}
_KEYWORDS = {
    "type", "const", "enum", "required", "properties", "additionalProperties", "items", "minItems", "maxItems",
    "minLength", "minimum", "maximum", "exclusiveMinimum", "pattern", "minProperties", "dependentRequired", "allOf",
    "oneOf", "if", "then", "$ref",
}  # fmt: skip
# Leaving these out is what ``partial`` means: which fields must be there, and which may not.
_STRUCTURE = ("required", "additionalProperties", "minProperties", "dependentRequired")


class SchemaError(ValueError):
    """The schema itself uses a keyword this validator does not implement."""


@functools.cache
def load_schema(path: Path = MANIFEST_SCHEMA) -> dict[str, Any]:
    schema = json.loads(path.read_text())
    _check_keywords(schema, "#")
    return schema


def errors(instance: Any, schema: Mapping[str, Any], partial: bool = False) -> list[str]:
    """Every violation as ``"<field path>: <what is wrong>"``, in document order (empty when valid). ``partial``:
    only the types and ranges of the fields ``instance`` holds (a document older than the schema)."""
    if partial:
        schema = _without_structure(schema)
    return list(_errors(instance, schema, schema, ""))


@functools.cache
def _partial_cached(text: str) -> dict[str, Any]:
    return _strip(json.loads(text))


def _without_structure(schema: Mapping[str, Any]) -> dict[str, Any]:
    return _partial_cached(json.dumps(schema, sort_keys=True))


def _strip(node: Any) -> Any:
    if isinstance(node, dict):
        out = {}
        for key, value in node.items():
            if key in _STRUCTURE and not (key == "additionalProperties" and isinstance(value, dict)):
                continue
            # properties/$defs map names to schemas: their keys are names, not keywords
            out[key] = {k: _strip(v) for k, v in value.items()} if key in ("properties", "$defs") else _strip(value)
        return out
    if isinstance(node, list):
        return [_strip(v) for v in node]
    return node


def optional_defaults(instance: Mapping[str, Any], schema: Mapping[str, Any]) -> dict[str, str]:
    """Top-level optional fields that ``instance`` leaves out (or sets to null), with the schema's ``default``:
    what a consumer assumes instead. Reports write it down, so a default is never chosen silently."""
    return {
        key: str(spec["default"])
        for key, spec in schema.get("properties", {}).items()
        if "default" in spec and instance.get(key) is None
    }


def _check_keywords(schema: Any, where: str) -> None:
    """Every keyword of ``schema`` and of its subschemas is one this validator implements."""
    if not isinstance(schema, dict):
        raise SchemaError(f"schema {where}: a schema must be an object")
    unknown = set(schema) - _KEYWORDS - _ANNOTATIONS
    if unknown:
        raise SchemaError(f"schema {where}: unsupported keyword(s) {sorted(unknown)}")
    for key in ("items", "if", "then"):
        if key in schema:
            _check_keywords(schema[key], f"{where}/{key}")
    if isinstance(schema.get("additionalProperties"), dict):
        _check_keywords(schema["additionalProperties"], f"{where}/additionalProperties")
    for key in ("properties", "$defs"):
        for name, sub in schema.get(key, {}).items():
            _check_keywords(sub, f"{where}/{key}/{name}")
    for key in ("allOf", "oneOf"):
        for k, sub in enumerate(schema.get(key, ())):
            _check_keywords(sub, f"{where}/{key}/{k}")


_TYPES = {
    "object": lambda v: isinstance(v, dict),
    "array": lambda v: isinstance(v, list),
    "string": lambda v: isinstance(v, str),
    "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "number": lambda v: isinstance(v, int | float) and not isinstance(v, bool),
    "boolean": lambda v: isinstance(v, bool),
    "null": lambda v: v is None,
}


def _resolve(root: Mapping[str, Any], ref: str) -> Mapping[str, Any]:
    if not ref.startswith("#/"):
        raise SchemaError(f"only local $ref is supported, got {ref!r}")
    node: Any = root
    for part in ref[2:].split("/"):
        node = node[part]
    return node


def _field(path: str) -> str:
    return path or "the manifest"


def _errors(value: Any, schema: Mapping[str, Any], root: Mapping[str, Any], path: str) -> Iterator[str]:
    if "$ref" in schema:
        yield from _errors(value, _resolve(root, schema["$ref"]), root, path)
    if "type" in schema:
        types = schema["type"] if isinstance(schema["type"], list) else [schema["type"]]
        if not any(_TYPES[t](value) for t in types):
            yield f"{_field(path)}: expected {' or '.join(types)}, got {_describe(value)}"
            return
    if "const" in schema and value != schema["const"]:
        yield f"{_field(path)}: must be {json.dumps(schema['const'])}, got {_describe(value)}"
    if "enum" in schema and value not in schema["enum"]:
        yield f"{_field(path)}: must be one of {', '.join(map(json.dumps, schema['enum']))}, got {_describe(value)}"
    if isinstance(value, str):
        if len(value) < schema.get("minLength", 0):
            yield f"{_field(path)}: must not be empty"
        if "pattern" in schema and not re.search(schema["pattern"], value):
            yield f"{_field(path)}: {value[:80]!r} does not match {schema['pattern']}"
    if _TYPES["number"](value):
        if "minimum" in schema and value < schema["minimum"]:
            yield f"{_field(path)}: must be >= {schema['minimum']}, got {value}"
        if "exclusiveMinimum" in schema and value <= schema["exclusiveMinimum"]:
            yield f"{_field(path)}: must be > {schema['exclusiveMinimum']}, got {value}"
        if "maximum" in schema and value > schema["maximum"]:
            yield f"{_field(path)}: must be <= {schema['maximum']}, got {_number(value)}"
    if isinstance(value, list):
        if len(value) < schema.get("minItems", 0):
            yield f"{_field(path)}: needs at least {schema['minItems']} item(s)"
        if len(value) > schema.get("maxItems", len(value)):
            yield f"{_field(path)}: has {len(value)} items, at most {schema['maxItems']}"
        if "items" in schema:
            for k, item in enumerate(value):
                yield from _errors(item, schema["items"], root, f"{path}[{k}]")
    if isinstance(value, dict):
        yield from _object_errors(value, schema, root, path)
    for sub in schema.get("allOf", ()):
        yield from _errors(value, sub, root, path)
    if "oneOf" in schema:
        matching = sum(not errors_of(value, sub, root, path) for sub in schema["oneOf"])
        forms = [_resolve(root, sub["$ref"]) if "$ref" in sub else sub for sub in schema["oneOf"]]
        if matching == 0 and all("description" in form for form in forms):
            yield f"{_field(path)}: {_describe(value)} is not {' or '.join(form['description'] for form in forms)}"
        elif matching != 1:
            yield f"{_field(path)}: {_describe(value)} matches {matching} of the allowed forms, not exactly one"
    if "if" in schema and not errors_of(value, schema["if"], root, path) and "then" in schema:
        yield from _errors(value, schema["then"], root, path)


def errors_of(value: Any, schema: Mapping[str, Any], root: Mapping[str, Any], path: str) -> list[str]:
    return list(_errors(value, schema, root, path))


def _object_errors(value: dict, schema: Mapping[str, Any], root: Mapping[str, Any], path: str) -> Iterator[str]:
    prefix = f"{path}." if path else ""
    for key in schema.get("required", ()):
        if key not in value:
            yield f"{prefix}{key}: required field is missing"
    if len(value) < schema.get("minProperties", 0):
        yield f"{_field(path)}: needs at least {schema['minProperties']} field(s)"
    for key, needs in schema.get("dependentRequired", {}).items():
        if key in value:
            for need in needs:
                if need not in value:
                    yield f"{prefix}{need}: required with {key}"
    properties = schema.get("properties", {})
    extra = schema.get("additionalProperties", True)
    for key, item in value.items():
        if key in properties:
            yield from _errors(item, properties[key], root, f"{prefix}{key}")
        elif extra is False:
            yield f"{prefix}{key}: unknown field (known: {', '.join(properties)})"
        elif isinstance(extra, dict):
            yield from _errors(item, extra, root, f"{prefix}{key}")


def _number(value: float) -> str:
    """A number as a short text (a 40-digit integer in scientific notation)."""
    text = str(value)
    return text if len(text) <= 20 else f"{float(value):.3e}"


def _describe(value: Any) -> str:
    text = json.dumps(value, default=str)
    return text if len(text) <= 60 else text[:57] + "..."
