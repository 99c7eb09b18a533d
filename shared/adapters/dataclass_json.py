"""Frozen domain dataclasses to JSON-ready values and back, driven by `dataclasses.fields`.

Why generic: the step records are stored as JSON inside the state entity, and the domain
adds optional fields to them as it grows. A codec that walks the fields and their type
hints stores a new field the day it is added, and reads records written before it
existed (the field is absent, so its default applies), without a change here. A field
whose value equals its default is left out, which keeps the JSON small and makes that
rule exact. Keys no field claims (a field since removed) are ignored.
"""

from __future__ import annotations

import dataclasses
import functools
import types
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from enum import Enum
from typing import Any, TypeVar, Union, get_args, get_origin, get_type_hints

Json = Any
T = TypeVar("T")


def to_json(value: Any) -> Json:
    """Dataclasses become objects keyed by field name; enums their value; datetimes ISO 8601."""
    if isinstance(value, Enum):
        return value.value
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, datetime):
        return value.isoformat()
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {
            f.name: to_json(getattr(value, f.name))
            for f in dataclasses.fields(value)
            if not _is_default(f, getattr(value, f.name))
        }
    if isinstance(value, Mapping):
        return {str(k): to_json(v) for k, v in value.items()}
    if isinstance(value, Sequence):
        return [to_json(v) for v in value]
    raise TypeError(f"cannot store a {type(value).__name__} as JSON")


def from_json(cls: type[T], data: Json) -> T:
    """The inverse of `to_json` for a dataclass type."""
    value: T = _decode(cls, data)
    return value


def _is_default(f: dataclasses.Field[Any], value: Any) -> bool:
    if f.default is not dataclasses.MISSING:
        return bool(value == f.default)
    if f.default_factory is not dataclasses.MISSING:
        return bool(value == f.default_factory())
    return False


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    return get_type_hints(cls)


def _decode(tp: Any, data: Json) -> Any:
    if tp is Any:
        return data
    origin = get_origin(tp)
    if origin is Union or origin is types.UnionType:
        return _decode_union(get_args(tp), data)
    if isinstance(tp, type):
        return _decode_type(tp, data)
    if origin is not None and isinstance(origin, type):
        args = get_args(tp)
        if issubclass(origin, tuple):
            if len(args) == 2 and args[1] is Ellipsis:
                return tuple(_decode(args[0], v) for v in data)
            return tuple(_decode(a, v) for a, v in zip(args, data, strict=True))
        if issubclass(origin, Mapping):
            return {k: _decode(args[1], v) for k, v in data.items()} if args else dict(data)
        if issubclass(origin, Sequence):
            return [_decode(args[0], v) for v in data] if args else list(data)
    return data


def _decode_union(args: tuple[Any, ...], data: Json) -> Any:
    if data is None and type(None) in args:
        return None
    options = [a for a in args if a is not type(None)]
    for option in options[:-1]:
        try:
            return _decode(option, data)
        except (TypeError, ValueError, KeyError, AttributeError):
            continue
    return _decode(options[-1], data)


def _decode_type(tp: type, data: Json) -> Any:
    if dataclasses.is_dataclass(tp):
        if not isinstance(data, Mapping):
            raise TypeError(f"{tp.__name__} must be stored as an object")
        hints = _hints(tp)
        values = {
            f.name: _decode(hints[f.name], data[f.name])
            for f in dataclasses.fields(tp)
            if f.init and f.name in data
        }
        return tp(**values)
    if issubclass(tp, Enum):
        return tp(data)
    if issubclass(tp, datetime):
        at = datetime.fromisoformat(str(data))
        return at if at.tzinfo else at.replace(tzinfo=UTC)
    if tp is bool:
        if not isinstance(data, bool):
            raise TypeError("expected a boolean")
        return data
    if tp is int or tp is float or tp is str:
        return tp(data)
    if issubclass(tp, Mapping):
        return dict(data)
    return data
