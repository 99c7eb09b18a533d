"""The Table client the adapters share sends what the SDK's full pipeline sends (signed,
conditional, with a request id) and retries a 503 once within its budget, against a
recording stand-in for the table service."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from aiohttp import web
from azure.core import MatchConditions
from azure.core.exceptions import HttpResponseError
from azure.data.tables import UpdateMode

from devhost.harness.ports import LOOPBACK
from shared.adapters.table.client import table_service_client
from shared.settings import azurite_connection_string

ENTITY = {"PartitionKey": "o-1", "RowKey": "state", "Status": "Processing"}
ETAG = "W/\"datetime'2026-11-26T16%3A00%3A00.0000000Z'\""


class Recorder:
    def __init__(self, unavailable: int) -> None:
        self.unavailable = unavailable
        self.requests: list[tuple[str, str, dict[str, str]]] = []

    async def handle(self, request: web.Request) -> web.Response:
        self.requests.append((request.method, request.path, dict(request.headers)))
        if len(self.requests) <= self.unavailable:
            return web.Response(status=503)
        return web.Response(status=204, headers={"ETag": ETAG, "x-ms-version": "2019-02-02"})


async def serve(recorder: Recorder) -> AsyncIterator[str]:
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", recorder.handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, LOOPBACK, 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield azurite_connection_string(port)
    finally:
        await runner.cleanup()


@pytest.fixture
async def once_unavailable() -> AsyncIterator[tuple[Recorder, str]]:
    recorder = Recorder(unavailable=1)
    async for connection in serve(recorder):
        yield recorder, connection


@pytest.fixture
async def twice_unavailable() -> AsyncIterator[tuple[Recorder, str]]:
    recorder = Recorder(unavailable=2)
    async for connection in serve(recorder):
        yield recorder, connection


async def replace(connection: str) -> None:
    async with table_service_client(connection_string=connection) as service:
        table = service.get_table_client("Orders")
        await table.update_entity(
            ENTITY,
            mode=UpdateMode.REPLACE,
            etag=ETAG,
            match_condition=MatchConditions.IfNotModified,
        )


async def test_a_conditional_replace_is_signed_and_retried_once_after_a_503(
    once_unavailable: tuple[Recorder, str],
) -> None:
    recorder, connection = once_unavailable
    await replace(connection)
    assert len(recorder.requests) == 2
    for method, path, headers in recorder.requests:
        assert method == "PUT"
        assert path == "/devstoreaccount1/Orders(PartitionKey='o-1',RowKey='state')"
        assert headers["If-Match"] == ETAG
        assert headers["Authorization"].startswith("SharedKey devstoreaccount1:")
        assert headers["x-ms-client-request-id"]
        assert headers["x-ms-date"]
        assert "azsdk-python-data-tables" in headers["User-Agent"]


async def test_a_second_503_is_the_callers_to_handle(
    twice_unavailable: tuple[Recorder, str],
) -> None:
    recorder, connection = twice_unavailable
    with pytest.raises(HttpResponseError) as raised:
        await replace(connection)
    assert raised.value.status_code == 503
    assert len(recorder.requests) == 2
