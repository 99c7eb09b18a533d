"""JSON from outside, parsed with its nesting bounded.

Python's parser recurses once per level: a body nested a thousand levels deep raises
RecursionError, which no caller expects from bad input. Every body, continuation token
and queue message is checked here first, without recursion, so deep input is an
ordinary ValueError: a 400 over HTTP, a dead letter on a queue.
"""

from __future__ import annotations

import json
import re
from typing import Any

MAX_DEPTH = 32
"""No document of the contract nests deeper than 6; 32 leaves room and bounds the stack."""

_STRING_OR_BRACKET = re.compile(rb'"(?:[^"\\]|\\.)*"|[\[\]{}]', re.DOTALL)


class TooDeep(ValueError):
    """The document nests deeper than the bound."""


def check_depth(raw: bytes | str, max_depth: int = MAX_DEPTH) -> None:
    """Raise TooDeep if arrays and objects nest deeper than ``max_depth``.

    Brackets inside strings do not count; malformed input is left to the parser.
    """
    data = raw.encode("utf-8", "surrogatepass") if isinstance(raw, str) else raw
    if data.count(b"[") + data.count(b"{") <= max_depth:
        return
    depth = 0
    for match in _STRING_OR_BRACKET.finditer(data):
        token = match.group()
        if token in (b"[", b"{"):
            depth += 1
            if depth > max_depth:
                raise TooDeep(f"JSON nested deeper than {max_depth} levels")
        elif token in (b"]", b"}"):
            depth -= 1


def loads(raw: bytes | str, max_depth: int = MAX_DEPTH) -> Any:
    """``json.loads`` for untrusted input: ValueError (or its TooDeep) on anything bad."""
    check_depth(raw, max_depth)
    try:
        return json.loads(raw)
    except RecursionError:
        raise TooDeep("JSON nested too deep to parse") from None
