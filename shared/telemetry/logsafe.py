"""Log lines a client cannot forge: control characters in a message become visible escapes.

A path, an id, a reason or a header value that a client chose goes into log messages
as it came. Written raw, `\\r` and `\\n` start what looks like another log line and ESC
sequences clear or recolour the operator's terminal. Escaping at the formatter covers
every message, whoever logged it; an exception's traceback, which only the code
writes, keeps its lines.
"""

from __future__ import annotations

import logging
import re

_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")


def escape_controls(text: str) -> str:
    """`\\x1b[2J` stays readable as text and does nothing; a tab stays a tab."""
    return _CONTROL.sub(lambda m: m.group() if m.group() == "\t" else _escaped(m.group()), text)


def _escaped(char: str) -> str:
    code = ord(char)
    return f"\\x{code:02x}" if code <= 0xFF else f"\\u{code:04x}"


class ControlSafeFormatter(logging.Formatter):
    def formatMessage(self, record: logging.LogRecord) -> str:
        record.message = escape_controls(record.message)
        return super().formatMessage(record)


def make_handlers_safe(logger: logging.Logger | None = None) -> None:
    """Give every handler of `logger` (the root by default) the escaping formatter, with
    the format it already has."""
    for handler in (logger or logging.getLogger()).handlers:
        current = handler.formatter or logging.Formatter()
        handler.setFormatter(ControlSafeFormatter(current._fmt, current.datefmt, validate=False))
