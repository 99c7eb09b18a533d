"""Reading what the system did: the state table, the effect ledger, the alerts queue,
the simulator's and broker's counters. Read-only, except that alerts are received."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterable
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta

from azure.servicebus.aio import ServiceBusClient

from chaos.model import Alert, Effect, Heard
from devhost.harness.clients import SimulatorControl
from shared.adapters.table import rows
from shared.adapters.table.client import table_service_client
from shared.adapters.table.store import TableStateStore
from shared.contract import Queue
from shared.domain.model import OrderProcess, ProcessState, StateRecord
from shared.domain.rest_index import REST_STATES, RestRange

PAGE_SIZE = 1000


IN_FLIGHT_FILTER = "RowKey eq @row and ({})".format(
    " or ".join(f"ProcessState eq '{s.value}'" for s in ProcessState if not s.is_at_rest)
)
IN_FLIGHT_COLUMNS = ["OrderID", "ProcessState", "LockedBy", "FailureCount", "CancelRequested"]


@dataclass(frozen=True)
class InFlight:
    order_id: str
    process_state: ProcessState
    locked_by: str | None
    failure_count: int
    cancel_requested: bool = False


class StoreReader:
    """The product's own Table adapter, pointed at the run's table."""

    def __init__(self, connection_string: str, table: str) -> None:
        self._service = table_service_client(connection_string=connection_string)
        self.store = TableStateStore(self._service, table)
        self._table = self._service.get_table_client(table)

    async def close(self) -> None:
        await self._table.close()
        await self.store.close()

    async def in_flight(self) -> list[InFlight]:
        """The state rows of unfinished orders, only the columns the monitor needs: a
        lighter query than `states()` for watching the run every second or two."""
        return [
            InFlight(
                e["OrderID"],
                ProcessState(e["ProcessState"]),
                e.get("LockedBy"),
                int(e.get("FailureCount", 0)),
                bool(e.get("CancelRequested", False)),
            )
            async for e in self._table.query_entities(
                IN_FLIGHT_FILTER, parameters={"row": rows.STATE_ROW}, select=IN_FLIGHT_COLUMNS
            )
        ]

    async def states(self) -> list[StateRecord]:
        """Every order's state row, page by page."""
        found: list[StateRecord] = []
        continuation: str | None = None
        while True:
            page = await self.store.list_by_state(None, PAGE_SIZE, continuation)
            found.extend(page.items)
            continuation = page.continuation
            if continuation is None:
                return found

    async def rest_index(self) -> dict[str, tuple[ProcessState, ...]]:
        """Every rest entry, by order: one range read per rest state and page."""
        filed: dict[str, list[ProcessState]] = {}
        for state in REST_STATES:
            continuation: str | None = None
            while True:
                page = await self.store.rest_entries(RestRange(state), PAGE_SIZE, continuation)
                for entry in page.items:
                    filed.setdefault(entry.order_id, []).append(state)
                continuation = page.continuation
                if continuation is None:
                    break
        return {order_id: tuple(states) for order_id, states in filed.items()}

    async def watched(self) -> int:
        """Orders still on the Supervisor's watch list (their outbox may be unsent)."""
        later = datetime.now(UTC) + timedelta(days=1)
        return len(await self.store.due(later, 100_000))

    async def processes(
        self, order_ids: Iterable[str], concurrency: int = 16
    ) -> dict[str, OrderProcess]:
        gate = asyncio.Semaphore(concurrency)
        found: dict[str, OrderProcess] = {}

        async def one(order_id: str) -> None:
            async with gate:
                process = await self.store.load(order_id)
                if process is not None:
                    history = await self.store.history(order_id)
                    found[order_id] = replace(process, history=history)

        await asyncio.gather(*(one(order_id) for order_id in order_ids))
        return found


async def effects(simulator: SimulatorControl) -> tuple[Effect, ...]:
    return tuple(Effect.from_json(e) for e in await simulator.effects())


async def drain_statuses(connection_string: str, max_wait: float = 2.0) -> list[Heard]:
    """Receive (and complete) everything on order-status: what the clients heard."""
    heard: list[Heard] = []
    empty = 0
    async with (
        ServiceBusClient.from_connection_string(connection_string) as client,
        client.get_queue_receiver(Queue.ORDER_STATUS, max_wait_time=max_wait) as receiver,
    ):
        while empty < 2:
            batch = await receiver.receive_messages(max_message_count=100, max_wait_time=max_wait)
            empty = 0 if batch else empty + 1
            for message in batch:
                body = json.loads(b"".join(message.body))
                order_id, status = str(body.get("orderId", "")), str(body.get("status", ""))
                heard.append(Heard(order_id, status, str(message.message_id)))
                await receiver.complete_message(message)
    return heard


async def drain_alerts(connection_string: str, max_wait: float = 2.0) -> list[Alert]:
    """Receive (and complete) everything on operator-alerts with the SDK."""
    alerts: list[Alert] = []
    empty = 0
    async with (
        ServiceBusClient.from_connection_string(connection_string) as client,
        client.get_queue_receiver(Queue.OPERATOR_ALERTS, max_wait_time=max_wait) as receiver,
    ):
        while empty < 2:
            batch = await receiver.receive_messages(max_message_count=100, max_wait_time=max_wait)
            empty = 0 if batch else empty + 1
            for message in batch:
                alerts.append(Alert.from_json(json.loads(b"".join(message.body))))
                await receiver.complete_message(message)
    return alerts
