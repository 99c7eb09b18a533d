"""JSON from outside: parsed with its nesting bounded, and only text and numbers that
every store and client can carry.

Python's parser recurses once per level: a body nested a thousand levels deep raises
RecursionError, which no caller expects from bad input. Every body, continuation token
and queue message is checked here first, without recursion, so deep input is an
ordinary ValueError: a 400 over HTTP, a dead letter on a queue.

The same parser also takes what no JSON peer can give back (issue 41): `NaN`,
`Infinity`, `-Infinity` and numbers past a double's range (`1e400` reads as inf), and
strings with a lone surrogate (`"\\ud800"`, or those bytes raw, which it reads with
surrogatepass). Stored, the first made `GET /api/orders/{id}` answer invalid JSON and the
second stopped the archiver for good (UTF-8 cannot encode it) and made the Tables SDK's
filter quoting raise. So this is the one place where both are refused, for every body
and every message, with where in the document they were (`Unrepresentable`).
"""

from __future__ import annotations

import json
import math
import re
from typing import Any, Final

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


class Unrepresentable(ValueError):
    """A lone surrogate or a number that is not finite, and where: `data.by: NaN is not
    a finite number`. The message is ASCII, so it can go into a log, a problem+json
    detail or a dead letter's properties as it is."""


_SURROGATE_BYTES: Final = re.compile(rb"\\u[dD][89a-fA-F]|\xed[\xa0-\xbf]")
"""A surrogate, paired or not: as an escape, or as the bytes UTF-8 would use for it."""
_DIGITS_AND_SIGNS: Final = bytes.maketrans(b"123456789E-", b"000000000e+")
_LONG_NUMBER: Final = b"0" * 200
_MANTISSA: Final = frozenset(b"0123456789.-")
_BEFORE_A_NUMBER: Final = frozenset(b" \t\r\n[,:")


def _may_hold_surrogate(data: bytes) -> bool:
    return (b"\\u" in data or b"\xed" in data) and _SURROGATE_BYTES.search(data) is not None


def _may_not_be_finite(data: bytes) -> bool:
    """`NaN`, `Infinity`, or a number past a double's range (about 1.8e308): an exponent
    of three digits or more, or over 200 digits before its point (a two-digit exponent
    adds at most 99). Searched as substrings, not with a regex: a queue message is read
    by this on every delivery, and `re` takes as long as the parse.

    An exponent counts only in a number, which JSON puts after `[`, `,`, `:`, its four
    whitespace characters or nothing (pydantic's parser, which reads what passes here,
    takes no byte-order mark): a hex id's `3e456` is not one (a quarter of uuid4 hex
    ids hold such a run). Each look back stops at the first character that is not the
    mantissa's, an `e` included, so the scan stays linear whatever the input."""
    if b"NaN" in data or b"Infinity" in data:
        return True
    shape = data.translate(_DIGITS_AND_SIGNS)
    if _LONG_NUMBER in shape:
        return True
    for exponent in (b"e000", b"e+000"):
        at = shape.find(exponent)
        while at >= 0:
            start = at
            while start > 0 and data[start - 1] in _MANTISSA:
                start -= 1
            if start == 0 or data[start - 1] in _BEFORE_A_NUMBER:
                return True
            at = shape.find(exponent, at + 1)
    return False


_SURROGATE: Final = re.compile("[\ud800-\udfff]")
"""In a parsed string every surrogate is lone: the parser joins an escaped pair into one
code point."""
_SHOWN: Final = 40
"""Characters of a key or a number a message repeats."""


class _NotFinite:
    """What the parser made of `NaN`, `Infinity` or an overflowing number: kept as its
    text until the walk finds it and says where."""

    def __init__(self, text: str) -> None:
        self.text = text


def loads(raw: bytes | str, max_depth: int = MAX_DEPTH) -> Any:
    """``json.loads`` for untrusted input: ValueError (TooDeep, Unrepresentable, or the
    parser's own) on anything bad."""
    check_depth(raw, max_depth)
    not_finite: list[_NotFinite] = []

    def refused(text: str) -> _NotFinite:
        not_finite.append(_NotFinite(text))
        return not_finite[-1]

    def number(text: str) -> float | _NotFinite:
        value = float(text)
        return value if math.isfinite(value) else refused(text)

    try:
        value = json.loads(raw, parse_constant=refused, parse_float=number)
    except RecursionError:
        raise TooDeep("JSON nested too deep to parse") from None
    if not_finite or _may_hold_surrogate(_bytes(raw)):
        _refuse_unrepresentable(value, ())
    return value


