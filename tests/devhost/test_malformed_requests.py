"""Requests aiohttp cannot parse, and a path no pattern matched, are client errors
(issue 27, item 4): a problem+json answer, one warning without a traceback, and a log a
client cannot flood by repeating them."""

from __future__ import annotations

import asyncio
import io
import json
import logging
import time
from typing import Any

import pytest
from yarl import URL

from devhost.host import LocalHost
from devhost.host.malformed import RateLimitedLog
from tests.devhost.conftest import HostFactory, Recorder, build_app

pytestmark = pytest.mark.e2e

GET = b"GET /api/items/1 HTTP/1.1\r\n"
HOST = b"Host: localhost\r\n"

MALFORMED = {
    "url over 8190 bytes": b"GET /api/items/" + b"a" * 8200 + b" HTTP/1.1\r\n" + HOST + b"\r\n",
    "header over 8190 bytes": GET + HOST + b"X-Big: " + b"b" * 8200 + b"\r\n\r\n",
    "NUL in a header": GET + HOST + b"X-Nul: a\x00b\r\n\r\n",
    "missing Host": GET + b"\r\n",
    "duplicate Host": GET + HOST + HOST + b"\r\n",
}


async def exchange(host: LocalHost, raw: bytes) -> tuple[int, dict[str, str], bytes]:
    """Send bytes no HTTP client would, and read the answer up to the closed connection."""
    url = URL(host.api_url)
    reader, writer = await asyncio.open_connection(url.host, url.port)
    try:
        writer.write(raw)
        await writer.drain()
        async with asyncio.timeout(10):
            answer = await reader.read()
    finally:
        writer.close()
    head, _, body = answer.partition(b"\r\n\r\n")
    status_line, *lines = head.decode("latin-1").split("\r\n")
    headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines)}
    return int(status_line.split()[1]), headers, body


def assert_problem(answer: tuple[int, dict[str, str], bytes], status: int) -> dict[str, Any]:
    got, headers, body = answer
    assert got == status
    assert headers["content-type"].split(";")[0] == "application/problem+json"
    document: dict[str, Any] = json.loads(body)
    assert document["status"] == status and document["title"] and document["detail"]
    return document


@pytest.fixture
async def started(make_host: HostFactory) -> LocalHost:
    host = make_host(build_app(Recorder(), timer=False, servicebus=False), {})
    await host.start()
    return host


@pytest.mark.parametrize("case", MALFORMED)
async def test_a_malformed_request_is_a_problem_and_one_warning(
    started: LocalHost, console: io.StringIO, case: str
) -> None:
    document = assert_problem(await exchange(started, MALFORMED[case]), 400)
    assert "bbbb" not in document["detail"] and "aaaa" not in document["detail"]
    logged = console.getvalue()
    assert "Traceback" not in logged and " ERROR " not in logged
    (line,) = [line for line in logged.splitlines() if "malformed request" in line]
    assert " WARNING " in line and document["detail"] in line


async def test_a_newline_in_the_path_reaches_the_runtime_404(
    started: LocalHost, console: io.StringIO
) -> None:
    raw = b"GET /api/items%0Amore/x HTTP/1.1\r\n" + HOST + b"Connection: close\r\n\r\n"
    document = assert_problem(await exchange(started, raw), 404)
    assert document["detail"] == "no function serves /api/items\nmore/x"
    (line,) = [line for line in console.getvalue().splitlines() if "devhost.http" in line]
    assert " INFO " in line and "/api/items\\x0amore/x -> 404" in line


async def test_a_thousand_malformed_requests_leave_a_bounded_log(
    started: LocalHost, console: io.StringIO
) -> None:
    kinds = list(MALFORMED.values())
    began = time.monotonic()
    for batch in range(100):
        answers = await asyncio.gather(*(exchange(started, kinds[i % 5]) for i in range(10)))
        assert all(status == 400 for status, _, _ in answers), batch
    windows = 1 + int((time.monotonic() - began) // 60)
    lines = console.getvalue().splitlines()
    assert len(lines) <= 10 * windows
    warned = [line for line in lines if "malformed request" in line]
    assert "the next ones within 60 s are counted, not logged" in warned[9]


def test_warnings_over_the_limit_are_counted_and_reported_on_the_next_line(
    caplog: pytest.LogCaptureFixture,
) -> None:
    now = [0.0]
    refusals = RateLimitedLog(logging.getLogger("test.refusals"), limit=3, clock=lambda: now[0])
    with caplog.at_level(logging.WARNING, "test.refusals"):
        for i in range(8):
            refusals.warning("refused %d", i)
        now[0] = 59.9
        refusals.warning("refused late")
        now[0] = 60.0
        refusals.warning("refused again")
    assert caplog.messages == [
        "refused 0",
        "refused 1",
        "refused 2 (the next ones within 60 s are counted, not logged)",
        "refused again (6 more not logged before this one)",
    ]
