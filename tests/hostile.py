"""Hostile values as a careless or hostile client sends them (issue 41): lone
surrogates and numbers that are not finite, put into any string or number of a
document, and the document written as such a client writes it. Shared by the
function-level fuzzing and schemathesis on the running system."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

from hypothesis import strategies as st


@dataclass(frozen=True)
class Raw:
    """A number token written as it is: Python writes no `1e400`, which reads as inf."""

    token: str


LONE_SURROGATES = st.sampled_from(["\ud800", "\udfff", "\udc00\ud800", "\ud83d"])
"""High, low, a reversed pair, and half of an emoji."""
NON_FINITE = st.sampled_from(
    [Raw(t) for t in ("NaN", "Infinity", "-Infinity", "1e400", "-1E+999", "0.5e0400")]
    + [Raw("9" * 400 + ".5"), math.nan, math.inf, -math.inf]
)


def hostile(value: Any) -> st.SearchStrategy[Any]:
    """In place of a string: a lone surrogate, alone or within the text. In place of a
    number: one that is not finite. In place of either, sometimes the other."""
    return text_hostile(value) | NON_FINITE


def text_hostile(value: Any) -> st.SearchStrategy[str]:
    """A lone surrogate, alone or within the text (a name can only be text)."""
    inside = LONE_SURROGATES.map(lambda lone: f"{value}{lone}" if isinstance(value, str) else lone)
    return inside | LONE_SURROGATES


def leaves(value: Any, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Where a document holds a string or a number (a name counts as a string)."""
    if isinstance(value, dict):
        names = [(*path, (key,)) for key in value]
        return names + [p for key, item in value.items() for p in leaves(item, (*path, key))]
    if isinstance(value, list):
        return [p for index, item in enumerate(value) for p in leaves(item, (*path, index))]
    return [path] if isinstance(value, str | int | float) and not isinstance(value, bool) else []


def replaced(value: Any, path: tuple[Any, ...], new: Any) -> Any:
    """`value` with what `path` names replaced; a one-tuple last step names a key."""
    head, *rest = path
    if isinstance(head, tuple):
        return {(new if k == head[0] else k): v for k, v in value.items()}
    copy = dict(value) if isinstance(value, dict) else list(value)
    copy[head] = replaced(value[head], tuple(rest), new) if rest else new
    return copy


def at(value: Any, path: tuple[Any, ...]) -> Any:
    for step in path:
        value = step[0] if isinstance(step, tuple) else value[step]
    return value


def corruptions(document: Any) -> st.SearchStrategy[Any]:
    """The document with one string or number, drawn from all of them (names included),
    made hostile."""

    def corrupt(path: tuple[Any, ...]) -> st.SearchStrategy[Any]:
        value = at(document, path)
        made = text_hostile(value) if isinstance(path[-1], tuple) else hostile(value)
        return made.map(lambda new: replaced(document, path, new))

    return st.sampled_from(leaves(document)).flatmap(corrupt)


def dump(value: Any, escape: bool) -> str:
    """JSON as a careless or hostile client writes it: NaN and Infinity as tokens, and a
    lone surrogate escaped (`\\ud800`) or raw (its CESU-8 bytes, once encoded)."""
    if isinstance(value, Raw):
        return value.token
    if isinstance(value, dict):
        pairs = (f"{dump(str(k), escape)}:{dump(v, escape)}" for k, v in value.items())
        return "{" + ",".join(pairs) + "}"
    if isinstance(value, list):
        return "[" + ",".join(dump(v, escape) for v in value) + "]"
    return json.dumps(value, ensure_ascii=escape)


def wire(value: Any, escape: bool) -> bytes:
    return dump(value, escape).encode("utf-8", "surrogatepass")
