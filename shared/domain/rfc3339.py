"""RFC 3339 date-times with an offset, exactly as the OpenAPI document's `format:
date-time` takes them.

`datetime.fromisoformat` and pydantic take far more: a bare date, no offset, ISO week
dates, `20260131` (pydantic reads it as Unix time: 1970-08-23), a space for the `T`,
no seconds. A client generated from the document refuses those before it sends, so the
server refusing them too is what keeps the two in agreement; a person who wants to type
a date uses the CLI, which turns it into midnight UTC.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta, timezone

EXAMPLE = "2026-01-31T00:00:00Z"

_DATE_TIME = re.compile(
    r"(\d{4})-(\d{2})-(\d{2})[Tt](\d{2}):(\d{2}):(\d{2})(?:\.(\d+))?"
    r"(?:([Zz])|([+-])(\d{2}):(\d{2}))",
    re.ASCII,
)


def parse_date_time(text: str) -> datetime:
    """The moment `text` names, with its offset; ValueError for anything else. Like the
    document's validators, no leap second (`:60`, which datetime cannot hold) and no
    year 0. Digits of a fraction past microseconds are dropped."""
    found = _DATE_TIME.fullmatch(text)
    if found is None:
        raise ValueError(f"not an RFC 3339 date-time with an offset, e.g. {EXAMPLE}")
    year, month, day, hour, minute, second = (int(g) for g in found.groups()[:6])
    fraction, zulu, sign, off_hours, off_minutes = found.groups()[6:]
    if zulu:
        zone = UTC
    else:
        if int(off_hours) > 23 or int(off_minutes) > 59:
            raise ValueError(f"an offset of {sign}{off_hours}:{off_minutes} is not a time zone")
        offset = timedelta(hours=int(off_hours), minutes=int(off_minutes))
        zone = timezone(-offset if sign == "-" else offset)
    micro = int((fraction or "0")[:6].ljust(6, "0"))
    return datetime(year, month, day, hour, minute, second, micro, tzinfo=zone)
