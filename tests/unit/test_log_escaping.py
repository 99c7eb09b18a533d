"""What a client chose cannot start a log line in any handler, ours or the host's (issue
27, item 3 in Azure): there the app's records reach Application Insights through the
worker's and the OpenTelemetry distro's handlers, which never see our formatter."""

from __future__ import annotations

import ast
import io
import logging
from collections.abc import Iterator
from pathlib import Path

import pytest

from shared.telemetry.logsafe import app_logger, guard_root_handlers

SHARED = Path(__file__).resolve().parents[2] / "shared"
FORGED_ID = "ord-1\r\n04:00:00 ERROR orders forged\x1b[2J\x1b[31m\u2028"


class Kept(logging.Handler):
    """A handler as the host's: the bare message, no formatter of ours."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.messages: list[str] = []
        self.formatted: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())
        self.formatted.append(self.format(record))


@pytest.fixture
def root_handler() -> Iterator[Kept]:
    """On the root, where the worker's handler and the distro's sit."""
    kept = Kept()
    root = logging.getLogger()
    level = root.level
    root.addHandler(kept)
    root.setLevel(logging.DEBUG)
    try:
        yield kept
    finally:
        root.removeHandler(kept)
        root.setLevel(level)


def _one_line(message: str) -> bool:
    return not any(c in message for c in "\r\n\x1b\x0b\x0c\x85\u2028\u2029")


ESCAPED_ID = "ord-1\\x0d\\x0a04:00:00 ERROR orders forged\\x1b[2J\\x1b[31m\\u2028"


@pytest.mark.parametrize("name", ["orders", "orders.intake", "orders.new.child"])
def test_an_id_and_a_reason_in_arguments_stay_on_one_line(root_handler: Kept, name: str) -> None:
    log = app_logger(name)
    log.warning("order %s cancelled: %s (attempt %d)", FORGED_ID, "why\nnot", 3)
    (message,) = root_handler.messages
    assert _one_line(message)
    assert message == (
        "order ord-1\\x0d\\x0a04:00:00 ERROR orders forged\\x1b[2J\\x1b[31m\\u2028"
        " cancelled: why\\x0anot (attempt 3)"
    )


def test_a_lone_surrogate_is_escaped_so_a_utf8_handler_keeps_the_record(
    root_handler: Kept,
) -> None:
    """Text stored before the edge refused lone surrogates (issue 41), logged: a handler
    that encodes UTF-8, as the worker's does, reported a logging error and lost it."""
    written = io.BytesIO()
    stream = io.TextIOWrapper(written, encoding="utf-8", errors="strict")
    strict = logging.StreamHandler(stream)
    logging.getLogger().addHandler(strict)
    try:
        app_logger("orders.scheduler").warning("order %s: %s", "o-1", "cancelled: \ud800x")
    finally:
        logging.getLogger().removeHandler(strict)
    (message,) = root_handler.messages
    assert message == "order o-1: cancelled: \\ud800x"
    stream.flush()
    assert written.getvalue() == b"order o-1: cancelled: \\ud800x\n"


def test_a_message_built_before_logging_is_escaped_too(root_handler: Kept) -> None:
    app_logger("orders.poison").error(f"refused {FORGED_ID}")
    (message,) = root_handler.messages
    assert _one_line(message) and "\\x1b[2J" in message


def test_a_traceback_keeps_its_lines_and_quotes_each_exception_on_one(
    root_handler: Kept,
) -> None:
    """Exception messages often quote an id; a chained one, a note and a group's
    members too."""
    try:
        try:
            raise LookupError(f"no order {FORGED_ID}")
        except LookupError as exc:
            exc.add_note(f"while reading {FORGED_ID}")
            raise ExceptionGroup(f"refused {FORGED_ID}", [ValueError(FORGED_ID)]) from exc
    except ExceptionGroup:
        app_logger("orders.intake").exception("intake failed")
    (text,) = root_handler.formatted
    lines = text.split("\n")
    assert all(_one_line(line) for line in lines)
    assert lines[:2] == ["intake failed", "Traceback (most recent call last):"]
    assert f"LookupError: no order {ESCAPED_ID}" in lines
    assert f"while reading {ESCAPED_ID}" in lines
    assert "The above exception was the direct cause of the following exception:" in lines
    assert f"  | ExceptionGroup: refused {ESCAPED_ID} (1 sub-exception)" in lines
    assert f"    | ValueError: {ESCAPED_ID}" in lines


def test_a_clean_record_keeps_its_template_and_arguments() -> None:
    """The distro keeps a record's template apart from its values; nothing to escape,
    nothing changed."""
    seen: list[logging.LogRecord] = []

    class Grab(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            seen.append(record)

    log = app_logger("orders.clean")
    grab = Grab()
    log.addHandler(grab)
    try:
        log.warning("order %s\tok", "ord-2")
    finally:
        log.removeHandler(grab)
    (record,) = seen
    assert (record.msg, record.args) == ("order %s\tok", ("ord-2",))


def test_a_bad_format_is_left_for_logging_to_report() -> None:
    record = logging.LogRecord("orders", logging.INFO, __file__, 1, "%d", ("x",), None)
    assert app_logger("orders").filter(record)
    assert (record.msg, record.args) == ("%d", ("x",))


def test_only_the_apps_namespace() -> None:
    with pytest.raises(ValueError, match="namespace"):
        app_logger("azure.core")


def test_every_logger_of_the_app_is_an_app_logger() -> None:
    """A plain `logging.getLogger` in shared/ would log unescaped in Azure."""
    plain = []
    for path in SHARED.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr == "getLogger"
                and path.name != "logsafe.py"
            ):
                plain.append(f"{path.relative_to(SHARED)}:{node.lineno}")
    assert plain == []


def test_an_sdk_loggers_record_is_escaped_at_the_root_handlers(root_handler: Kept) -> None:
    """The Azure SDKs log on their own loggers, which carry no filter of ours; in Azure
    the worker's handler on the root takes their records as they are."""
    guard_root_handlers()
    logging.getLogger("azure.core.pipeline").warning("request to %s failed", FORGED_ID)
    (message,) = root_handler.messages
    assert message == f"request to {ESCAPED_ID} failed"
