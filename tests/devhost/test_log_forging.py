"""A client cannot forge log lines or drive the operator's terminal through what it sends
(issue 27, item 3): the runtime's own log format writes control characters as escapes."""

from __future__ import annotations

import io

import aiohttp
import pytest

from devhost.host import LocalHost
from shared.telemetry.logsafe import escape_controls
from tests.devhost.conftest import HostFactory, Recorder, build_app

pytestmark = pytest.mark.e2e

FORGED = "/x%1B%5B2J%1B%5B31mFORGED%0D04:00:00%20ERROR%20forged-line%09tab"


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
