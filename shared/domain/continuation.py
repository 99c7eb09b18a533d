"""Continuation tokens as the API hands them out: opaque to a client, checked on return.

A store's own cursor (a Table Storage continuation, a rest-index key, an order id, a blob
marker) does not say which listing it continues, and each store takes almost any string
as a place to start: junk read as "after everything" answered an empty page with no
continuation, which a client takes for the end of the listing. So a token names the
listing it continues and carries the store's cursor; one that does not decode, or names
another listing, is refused (a 400) and never reaches a store.

The token is base64url (no padding) of `{"v": 1, "of": listing, "at": cursor}`. It is
not signed: a client that builds one by hand reads from where it says, which any cursor
of that listing may do.
"""

from __future__ import annotations

import base64
import json
import re
from typing import Final

from shared import jsonbounds

VERSION: Final = 1
MAX_TOKEN_CHARS: Final = 4096
"""Far above any token handed out (a Table Storage continuation is two keys of at most
1 KiB each, in base64 twice); bounds the work a junk token costs."""
_BASE64URL: Final = re.compile(r"^[A-Za-z0-9_-]+$")
_FIELDS: Final = frozenset({"v", "of", "at"})


class InvalidContinuation(ValueError):
    """A continuation token this listing did not hand out."""


def wrap(listing: str, cursor: str | None) -> str | None:
    """The token for `cursor` of `listing`; None (the listing's end) stays None."""
    if cursor is None:
        return None
    text = json.dumps({"v": VERSION, "of": listing, "at": cursor}, separators=(",", ":"))
    return base64.urlsafe_b64encode(text.encode()).decode().rstrip("=")


def unwrap(token: str | None, listing: str) -> str | None:
    """The store's cursor in `token`, if `listing` handed it out; None or "" is the
    listing's start. Raises InvalidContinuation for anything else."""
    if not token:
        return None
    if len(token) > MAX_TOKEN_CHARS or not _BASE64URL.match(token):
        raise InvalidContinuation(_refused())
    try:
        raw = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))
        found = jsonbounds.loads(raw)
    except ValueError:  # bad base64 length, not UTF-8, not JSON, too deep
        raise InvalidContinuation(_refused()) from None
    if (
        not isinstance(found, dict)
        or set(found) != _FIELDS
        or type(found["v"]) is not int
        or found["v"] != VERSION
        or not isinstance(found["at"], str)
        or not found["at"]
    ):
        raise InvalidContinuation(_refused())
    if found["of"] != listing:
        raise InvalidContinuation(_refused("it continues another listing"))
    cursor: str = found["at"]
    return cursor


def _refused(why: str = "it is not one this API handed out") -> str:
    return (
        f"invalid continuation token: {why}; pass back the continuation of the last page "
        "as it came, or none for the first page"
    )
