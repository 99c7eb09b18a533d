"""A client cannot forge log lines or drive the operator's terminal through what it sends
(issue 27, item 3): the runtime's own log format writes control characters as escapes,
in every record's message and in the exception messages its traceback quotes, whoever
logged it."""

from __future__ import annotations

import io
import logging
import re

import aiohttp
import pytest

from devhost.host import LocalHost
from shared.telemetry.logsafe import app_logger, escape_controls
from tests.devhost.conftest import HostFactory, Recorder, build_app

pytestmark = pytest.mark.e2e

FORGED = "/x%1B%5B2J%1B%5B31mFORGED%0D04:00:00%20ERROR%20forged-line%09tab"
FORGED_ID = "ord\x1b[2J\x1b[31mFORGED\r\n04:00:00 ERROR forged-line\x00"
ESCAPED_ID = "ord\\x1b[2J\\x1b[31mFORGED\\x0d\\x0a04:00:00 ERROR forged-line\\x00"
# What a terminal or a line-reading tool acts on; `str.splitlines` breaks on all of these.
RAW_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u2028\u2029]")


def assert_forged_text_is_one_escaped_line(logged: str, prefix: str) -> str:
    assert RAW_CONTROL.search(logged) is None
    lines = logged.splitlines()
    assert not any(line.startswith("04:00:00") for line in lines)
    (line,) = [line for line in lines if prefix in line]
    assert ESCAPED_ID in line
    return line


async def test_a_forging_path_is_logged_on_one_line_with_visible_escapes(
    make_host: HostFactory, console: io.StringIO
) -> None:
    host: LocalHost = make_host(build_app(Recorder(), timer=False, servicebus=False), {})
    await host.start()
    async with aiohttp.ClientSession() as session:
        url = f"{host.api_url}/items{FORGED}"
        async with session.get(url) as response:
            await response.read()
    logged = [line for line in console.getvalue().splitlines() if "devhost.http" in line]
    (line,) = [line for line in logged if "FORGED" in line]
    assert "\x1b" not in console.getvalue() and "\r" not in console.getvalue()
    assert "\\x1b[2J\\x1b[31mFORGED\\x0d04:00:00 ERROR forged-line\ttab" in line


def test_escapes_keep_tabs_and_name_every_other_control() -> None:
    assert escape_controls("a\tb\x00c\x7fd\x85e\u2028f") == "a\tb\\x00c\\x7fd\\x85e\\u2028f"
    assert escape_controls("plain: ordinary ü") == "plain: ordinary ü"


async def test_an_exception_quoting_a_forging_id_leaves_one_escaped_line_in_its_traceback(
    make_host: HostFactory, console: io.StringIO
) -> None:
    host: LocalHost = make_host(build_app(Recorder(), timer=False, servicebus=False), {})
    await host.start()
    path = "/broken/ord%1B%5B2J%1B%5B31mFORGED%0D%0A04:00:00%20ERROR%20forged-line%00"
    async with aiohttp.ClientSession() as session, session.get(host.api_url + path) as answer:
        assert answer.status == 500
    logged = console.getvalue()
    assert "Traceback (most recent call last):" in logged
    line = assert_forged_text_is_one_escaped_line(logged, "RuntimeError:")
    assert line == f"RuntimeError: deliberately broken {ESCAPED_ID}"


def test_third_party_records_and_their_tracebacks_are_escaped(console: io.StringIO) -> None:
    """aiohttp's and the Azure SDKs' loggers do not go through `app_logger`."""
    logging.getLogger("azure.servicebus.test").warning("lock lost on %s", FORGED_ID)
    assert_forged_text_is_one_escaped_line(console.getvalue(), "lock lost on")
    try:
        raise ValueError(f"bad id {FORGED_ID}")
    except ValueError:
        logging.getLogger("aiohttp.server").exception("Error handling request")
    assert_forged_text_is_one_escaped_line(console.getvalue(), "ValueError: bad id")


def test_what_the_apps_loggers_escaped_is_not_escaped_again(console: io.StringIO) -> None:
    try:
        raise LookupError(f"no order {FORGED_ID}")
    except LookupError:
        app_logger("orders.test").exception("order %s not found", FORGED_ID)
    logged = console.getvalue()
    assert_forged_text_is_one_escaped_line(logged, "orders.test order ord")
    assert_forged_text_is_one_escaped_line(logged, "LookupError: no order")
    assert "\\\\x" not in logged


def test_a_traceback_another_handler_formatted_first_is_still_escaped(
    console: io.StringIO,
) -> None:
    """`logging.Formatter` keeps the traceback it formats on the record, for the next
    handler to reuse; a plain handler before ours must not hand us its raw text."""
    raw = io.StringIO()
    plain = logging.StreamHandler(raw)
    root = logging.getLogger()
    root.handlers.insert(0, plain)
    try:
        try:
            raise ValueError(f"bad id {FORGED_ID}")
        except ValueError:
            logging.getLogger("azure.core.test").exception("call failed")
    finally:
        root.removeHandler(plain)
    assert "\r\n04:00:00" in raw.getvalue()
    assert_forged_text_is_one_escaped_line(console.getvalue(), "ValueError: bad id")
