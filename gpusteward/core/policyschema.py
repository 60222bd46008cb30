"""The policy's JSON Schema, generated from the typed policy (`gpusteward policy schema`).

Editors and the Helm chart's values.schema.json use it to catch typos, wrong types and values
out of range before a pod starts; cross-field rules (a class naming an unknown tier, ...) stay
with `gpusteward policy check`.
"""

from __future__ import annotations

import enum
import types
import typing
from typing import Any, Literal, Union

import msgspec

from gpusteward.core.policy import Policy
from gpusteward.core.typedconfig import Between, Duration, default_of, duration_text

SCHEMA_ID = "https://gpusteward.io/schemas/policy-v1alpha1.json"
#: Go-style duration text, as Duration.parse reads it.
DURATION_PATTERN = r"^\s*([0-9]+(\.[0-9]+)?(ms|s|m|h|d))+\s*$"
_PLAIN = {str: "string", int: "integer", float: "number", bool: "boolean"}
_META = {"ge": "minimum", "le": "maximum", "gt": "exclusiveMinimum", "lt": "exclusiveMaximum",
         "min_length": "minLength", "max_length": "maxLength"}


def policy_schema() -> dict[str, Any]:
    return {"$schema": "https://json-schema.org/draft/2020-12/schema", "$id": SCHEMA_ID,
            "title": "gpusteward Policy", **_schema(Policy)}


def _schema(typ: Any, bounds: Between | None = None) -> dict[str, Any]:
    origin = typing.get_origin(typ)
    if origin is typing.Annotated:
        base, *meta = typing.get_args(typ)
        between = next((m for m in meta if isinstance(m, Between)), None)
        out = _schema(base, between)
        for m in meta:
            if isinstance(m, msgspec.Meta):
                out |= {_META[k]: getattr(m, k) for k in _META if getattr(m, k) is not None}
        return out
    if typ is Duration:
        number: dict[str, Any] = {"type": "number", "minimum": bounds.low if bounds else 0}
        if bounds:
            number["maximum"] = bounds.high
        return {"anyOf": [number, {"type": "string", "pattern": DURATION_PATTERN}],
                "description": "seconds, or text such as 30s, 15m, 1h30m"
                + (f" ({bounds.text})" if bounds else "")}
    if isinstance(typ, type) and issubclass(typ, msgspec.Struct):
        return _struct(typ)
    if origin in (Union, types.UnionType):
        return {"anyOf": [_schema(a) for a in typing.get_args(typ)]}
    if origin is list:
        return {"type": "array", "items": _schema(typing.get_args(typ)[0])}
    if origin is dict:
        return {"type": "object", "additionalProperties": _schema(typing.get_args(typ)[1])}
    if origin is Literal:
        return {"enum": list(typing.get_args(typ))}
    if isinstance(typ, type) and issubclass(typ, enum.Enum):
        return {"enum": [m.value for m in typ]}
    if typ is type(None):
        return {"type": "null"}
    return {"type": _PLAIN[typ]}


def _struct(typ: type[msgspec.Struct]) -> dict[str, Any]:
    hints = typing.get_type_hints(typ, include_extras=True)
    properties, required = {}, []
    for f in msgspec.structs.fields(typ):
        prop = _schema(hints[f.name])
        if f.required:
            required.append(f.encode_name)
        elif (default := default_of(f)) is not None:
            prop["default"] = _plain(default)
        properties[f.encode_name] = prop
    # forbid_unknown_fields: a typo is an error, not a silently ignored key.
    out: dict[str, Any] = {"type": "object", "properties": properties,
                           "additionalProperties": False}
    if required:
        out["required"] = required
    return out


def _plain(value: Any) -> Any:
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, Duration):
        return duration_text(value)
    if isinstance(value, msgspec.Struct):
        return {f.encode_name: _plain(getattr(value, f.name))
                for f in msgspec.structs.fields(value) if getattr(value, f.name) is not None}
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value
