"""Requests aiohttp cannot parse, and a path no pattern matched, are client errors
(issue 27, item 4): a problem+json answer, one warning without a traceback, and a log a
client cannot flood by repeating them. The runtime's front door, and the local stack's
other servers: the simulator, the broker's control API and the trace receiver."""

from __future__ import annotations

import asyncio
import io
import json
import logging
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp import web
from yarl import URL

from devhost.broker import Broker
from devhost.host import LocalHost
from devhost.malformed import RateLimitedLog
from devhost.otlp.app import make_runner
from devhost.otlp.store import SpanStore
from devhost.simulator.server import SimulatorServer
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


def not_gzip(request_line: str) -> bytes:
    """A request whose body says it is gzip and is not: aiohttp finds out only when a
    handler reads the body, or when it drains the body after the answer."""
    body = b'{"not": "gzip"}'
    return (
        f"{request_line} HTTP/1.1\r\n".encode()
        + HOST
        + b"Content-Type: application/json\r\nContent-Encoding: gzip\r\n"
        + f"Content-Length: {len(body)}\r\n\r\n".encode()
        + body
    )


async def exchange(base_url: str, raw: bytes) -> tuple[int, dict[str, str], bytes]:
    """Send bytes no HTTP client would, and read the answer up to the closed connection."""
    url = URL(base_url)
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
    document = assert_problem(await exchange(started.api_url, MALFORMED[case]), 400)
    assert "bbbb" not in document["detail"] and "aaaa" not in document["detail"]
    logged = console.getvalue()
    assert "Traceback" not in logged and " ERROR " not in logged
    (line,) = [line for line in logged.splitlines() if "malformed request" in line]
    assert " WARNING " in line and document["detail"] in line


async def test_a_newline_in_the_path_reaches_the_runtime_404(
    started: LocalHost, console: io.StringIO
) -> None:
    raw = b"GET /api/items%0Amore/x HTTP/1.1\r\n" + HOST + b"Connection: close\r\n\r\n"
    document = assert_problem(await exchange(started.api_url, raw), 404)
    assert document["detail"] == "no function serves /api/items\nmore/x"
    (line,) = [line for line in console.getvalue().splitlines() if "devhost.http" in line]
    assert " INFO " in line and "/api/items\\x0amore/x -> 404" in line


@pytest.mark.parametrize(
    "value", [b"a\xed\xa0\x80b", b"\xff", b"ops-\xc3"], ids=["CESU-8 surrogate", "xff", "cut"]
)
async def test_a_header_that_is_not_utf8_is_a_400_before_any_function(
    started: LocalHost, value: bytes
) -> None:
    """aiohttp would hand the function lone surrogates (surrogateescape), which the
    Functions host never does (issue 41)."""
    raw = GET + HOST + b"X-Test: " + value + b"\r\nConnection: close\r\n\r\n"
    document = assert_problem(await exchange(started.api_url, raw), 400)
    assert document["detail"] == "the value of header 'X-Test' is not UTF-8 text"


async def test_a_utf8_header_still_reaches_the_function(started: LocalHost) -> None:
    raw = GET + HOST + "X-Test: Zoë 😀\r\nConnection: close\r\n\r\n".encode()
    status, _, body = await exchange(started.api_url, raw)
    assert status == 200
    assert json.loads(body)["header"] == "Zoë 😀"


async def test_a_body_that_is_not_what_its_encoding_says_is_a_client_error(
    started: LocalHost, console: io.StringIO
) -> None:
    answer = await exchange(started.api_url, not_gzip("POST /api/items"))
    document = assert_problem(answer, 400)
    assert document["detail"] == "the body cannot be decoded as its Content-Encoding says"
    logged = console.getvalue()
    assert "Traceback" not in logged and " ERROR " not in logged
    (line,) = [line for line in logged.splitlines() if "malformed request" in line]
    assert " WARNING " in line and document["detail"] in line


async def test_a_thousand_malformed_requests_leave_a_bounded_log(
    started: LocalHost, console: io.StringIO
) -> None:
    kinds = list(MALFORMED.values())
    began = time.monotonic()
    for batch in range(100):
        answers = await asyncio.gather(
            *(exchange(started.api_url, kinds[i % 5]) for i in range(10))
        )
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


SERVERS = {
    # server: a path it serves to GET only, a request whose handler reads the body
    "simulator": ("/_sim/health", "PUT /_sim/faults/payment"),
    "broker control API": ("/_broker/stats", "PUT /_broker/faults"),
    "trace receiver": ("/api/traces", "POST /v1/traces"),
}


@pytest.fixture(params=SERVERS)
async def other_server(
    request: pytest.FixtureRequest,
) -> AsyncIterator[tuple[str, tuple[str, str]]]:
    """The server's base URL, started as its ``python -m`` main starts it, and its
    requests of `SERVERS`."""
    get_only = SERVERS[request.param]
    if request.param == "simulator":
        with SimulatorServer() as simulator:
            yield simulator.url, get_only
    elif request.param == "broker control API":
        broker = Broker().start()
        try:
            yield f"http://{broker.host}:{broker.control_port}", get_only
        finally:
            broker.stop()
    else:
        store = SpanStore(None)
        runner = make_runner(store)
        await runner.setup()
        try:
            await web.TCPSite(runner, "127.0.0.1", 0).start()
            yield f"http://127.0.0.1:{runner.addresses[0][1]}", get_only
        finally:
            await runner.cleanup()
            store.close()


@pytest.mark.parametrize("case", MALFORMED)
async def test_the_other_servers_answer_a_malformed_request_with_a_problem_and_one_warning(
    other_server: tuple[str, tuple[str, str]], console: io.StringIO, case: str
) -> None:
    base_url, _ = other_server
    document = assert_problem(await exchange(base_url, MALFORMED[case]), 400)
    logged = console.getvalue()
    assert "Traceback" not in logged and " ERROR " not in logged
    (line,) = [line for line in logged.splitlines() if "malformed request" in line]
    assert " WARNING " in line and document["detail"] in line


async def test_the_other_servers_answer_what_no_route_takes_with_a_problem(
    other_server: tuple[str, tuple[str, str]], console: io.StringIO
) -> None:
    """A path with a newline in it, and a method the path is not served to."""
    base_url, (get_only, _) = other_server
    close = HOST + b"Connection: close\r\n\r\n"
    assert_problem(await exchange(base_url, b"GET /no%0Asuch/path HTTP/1.1\r\n" + close), 404)
    answer = await exchange(base_url, f"PATCH {get_only} HTTP/1.1\r\n".encode() + close)
    assert_problem(answer, 405)
    assert "GET" in answer[1]["allow"]
    assert "Traceback" not in console.getvalue()


@pytest.mark.parametrize("read", [True, False], ids=["read", "never read"])
async def test_the_other_servers_answer_a_body_they_cannot_decode_with_a_problem(
    other_server: tuple[str, tuple[str, str]], console: io.StringIO, read: bool
) -> None:
    """Read by the handler: a 400 problem. Never read (a GET): the handler's own answer,
    aiohttp finds out draining the body after it. One warning either way."""
    base_url, (get_only, reads_body) = other_server
    answer = await exchange(base_url, not_gzip(reads_body if read else f"GET {get_only}"))
    if read:
        assert_problem(answer, 400)
    else:
        assert answer[0] == 200
    logged = console.getvalue()
    assert "Traceback" not in logged and " ERROR " not in logged
    (line,) = [line for line in logged.splitlines() if "malformed request" in line]
    assert " WARNING " in line and "Content-Encoding" in line
