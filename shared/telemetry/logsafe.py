"""Log lines a client cannot forge: control characters in a message become visible escapes.

A path, an id, a reason or a header value that a client chose goes into log messages
as it came, and into exception messages that tracebacks repeat. Written raw, `\\r` and
`\\n` start what looks like another log line and ESC sequences clear or recolour the
operator's terminal. Escaping at the formatter covers every record, whoever logged it
(aiohttp's and the Azure SDKs' loggers too): the message, and in a traceback every
exception's message and notes; the traceback's own lines (frames, source, the chain's
separators) are the code's and keep their line breaks.

The formatter is the local mains' (`python -m devhost` and its services). In Azure the
records go to Application Insights through the worker's handler and the OpenTelemetry
distro's, whose formatting is not ours; so the app's own loggers (`app_logger`) carry
`ControlSafeFilter`, which escapes the message and the traceback before any handler
sees the record, and `guard_root_handlers` puts it on the root's handlers (the
worker's), which take every other logger's records, the Azure SDKs' too.

Escaping is idempotent (what it writes has no control character left), so a record the
filter escaped passes the formatter unchanged; the traceback, the costly part, is
formatted once per record and marked on it.
"""

from __future__ import annotations

import logging
import re
import traceback
from collections.abc import Callable, Generator
from types import TracebackType

_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029\ud800-\udfff]")
"""Controls and line separators, and lone surrogates: a handler that writes UTF-8 (the
worker's, to the host) cannot encode one, and drops the record with a traceback of its
own. An order stored before the edge refused them may hold one (issue 41)."""


def escape_controls(text: str) -> str:
    """`\\x1b[2J` stays readable as text and does nothing; a tab stays a tab."""
    return _CONTROL.sub(lambda m: m.group() if m.group() == "\t" else _escaped(m.group()), text)


def _escaped(char: str) -> str:
    code = ord(char)
    return f"\\x{code:02x}" if code <= 0xFF else f"\\u{code:04x}"


ExcInfo = tuple[type[BaseException] | None, BaseException | None, TracebackType | None]


def format_exception(exc_info: ExcInfo) -> str:
    """The traceback as `logging.Formatter.formatException` writes it, each exception's
    message and notes on one line with its controls escaped, line breaks included."""
    _, value, tb = exc_info
    if value is None:
        return "NoneType: None"
    report = traceback.TracebackException(type(value), value, tb, compact=True)
    _escape_messages(report)
    return "".join(report.format()).removesuffix("\n")


def _escape_messages(report: traceback.TracebackException) -> None:
    """Every report of the chain and the group formats its exception part through
    `format_exception_only`, whose chunks are one line each but for a message's own line
    breaks; chained reports are built by the standard library, not by us, so each
    report's method is wrapped in place."""
    pending, seen = [report], set()
    while pending:
        node = pending.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        notes = node.__notes__
        if isinstance(notes, list | tuple):
            node.__notes__ = [escape_controls(n) if isinstance(n, str) else n for n in notes]
        node.format_exception_only = _escaped_lines(node.format_exception_only)  # type: ignore[method-assign]
        pending.extend(n for n in (node.__cause__, node.__context__) if n is not None)
        pending.extend(node.exceptions or ())


Chunks = Callable[..., Generator[str, None, None]]


def _escaped_lines(chunks: Chunks) -> Chunks:
    def escaped(*args: object, **kwargs: object) -> Generator[str, None, None]:
        for chunk in chunks(*args, **kwargs):
            body = chunk.removesuffix("\n")
            yield escape_controls(body) + chunk[len(body) :]

    return escaped


_TRACEBACK_ESCAPED = "traceback_escaped"
"""A record attribute: its `exc_text` is `format_exception`'s, not a raw traceback some
other formatter cached on it."""


def escape_traceback(record: logging.LogRecord) -> None:
    if record.exc_info and not getattr(record, _TRACEBACK_ESCAPED, False):
        record.exc_text = format_exception(record.exc_info)
        setattr(record, _TRACEBACK_ESCAPED, True)


class ControlSafeFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        escape_traceback(record)
        return super().format(record)

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
    in, and the traceback are escaped here once for all of them (a handler's formatter
    uses the `exc_text` it finds). A record with nothing to escape keeps its template and
    arguments; a message whose arguments do not fit its template is left for the handler
    to report, as logging does."""

    def filter(self, record: logging.LogRecord) -> bool:
        escape_traceback(record)
        try:
            message = record.getMessage()
        except Exception:
            return True
        escaped = escape_controls(message)
        if escaped != message:
            record.msg, record.args = escaped, None
        return True


_SAFE = ControlSafeFilter()


def guard_root_handlers() -> None:
    """The filter on each handler of the root logger as it stands (in Azure the worker's,
    which gets the records of every logger, the SDKs' too). A logger's filter sees only
    its own records; a handler's sees every record it handles."""
    for handler in logging.getLogger().handlers:
        if _SAFE not in handler.filters:
            handler.addFilter(_SAFE)


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
