"""Log lines a client cannot forge: control characters in a message become visible escapes.

A path, an id, a reason or a header value that a client chose goes into log messages
as it came. Written raw, `\\r` and `\\n` start what looks like another log line and ESC
sequences clear or recolour the operator's terminal. Escaping at the formatter covers
every message, whoever logged it; an exception's traceback, which only the code
writes, keeps its lines.

The formatter is the local mains' (`python -m devhost` and its services). In Azure the
records go to Application Insights through the worker's handler and the OpenTelemetry
distro's, whose formatting is not ours; so the app's own loggers (`app_logger`) carry
`ControlSafeFilter`, which escapes the message before any handler sees the record.
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


APP_LOGGERS = "orders"
"""The app's logger namespace: `orders` and `orders.<role>`."""


class ControlSafeFilter(logging.Filter):
    """A logger's filter runs before the record reaches any handler, the host's included,
    and the handlers get the same record object; so the message, with its arguments put
    in, is escaped here once for all of them. A record with nothing to escape keeps its
    template and arguments; a message whose arguments do not fit its template is left for
    the handler to report, as logging does."""

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:
            return True
        escaped = escape_controls(message)
        if escaped != message:
            record.msg, record.args = escaped, None
        return True


_SAFE = ControlSafeFilter()


def app_logger(name: str) -> logging.Logger:
    """`logging.getLogger(name)` with `ControlSafeFilter`. A logger's filters are not
    inherited by its children, nor applied to records they pass up, so each of the app's
    loggers carries its own."""
    if name != APP_LOGGERS and not name.startswith(f"{APP_LOGGERS}."):
        raise ValueError(f"{name!r} is not in the app's logger namespace {APP_LOGGERS!r}")
    logger = logging.getLogger(name)
    if _SAFE not in logger.filters:
        logger.addFilter(_SAFE)
    return logger
