"""An upsert after a pause does not meet a connection the emulator is closing.

Azurite (node) closes a connection idle for 5 s; a MERGE sent on it as it closes fails
"Server disconnected", and azure-core does not retry a MERGE. The proxy here makes that
race certain: it drops a connection, unanswered, when a request arrives on it after
`SERVER_IDLE` seconds of silence. The app's client must have let such a connection go
already (`EMULATOR_KEEPALIVE`).
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator

import pytest
from azure.data.tables import UpdateMode

from devhost.harness.ports import LOOPBACK
from shared.adapters.table_client import EMULATOR_KEEPALIVE, table_service_client
from shared.settings import azurite_connection_string

pytestmark = pytest.mark.azurite

SERVER_IDLE = EMULATOR_KEEPALIVE + 0.5
"""Like node's 5 s, above the client's keep-alive."""


class ClosingProxy:
    """Pipes bytes to Azurite; a connection silent for SERVER_IDLE is closed when the
    next request arrives on it, before Azurite sees the request."""

    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self.dropped = 0
        self.connections = 0

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        up_reader, up_writer = await asyncio.open_connection(LOOPBACK, self.upstream_port)
        loop = asyncio.get_running_loop()
        last = [loop.time()]

        async def back() -> None:
            while data := await up_reader.read(65536):
                last[0] = loop.time()
                writer.write(data)
                await writer.drain()

        answering = asyncio.create_task(back())
        try:
            while data := await reader.read(65536):
                if loop.time() - last[0] >= SERVER_IDLE:
                    self.dropped += 1
                    break
                last[0] = loop.time()
                up_writer.write(data)
                await up_writer.drain()
        finally:
            answering.cancel()
            with contextlib.suppress(asyncio.CancelledError, ConnectionError):
                await answering
            for w in (writer, up_writer):
                w.close()


@pytest.fixture
async def proxy(azurite_table_port: int) -> AsyncIterator[tuple[ClosingProxy, int]]:
    closing = ClosingProxy(azurite_table_port)
    server = await asyncio.start_server(closing.handle, LOOPBACK, 0)
    port = int(server.sockets[0].getsockname()[1])
    async with server:
        yield closing, port


async def test_an_upsert_after_a_pause_longer_than_the_servers_keepalive_lands(
    proxy: tuple[ClosingProxy, int],
) -> None:
    closing, port = proxy
    service = table_service_client(connection_string=azurite_connection_string(port))
    table = service.get_table_client(f"k{uuid.uuid4().hex[:16]}")
    try:
        await table.create_table()
        entity = {"PartitionKey": "o-1", "RowKey": "state", "Step": 1}
        await table.upsert_entity(entity, mode=UpdateMode.MERGE)
        await asyncio.sleep(SERVER_IDLE + 0.2)
        await table.upsert_entity({**entity, "Step": 2}, mode=UpdateMode.MERGE)
        assert (await table.get_entity("o-1", "state"))["Step"] == 2
        assert closing.connections >= 2  # the pause ended on a fresh connection
        assert closing.dropped == 0
    finally:
        await table.delete_table()
        await table.close()
        await service.close()
