"""`workflows check --against` on real Azurite: a catalogue that drops a version with
orders in flight is refused, naming the version and how many orders run on it."""

from __future__ import annotations

import copy
import io
import json
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from azure.data.tables.aio import TableServiceClient

from shared.adapters.clock import FakeClock
from shared.adapters.table.store import TableStateStore
from shared.catalogue import DEFAULT_FILE
from shared.cli.app import run
from shared.domain.machine import forward
from shared.settings import azurite_connection_string
from shared.usecases.operations.workflow_versions import versions_in_flight
from tests.builders import an_order
from tests.workflows import EXPRESS_DELIVERY, ORDER_FULFILMENT

pytestmark = pytest.mark.azurite


@pytest.fixture
async def store(azurite_table_port: int) -> AsyncIterator[tuple[TableStateStore, str, str]]:
    connection = azurite_connection_string(azurite_table_port)
    name = f"t{uuid.uuid4().hex[:20]}"
    table = TableStateStore(TableServiceClient.from_connection_string(connection), name)
    await table.ensure_table()
    try:
        yield table, connection, name
    finally:
        await table.close()


async def start(table: TableStateStore, order_id: str, *, express: bool = False) -> None:
    workflow = EXPRESS_DELIVERY if express else ORDER_FULFILMENT
    now = FakeClock().now()
    started = forward.start(an_order(order_id), workflow, now)
    await table.create(started.process, started.history)


def without_express(tmp_path: Path) -> Path:
    raw = json.loads(DEFAULT_FILE.read_text(encoding="utf-8"))
    trimmed = copy.deepcopy(raw)
    trimmed["workflows"] = [w for w in raw["workflows"] if w["name"] != "express-delivery"]
    path = tmp_path / "catalogue.json"
    path.write_text(json.dumps(trimmed), encoding="utf-8")
    return path


async def cli(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = await run(list(argv), out=out, err=err, env={})
    return code, out.getvalue(), err.getvalue()


async def test_versions_in_flight_are_read_with_their_orders(
    store: tuple[TableStateStore, str, str],
) -> None:
    table, _, _ = store
    await start(table, "a-1")
    await start(table, "a-2", express=True)
    await start(table, "a-3", express=True)
    found = await versions_in_flight(table)
    assert sorted(found[("express-delivery", 1)]) == ["a-2", "a-3"]
    assert found[("order-fulfilment", 1)] == ["a-1"]


async def test_a_catalogue_that_drops_a_version_in_flight_is_refused(
    store: tuple[TableStateStore, str, str], tmp_path: Path
) -> None:
    table, connection, name = store
    await start(table, "b-1", express=True)
    await start(table, "b-2")
    code, out, _ = await cli(
        "workflows",
        "check",
        "--file",
        str(without_express(tmp_path)),
        "--against",
        connection,
        "--table",
        name,
    )
    assert code == 1
    assert "drops express-delivery v1, which 1 order(s) in flight still run on (e.g. b-1)" in out


async def test_a_catalogue_that_keeps_every_version_in_flight_passes(
    store: tuple[TableStateStore, str, str], tmp_path: Path
) -> None:
    table, connection, name = store
    await start(table, "c-1")
    code, out, _ = await cli(
        "workflows",
        "check",
        "--file",
        str(without_express(tmp_path)),
        "--against",
        connection,
        "--table",
        name,
        "--json",
    )
    assert code == 0, out
    assert json.loads(out)["inFlight"] == {"order-fulfilment v1": 1}


async def test_an_invalid_catalogue_fails_with_the_rule(tmp_path: Path) -> None:
    path = tmp_path / "broken.json"
    raw = json.loads(DEFAULT_FILE.read_text(encoding="utf-8"))
    raw["workflows"][0]["steps"][0]["agent"] = "nobody"
    path.write_text(json.dumps(raw), encoding="utf-8")
    code, _, err = await cli("workflows", "check", "--file", str(path))
    assert code == 1
    assert "broken.json: workflow order-fulfilment v1: step reserve-inventory" in err
    assert "[rule: unknown-agent]" in err