def loads_answer(raw: bytes | str, max_depth: int = MAX_DEPTH) -> Any:
    """``json.loads`` for an answer that cannot be refused, as a client's body is: a
    provider's 2xx says its operation took effect, and the result in it is what a
    compensation needs. Each number that is not finite is null and each lone surrogate
    U+FFFD, so what is kept follows the rule; ValueError only for what is not JSON."""
    check_depth(raw, max_depth)
    try:
        value = json.loads(raw, parse_constant=lambda _: None, parse_float=_finite_or_none)
    except RecursionError:
        raise TooDeep("JSON nested too deep to parse") from None
    return _kept(value) if _may_hold_surrogate(_bytes(raw)) else value


def dumps(value: Any, **options: Any) -> str:
    """``json.dumps`` that writes only what the rule accepts, whatever `value` holds: a
    row stored before the rule may hold NaN (which JSON has no token for: a client's
    parser fails on the whole answer) or a lone surrogate (which our own triggers now
    refuse, so a message carrying one from an old row is dead-lettered). Each is
    written as null and U+FFFD. The usual value costs one dumps and a substring test."""
    try:
        text = json.dumps(value, allow_nan=False, **options)
    except ValueError:  # NaN or an infinity
        return json.dumps(_kept(value), allow_nan=False, **options)
    if _may_hold_surrogate(_bytes(text)):
        return json.dumps(_kept(value), allow_nan=False, **options)
    return text


def _finite_or_none(text: str) -> float | None:
    value = float(text)
    return value if math.isfinite(value) else None


def _kept(value: Any) -> Any:
    """`value` with each number that is not finite as None and each lone surrogate, in
    a string or a name, as U+FFFD."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, str):
        return _SURROGATE.sub("\ufffd", value)
    if isinstance(value, dict):
        return {_kept(k): _kept(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_kept(v) for v in value]
    return value


def check(raw: bytes | str, max_depth: int = MAX_DEPTH) -> None:
    """For a document another parser reads (a queue message, by pydantic, which takes
    NaN too): the depth, then the rule, parsing here only what may break it."""
    check_depth(raw, max_depth)
    data = _bytes(raw)
    if _may_not_be_finite(data) or _may_hold_surrogate(data):
        loads(raw, max_depth)


def utf8(json_text: str) -> bytes:
    """JSON text as UTF-8, whatever text it holds: a lone surrogate (in a row stored
    before this rule, or from anything else that never came through it) is written as
    its escape, which a parser reads back as the same code point. UTF-8 has no bytes
    for one, and `str.encode` raises. Only the strings of JSON text can hold one, so
    the escape lands inside a string."""
    try:
        return json_text.encode()
    except UnicodeEncodeError:
        return escape_surrogates(json_text).encode()


def escape_surrogates(text: str) -> str:
    """Each lone surrogate as its escape (`\\ud800`): in JSON text the same code point,
    in other text a readable one that any encoding can write."""
    if text.isascii():
        return text
    return _SURROGATE.sub(lambda m: f"\\u{ord(m.group()):04x}", text)


def _bytes(raw: bytes | str) -> bytes:
    return raw.encode("utf-8", "surrogatepass") if isinstance(raw, str) else raw


def _refuse_unrepresentable(value: Any, path: tuple[str, ...]) -> None:
    """Depth-first, so the first offence in document order is the one named; recursion
    is safe here, the depth being bounded already."""
    if isinstance(value, _NotFinite):
        raise Unrepresentable(f"{_where(path)}: {_shown(value.text)} is not a finite number")
    if isinstance(value, str):
        if _SURROGATE.search(value):
            raise Unrepresentable(
                f"{_where(path)}: a lone surrogate ({_shown(value)}) is not Unicode text"
            )
    elif isinstance(value, dict):
        for key, item in value.items():
            if _SURROGATE.search(key):
                raise Unrepresentable(
                    f"{_where((*path, key))}: a lone surrogate in a name is not Unicode text"
                )
            _refuse_unrepresentable(item, (*path, key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            _refuse_unrepresentable(item, (*path, str(index)))


def _where(path: tuple[str, ...]) -> str:
    """As pydantic's errors name a place (shared/domain/messages.py `describe`)."""
    return ".".join(_printable(p[:_SHOWN]) for p in path) or "body"


def _shown(text: str) -> str:
    return _printable(text[:_SHOWN] + ("..." if len(text) > _SHOWN else ""))


def _printable(text: str) -> str:
    """ASCII, each other character as its escape: what the client sent, readably."""
    return text.encode("ascii", "backslashreplace").decode("ascii")
