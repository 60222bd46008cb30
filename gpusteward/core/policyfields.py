"""Every policy field path with its default: docs/policy.md is tested against this list."""

from __future__ import annotations

import typing
from collections.abc import Iterator
from typing import Any

import msgspec

from gpusteward.core.policy import Policy


def _default(f: msgspec.structs.FieldInfo) -> Any:
    if f.default is not msgspec.NODEFAULT:
        return f.default
    if f.default_factory is not msgspec.NODEFAULT:
        return f.default_factory()
    return "(required)"


def fields(t: type[msgspec.Struct] = Policy, prefix: str = "") -> Iterator[tuple[str, Any]]:
    """(`classes.*.weights.card`, 3.0), ...; `*` stands for a map key, `[*]` for a list item."""
    hints = typing.get_type_hints(t, include_extras=True)
    for f in msgspec.structs.fields(t):
        hint = hints[f.name]
        if typing.get_origin(hint) is typing.Annotated:
            hint = typing.get_args(hint)[0]
        path = f"{prefix}{f.encode_name}"
        if isinstance(hint, type) and issubclass(hint, msgspec.Struct):
            yield from fields(hint, path + ".")
            continue
        args = typing.get_args(hint)
        item = args[-1] if args else None
        if isinstance(item, type) and issubclass(item, msgspec.Struct):
            yield from fields(item, path + ("[*]." if typing.get_origin(hint) is list else ".*."))
        else:
            yield path, _default(f)
