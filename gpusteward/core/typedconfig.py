"""Decode plain data (from YAML) into msgspec Structs, reporting *every* error with its path.

msgspec stops at the first error; an operator fixing a policy file wants them all at once, so we
walk the Struct definitions field by field and let msgspec check each leaf value.
"""

from __future__ import annotations

import enum
import math
import re
import types
import typing
from dataclasses import dataclass
from typing import Any, Union, get_args, get_origin

import msgspec

from gpusteward.core.times import DAY, HOUR, MINUTE

_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d)")
_UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "m": float(MINUTE), "h": float(HOUR), "d": float(DAY)}


class Duration(float):
    """Seconds: in YAML a number of seconds or Go-style text such as `90s`, `15m`, `1h30m`."""

    @classmethod
    def parse(cls, value: object) -> Duration:
        if isinstance(value, bool):
            raise ValueError("expected a duration such as 30s, 15m or 1h")
        seconds = None
        if isinstance(value, int | float):
            try:
                seconds = float(value)
            except OverflowError:  # an int such as 10**400
                seconds = math.inf
        elif isinstance(value, str):
            text = value.strip()
            parts = _DURATION_PART.findall(text)
            if parts and "".join(n + u for n, u in parts) == text:
                seconds = sum(float(n) * _UNIT_SECONDS[u] for n, u in parts)
        if seconds is None:
            raise ValueError(f"expected a duration such as 30s, 15m or 1h, got {_short(value)}")
        # NaN would compare false with every bound and infinity overflows every clock.
        if not math.isfinite(seconds):
            raise ValueError(f"expected a finite duration, got {_short(value)}")
        if seconds < 0:
            raise ValueError("a duration cannot be negative")
        return cls(seconds)

    def __repr__(self) -> str:
        return f"Duration({float(self)}s)"


def duration_text(seconds: float) -> str:
    """The shortest Go-style text for whole units: 90 -> `90s`, 3600 -> `1h`, 0.5 -> `500ms`."""
    for unit in ("d", "h", "m", "s", "ms"):
        count = seconds / _UNIT_SECONDS[unit]
        if seconds and count < 10**6 and count == int(count):
            return f"{int(count)}{unit}"
    return f"{seconds:g}s"


@dataclass(frozen=True)
class Between:
    """A duration field's accepted range in seconds (`Annotated[Duration, Between(1, 3600)]`).

    Every duration has one: an unbounded duration lets a typo like `1e308` overflow a clock or
    switch a loop off. docs/policy.md shows each range, as `text`."""

    low: float
    high: float

    @property
    def text(self) -> str:
        return f"{duration_text(self.low) if self.low else '0'}–{duration_text(self.high)}"

    def check(self, seconds: float) -> str | None:
        if self.low <= seconds <= self.high:
            return None
        return f"{duration_text(seconds)} is outside {self.text}"


