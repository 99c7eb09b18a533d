"""Azurite as `python -m devhost` runs it (data on disk, the durable preload) keeps every
table write it answered across a `kill -9`: single writes and transactions, those of the
last moment before the kill and those before and after an autosave, a table created just
before it; a refused transaction leaves nothing; the journal left by the kill is replayed
and then removed."""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest
from azure.data.tables import TableTransactionError
from azure.data.tables.aio import TableServiceClient

from devhost.harness.ports import free_port
from devhost.harness.process import Child
from devhost.harness.services import (
    AZURITE_CLOSED,
    AZURITE_DURABLE,
    azurite_command,
    azurite_env,
)
from devhost.services import plan
from shared.contract import Setting
from shared.settings import azurite_connection_string
from tests.waiting import eventually

pytestmark = pytest.mark.azurite

TABLE = "durable"
AUTOSAVE = 5
"""Seconds between Azurite's own saves of its table database."""


class DurableAzurite:
    def __init__(self, workdir: Path) -> None:
        self.port = free_port()
        self.workdir = workdir
        self.location = workdir / "data"
        self.child: Child | None = None

    def start(self) -> None:
        self.child = Child(
            "azurite",
            azurite_command(table_port=self.port, location=self.location),
            self.workdir / "azurite.log",
            env=azurite_env(location=self.location),
            cwd=self.workdir,
            closed_marker=AZURITE_CLOSED,
        ).start()
        self.child.wait_ready(ports=[self.port], timeout=60)

    def kill9(self) -> None:
        assert self.child is not None and self.child.process is not None
        os.killpg(self.child.pid, signal.SIGKILL)
        self.child.process.wait()
        self.child = None

    def stop(self) -> None:
        if self.child is not None:
            self.child.stop()
            self.child = None

    def journal(self) -> set[Path]:
        """The journal files on disk: writes answered since the last save."""
        return set(self.location.glob("*.journal.*"))

    def client(self) -> TableServiceClient:
        return TableServiceClient.from_connection_string(azurite_connection_string(self.port))


@pytest.fixture
def azurite(tmp_path: Path) -> Iterator[DurableAzurite]:
    running = DurableAzurite(tmp_path)
    running.start()
    try:
        yield running
    finally:
        running.stop()


def test_devhost_runs_azurite_on_disk_with_the_preload(tmp_path: Path) -> None:
    settings = {Setting.STORAGE: "UseDevelopmentStorage=true"}
    (spec,) = [s for s in plan(settings, tmp_path, tmp_path / "state") if s.name == "azurite"]
    assert "--location" in spec.command
    assert spec.env["NODE_OPTIONS"] == f'--require "{AZURITE_DURABLE}"'
    assert azurite_env(location=None) == {}


async def test_every_answered_write_survives_kill_9(azurite: DurableAzurite) -> None:
    async with azurite.client() as service:
        table = await service.create_table(TABLE)
        async with table:

            async def write(i: int) -> None:
                row = {"PartitionKey": f"p{i % 4}", "RowKey": f"{i:04d}", "n": i}
                await table.create_entity(row)
                await table.update_entity({**row, "n": i + 1000})

            await asyncio.gather(*(write(i) for i in range(200)))
            await table.submit_transaction(
                [("create", {"PartitionKey": "tx", "RowKey": f"{i}"}) for i in range(10)]
            )
            await table.delete_entity("p0", "0000")
    azurite.kill9()
    azurite.start()
    async with azurite.client() as service, service.get_table_client(TABLE) as table:
        rows = [e async for e in table.list_entities()]
    plain = {e["RowKey"]: e["n"] for e in rows if e["PartitionKey"] != "tx"}
    assert len(plain) == 199 and "0000" not in plain
    assert all(n == int(key) + 1000 for key, n in plain.items())
    assert sum(e["PartitionKey"] == "tx" for e in rows) == 10


async def test_writes_on_both_sides_of_an_autosave_and_a_refused_transaction(
    azurite: DurableAzurite,
) -> None:
    async with azurite.client() as service:
        table = await service.create_table(TABLE)
        async with table:
            for i in range(20):
                await table.create_entity({"PartitionKey": "before", "RowKey": f"{i}"})
            # The autosave: once a save covering them is on disk, the preload removes the
            # journal files that hold these writes.
            journal = azurite.journal()
            assert journal, "the writes went to no journal"
            await eventually("an autosave", lambda: not journal & azurite.journal(), 6 * AUTOSAVE)
            # Azurite (node) closes a connection idle for 5 s, and the SDK does not retry an
            # upsert (MERGE) sent on it as it closes ("Server disconnected"): a read, which
            # it retries, takes a fresh connection first.
            await table.get_entity("before", "0")
            for i in range(20):
                await table.upsert_entity({"PartitionKey": "before", "RowKey": f"{i}", "n": 2})
                await table.create_entity({"PartitionKey": "after", "RowKey": f"{i}"})
            with pytest.raises(TableTransactionError):
                await table.submit_transaction(
                    [
                        ("create", {"PartitionKey": "before", "RowKey": "new"}),
                        ("create", {"PartitionKey": "before", "RowKey": "0"}),
                    ]
                )
    azurite.kill9()
    left = azurite.journal()
    assert left, "the kill left no journal to replay"
    azurite.start()
    async with azurite.client() as service, service.get_table_client(TABLE) as table:
        rows = [e async for e in table.list_entities()]
    before = {e["RowKey"]: e.get("n") for e in rows if e["PartitionKey"] == "before"}
    assert before == {f"{i}": 2 for i in range(20)}
    assert sum(e["PartitionKey"] == "after" for e in rows) == 20
    assert not left & azurite.journal(), "replayed, saved, removed"
