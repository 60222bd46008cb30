"""Every policy field path with its default: docs/policy.md is tested against this list."""

from __future__ import annotations

import types
import typing
from collections.abc import Iterator
from typing import Any, Union

import msgspec

from gpusteward.core.policy import Policy
from gpusteward.core.typedconfig import Between, default_of


def _default(f: msgspec.structs.FieldInfo) -> Any:
    return "(required)" if f.required else default_of(f)


def fields(t: type[msgspec.Struct] = Policy, prefix: str = ""
           ) -> Iterator[tuple[str, Any, Between | None]]:
    """(`classes.*.weights.card`, 3.0, None), ...; `*` stands for a map key, `[*]` for a list
    item; the last item is a duration's accepted range."""
    hints = typing.get_type_hints(t, include_extras=True)
    for f in msgspec.structs.fields(t):
        hint = hints[f.name]
        if typing.get_origin(hint) in (Union, types.UnionType):  # `X | None`
            hint = next(a for a in typing.get_args(hint) if a is not type(None))
        bounds = None
        if typing.get_origin(hint) is typing.Annotated:
            hint, *meta = typing.get_args(hint)
            bounds = next((m for m in meta if isinstance(m, Between)), None)
        path = f"{prefix}{f.encode_name}"
        if isinstance(hint, type) and issubclass(hint, msgspec.Struct):
            yield from fields(hint, path + ".")
            continue
        args = typing.get_args(hint)
        item = args[-1] if args else None
        if isinstance(item, type) and issubclass(item, msgspec.Struct):
            yield from fields(item, path + ("[*]." if typing.get_origin(hint) is list else ".*."))
        else:
            yield path, _default(f), bounds