def _short(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


Path = tuple[str | int, ...]


@dataclass(frozen=True)
class FieldError:
    keys: Path
    message: str

    @property
    def path(self) -> str:
        """`classes.training.weights[0]`: the keys as an operator reads them in the YAML."""
        text = ""
        for key in self.keys:
            text += f"[{key}]" if isinstance(key, int) else (f".{key}" if text else key)
        return text

    def __str__(self) -> str:
        return f"{self.path or '<root>'}: {self.message}"


def _join(path: Path, key: str | int) -> Path:
    return (*path, key)


def without(data: Any, paths: list[Path]) -> Any:
    """A copy of data with the values at paths removed, so defaults apply there."""
    if not isinstance(data, dict | list):
        return data
    drop = {p[0] for p in paths if len(p) == 1}
    deeper: dict[str | int, list[Path]] = {}
    for p in paths:
        if len(p) > 1:
            deeper.setdefault(p[0], []).append(p[1:])
    if isinstance(data, list):
        return [without(v, deeper.get(i, [])) for i, v in enumerate(data) if i not in drop]
    return {k: without(v, deeper.get(k, [])) for k, v in data.items() if k not in drop}


def decode(data: Any, typ: Any, path: Path = (), default: Any = None
           ) -> tuple[Any, list[FieldError]]:
    """Return (value, errors). The value is only meaningful when errors is empty.

    default: what the data replaces. A mapping given for a Struct only overrides the fields it
    names; the others keep default's values (a map entry's default is the default map's entry of
    the same key), so a partial section never loses the defaults of the fields it leaves out."""
    origin = get_origin(typ)
    if origin is typing.Annotated:
        base, *meta = get_args(typ)
        if isinstance(base, type) and issubclass(base, msgspec.Struct):
            return _decode_struct(data, base, path, default)
        if base is Duration:
            return _duration(data, meta, path)
        return _leaf(data, typ, path)
    if isinstance(typ, type) and issubclass(typ, msgspec.Struct):
        return _decode_struct(data, typ, path, default)
    if typ is Duration:
        return _duration(data, [], path)
    if origin in (Union, types.UnionType):
        return _decode_optional(data, typ, path, default)
    if origin is list:
        return _decode_list(data, get_args(typ)[0], path)
    if origin is dict:
        return _decode_dict(data, get_args(typ)[1], path, default)
    return _leaf(data, typ, path)


def _duration(data: Any, meta: list[Any], path: Path) -> tuple[Any, list[FieldError]]:
    try:
        value = Duration.parse(data)
    except ValueError as e:
        return None, [FieldError(path, str(e))]
    problems = [m.check(value) for m in meta if isinstance(m, Between)]
    errors = [FieldError(path, p) for p in problems if p]
    return (None, errors) if errors else (value, [])


def _decode_optional(data: Any, typ: Any, path: Path, default: Any
                     ) -> tuple[Any, list[FieldError]]:
    members = [a for a in get_args(typ) if a is not type(None)]
    if data is None and len(members) < len(get_args(typ)):
        return None, []
    if len(members) == 1:
        return decode(data, members[0], path, default)
    return _leaf(data, typ, path)


def _decode_list(data: Any, item: Any, path: Path) -> tuple[Any, list[FieldError]]:
    if not isinstance(data, list):
        return None, [FieldError(path, f"expected a list, got {_kind(data)}")]
    out, errors = [], []
    for i, element in enumerate(data):
        value, errs = decode(element, item, _join(path, i))
        out.append(value)
        errors += errs
    return out, errors


def _decode_dict(data: Any, item: Any, path: Path, default: Any
                 ) -> tuple[Any, list[FieldError]]:
    if not isinstance(data, dict):
        return None, [FieldError(path, f"expected a mapping, got {_kind(data)}")]
    out, errors = {}, []
    for key, element in data.items():
        if not isinstance(key, str):
            errors.append(FieldError(_join(path, str(key)), "keys must be strings"))
            continue
        same = default.get(key) if isinstance(default, dict) else None
        out[key], errs = decode(element, item, _join(path, key), same)
        errors += errs
    return out, errors


def _decode_struct(
    data: Any, typ: type[msgspec.Struct], path: Path, default: Any
) -> tuple[Any, list[FieldError]]:
    if data is None:
        data = {}
    if not isinstance(data, dict):
        return None, [FieldError(path, f"expected a mapping, got {_kind(data)}")]
    hints = typing.get_type_hints(typ, include_extras=True)
    fields = msgspec.structs.fields(typ)
    known = {f.encode_name for f in fields}
    errors = [
        FieldError(_join(path, str(k)), f"unknown field (known: {', '.join(sorted(known))})")
        for k in data
        if k not in known
    ]
    kwargs = {}
    for f in fields:
        before = getattr(default, f.name) if isinstance(default, typ) else default_of(f)
        if f.encode_name not in data:
            if f.required and before is None:
                errors.append(FieldError(_join(path, f.encode_name), "required field is missing"))
            elif before is not None:
                kwargs[f.name] = before
            continue
        value, errs = decode(data[f.encode_name], hints[f.name], _join(path, f.encode_name),
                             before)
        errors += errs
        kwargs[f.name] = value
    if errors:
        return None, errors
    return typ(**kwargs), []


def default_of(f: msgspec.structs.FieldInfo) -> Any:
    """A Struct field's default value (a fresh one where it has a factory); None if required."""
    if f.default is not msgspec.NODEFAULT:
        return f.default
    if f.default_factory is not msgspec.NODEFAULT:
        return f.default_factory()
    return None


def _leaf(data: Any, typ: Any, path: Path) -> tuple[Any, list[FieldError]]:
    choices = _choices(typ)
    if choices is not None and data not in choices:
        return None, [FieldError(path, f"expected one of {', '.join(map(str, choices))}, "
                                      f"got {data!r}")]
    try:
        value = msgspec.convert(data, typ, strict=True)
    except msgspec.ValidationError as e:
        message = str(e).removesuffix(" - at `$`")
        return None, [FieldError(path, message)]
    if isinstance(value, float) and not math.isfinite(value):
        return None, [FieldError(path, f"expected a finite number, got {value}")]
    return value, []


def _choices(typ: Any) -> list[Any] | None:
    """The values a closed vocabulary (a Literal or an Enum) accepts; None for any other type."""
    if get_origin(typ) is typing.Literal:
        return list(get_args(typ))
    if isinstance(typ, type) and issubclass(typ, enum.Enum):
        return [m.value for m in typ]
    return None


def _kind(data: Any) -> str:
    return "nothing" if data is None else type(data).__name__
