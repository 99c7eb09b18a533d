"""An upsert after a pause does not meet a connection the emulator is closing.

Azurite (node) closes a connection idle for 5 s; a MERGE sent on it as it closes fails
"Server disconnected", and azure-core does not retry a MERGE. The proxy here makes that
race certain: it drops a connection, unanswered, when a request arrives on it after
`SERVER_IDLE` seconds of silence. The app's client must have let such a connection go
already (`EMULATOR_KEEPALIVE`), with room for a loaded machine that stalls between taking
a pooled connection and the request reaching the server (`STALL`).
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator

import pytest
from azure.data.tables import UpdateMode

from devhost.harness.ports import LOOPBACK
from shared.adapters.table.client import EMULATOR_KEEPALIVE, table_service_client
from shared.settings import azurite_connection_string

pytestmark = pytest.mark.azurite

SERVER_IDLE = 5.0
"""Node's keep-alive, Azurite's default (`--tableKeepAliveTimeout`)."""
STALL = 2.5
"""Seconds a request may take from the pool to the server on a starved 2-core machine
(a runtime, the broker, Azurite and a test run beside each other)."""


class ClosingProxy:
    """Pipes bytes to Azurite; a connection silent for SERVER_IDLE is closed when the
    next request arrives on it, before Azurite sees the request."""

    def __init__(self, upstream_port: int, stall: float = 0.0) -> None:
        self.upstream_port = upstream_port
        self.stall = stall
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
                await asyncio.sleep(self.stall)
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


@contextlib.asynccontextmanager
async def proxy(upstream: int, stall: float = 0.0) -> AsyncIterator[tuple[ClosingProxy, int]]:
    closing = ClosingProxy(upstream, stall)
    server = await asyncio.start_server(closing.handle, LOOPBACK, 0)
    port = int(server.sockets[0].getsockname()[1])
    async with server:
        yield closing, port


@pytest.mark.parametrize(
    ("pause", "stall"),
    [(SERVER_IDLE + 0.2, 0.0), (EMULATOR_KEEPALIVE - 0.2, STALL)],
    ids=["pause past the server's keep-alive", "reused just in time, then stalled"],
)
async def test_an_upsert_after_a_pause_does_not_meet_a_closing_connection(
    azurite_table_port: int, pause: float, stall: float
) -> None:
    async with proxy(azurite_table_port, stall) as (closing, port):
        await upsert_after(closing, port, pause)


async def upsert_after(closing: ClosingProxy, port: int, pause: float) -> None:
    service = table_service_client(connection_string=azurite_connection_string(port))
    table = service.get_table_client(f"k{uuid.uuid4().hex[:16]}")
    try:
        await table.create_table()
        entity = {"PartitionKey": "o-1", "RowKey": "state", "Step": 1}
        await table.upsert_entity(entity, mode=UpdateMode.MERGE)
        await asyncio.sleep(pause)  # the scenario: the connection sits idle this long
        await table.upsert_entity({**entity, "Step": 2}, mode=UpdateMode.MERGE)
        assert (await table.get_entity("o-1", "state"))["Step"] == 2
        assert closing.dropped == 0
    finally:
        await table.delete_table()
        await table.close()
        await service.close()
