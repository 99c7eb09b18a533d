"""Signed events (docs/events.md#signing): a signature names what it authorises.

With EventSigningSecret set, `POST /api/orders/{orderId}/events/{eventName}` needs

    x-signature: t=<unix seconds>,v1=<hex HMAC-SHA256 of the signed text>

where the signed text is the timestamp, the order id, the event name and the raw body,
joined by line feeds. A body-only HMAC authorised its body for every order: a captured
signed approval approved any other order it was replayed to. Binding the order and the
event name makes a captured request authorise that one event and nothing else; the
timestamp bounds how long it can be presented at all.

Replay, precisely: presenting a captured signed request again. To another order, as
another event, or with another body, it does not verify; more than WINDOW from the time
it names (either way: a clock ahead must not mint long-lived signatures), it is refused.
Within WINDOW, unchanged, it is the same event again, and its `eventId` (part of the
signed body) makes a repeat change nothing, so no store of used signatures is needed and
a client's retry after a 503 is not mistaken for an attack.

Pure: the caller passes the secret and the time (the app's clock), so tests move time.
"""

from __future__ import annotations

import hashlib
import hmac
import re
from datetime import datetime
from typing import Final

SIGNATURE_HEADER: Final = "x-signature"
WINDOW_SECONDS: Final = 300
"""How far the signing time may be from the server's clock, either way: long enough
for a retry and some clock skew, short enough that a captured request soon expires."""
SCHEME: Final = "v1"
"""The only scheme: HMAC-SHA256 of the signed text. A later one gets its own key."""
FORMAT: Final = "t=<unix seconds>,v1=<hex HMAC-SHA256 of t, orderId, eventName, body>"
_MAX_HEADER: Final = 1024
"""A header longer than any legitimate one (one timestamp, a few signatures) is refused
unread."""
_SECONDS = re.compile(r"[0-9]{1,12}", re.ASCII)
_HEX = re.compile(r"[0-9a-f]{64}", re.ASCII)


def signed_text(timestamp: int, order_id: str, event: str, body: bytes) -> bytes:
    """What v1 signs: `{t}\\n{orderId}\\n{eventName}\\n{body}`. A line feed, since an
    order id may hold dots, and no field before the body may hold a line feed
    (ValueError), so the text splits back one way only."""
    if "\n" in order_id or "\n" in event:
        raise ValueError("an order id or event name with a line feed cannot be signed")
    return f"{timestamp}\n{order_id}\n{event}\n".encode() + body


def signature(secret: str, timestamp: int, order_id: str, event: str, body: bytes) -> str:
    """The hex HMAC-SHA256 of the signed text under the secret (UTF-8)."""
    text = signed_text(timestamp, order_id, event, body)
    return hmac.new(secret.encode(), text, hashlib.sha256).hexdigest()


def header(secret: str, timestamp: int, order_id: str, event: str, body: bytes) -> str:
    """The `x-signature` value a client sends for this event, signed at `timestamp`."""
    return f"t={timestamp},{SCHEME}={signature(secret, timestamp, order_id, event, body)}"


def refusal(
    value: str | None, secret: str, order_id: str, event: str, body: bytes, now: datetime
) -> str | None:
    """None when `value` signs this order's event with this body within WINDOW_SECONDS
    of `now`; otherwise why not, in words for the 401 (nothing in it helps a forger:
    the signature is checked before the time, in constant time)."""
    if value is None or not value.strip():
        return f"{SIGNATURE_HEADER} is required: {FORMAT}"
    try:
        timestamp, candidates = _parse(value)
    except _Unreadable as exc:
        return str(exc)
    if "\n" in order_id or "\n" in event:
        return "an order id or event name with a line feed is never signed"
    expected = signature(secret, timestamp, order_id, event, body).encode()
    if not any(hmac.compare_digest(expected, c.encode()) for c in candidates):
        return (
            f"the signature does not match this order, event and body (it signs "
            f"{SCHEME}: t, orderId, eventName and the raw body, joined by line feeds)"
        )
    age = int(now.timestamp()) - timestamp
    if abs(age) > WINDOW_SECONDS:
        when = f"{age} s ago" if age > 0 else f"{-age} s ahead"
        return f"signed {when}: a signature is good for {WINDOW_SECONDS} s either way"
    return None


class _Unreadable(ValueError):
    """A signature header that cannot be read; the message says why, for the 401."""


def _parse(value: str) -> tuple[int, list[str]]:
    """The timestamp and the v1 signatures of a header; _Unreadable says why not. Keys
    other than `t` and `v1` are ignored (room for another scheme beside v1); several
    `v1` may be sent (any one matching is enough, as while a secret is rotated)."""
    malformed = f"{SIGNATURE_HEADER} must be {FORMAT}"
    if len(value) > _MAX_HEADER:
        raise _Unreadable(malformed)
    if value.strip().startswith("sha256="):
        raise _Unreadable(
            f"{SIGNATURE_HEADER}: sha256=<HMAC of the body> is no longer accepted (it did "
            f"not bind the order); sign as {FORMAT}"
        )
    stamps: list[str] = []
    candidates: list[str] = []
    for part in value.split(","):
        key, sep, item = part.strip().partition("=")
        if not sep:
            raise _Unreadable(malformed)
        if key == "t":
            stamps.append(item)
        elif key == SCHEME:
            candidates.append(item.lower())
    if len(stamps) != 1 or not _SECONDS.fullmatch(stamps[0]):
        raise _Unreadable(f"{malformed}: one t, in whole seconds")
    if not candidates or not all(_HEX.fullmatch(c) for c in candidates):
        raise _Unreadable(f"{malformed}: {SCHEME} is 64 hex digits")
    return int(stamps[0]), candidates
