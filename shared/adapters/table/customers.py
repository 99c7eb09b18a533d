"""The customer ledger on Azure Table Storage, in the state store's table.

One partition per customer, `~customer:{id}` (no order id starts with `~`), so each
change is one entity-group transaction, exact and atomic:

- RowKey `~load`: `Running` and `Waiting`, the counts the rules read, and `Pace` and
  `LeftAt`, how fast its orders have lately ended (the 429's Retry-After); deleted when
  both counts are zero, so the operator page's query only meets customers with open
  orders.
- RowKey `m:{order id}`: one member row per open order; `Line` is its line key while
  it waits, empty while it runs. Keyed by order id, so a repeated enter or leave finds
  what the first did and changes nothing.
- RowKey `w:{arrival micros}:{order id}`: the line, in arrival order; the head is the
  first row of the range, one query of one row to promote it; `High` is the order's
  lane, for its promotion's nudge.

Every transaction is conditional on the `~load` row's ETag (or creates it), so two
instances changing one customer at once serialise on it; the loser reads again. An
entry takes the order to be new and reads only the load row (a repeat's member row
fails the create, and the entry then reads both): one read and one transaction. Within
one instance a customer's changes take turns on a lock first: a burst of one customer's
orders (64 POSTs at once) would otherwise race on that ETag, each loser paying two more
reads and a failed transaction, until the intake's budget passes and everyone gets 503.
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from typing import Any, Final

from azure.core import MatchConditions
from azure.core.exceptions import ResourceNotFoundError
from azure.data.tables import TableTransactionError, UpdateMode
from azure.data.tables.aio import TableClient, TableServiceClient

from shared.adapters.table.errors import refused_with, translated_errors
from shared.adapters.table.rows import url_text
from shared.domain.fairness import (
    Admission,
    CustomerLoad,
    CustomerPolicy,
    Promoted,
    admit,
    promotes,
)
from shared.ports import ConcurrencyConflict, Entered

PARTITION_PREFIX: Final = "~customer:"
LOAD_KEY: Final = "~load"
_EPOCH: Final = datetime(1970, 1, 1, tzinfo=UTC)
_RACES: Final = 20
"""Lost races on one customer's load row before a change gives up: a burst of one
customer's orders on many instances serialises on that row."""
_FORBIDDEN_IN_KEYS: Final = str.maketrans({c: "_" for c in "/\\#?\t\n\r"})


def partition(customer: str) -> str:
    """A lone surrogate, in an order stored before the edge refused them (issue 41),
    is spelled as its escape: a key goes into the request's URL."""
    return PARTITION_PREFIX + url_text(customer).translate(_FORBIDDEN_IN_KEYS)


def _member_key(order_id: str) -> str:
    return f"m:{order_id}"


def _line_key(at: datetime, order_id: str) -> str:
    return f"w:{(at - _EPOCH) // timedelta(microseconds=1):020d}:{order_id}"


class _Turn:
    """One customer's changes on this instance, one at a time, and its load row as the
    last of them left it. That copy is exact while its ETag holds, so the next entry of
    a burst writes on it without reading first; a change from another instance fails
    that transaction, and the entry reads again. Kept only while someone waits its turn
    (weakly held): a burst is where it pays."""

    def __init__(self) -> None:
        self.lock = asyncio.Lock()
        self.known: tuple[CustomerLoad, str | None] | None = None


@dataclass
class _Read:
    load: CustomerLoad
    load_etag: str | None
    member: Any


class TableCustomerLedger:
    """Shares the state store's TableServiceClient (and so its table)."""

    def __init__(self, service: TableServiceClient, table_name: str) -> None:
        self._table: TableClient = service.get_table_client(table_name)
        self._turns: weakref.WeakValueDictionary[str, _Turn] = weakref.WeakValueDictionary()

    async def close(self) -> None:
        await self._table.close()

    @asynccontextmanager
    async def _turn(self, pk: str) -> AsyncIterator[_Turn]:
        turn = self._turns.get(pk)
        if turn is None:
            turn = self._turns[pk] = _Turn()
        async with turn.lock:
            yield turn

    async def enter(
        self,
        customer: str,
        order_id: str,
        at: datetime,
        policy: CustomerPolicy,
        *,
        high: bool = False,
    ) -> Entered:
        pk = partition(customer)
        async with self._turn(pk) as turn:
            return await self._enter(turn, pk, customer, order_id, at, policy, high)

    async def _enter(
        self,
        turn: _Turn,
        pk: str,
        customer: str,
        order_id: str,
        at: datetime,
        policy: CustomerPolicy,
        high: bool,
    ) -> Entered:
        for attempt in range(_RACES):
            known, turn.known = turn.known, None
            guess = attempt == 0
            if guess:
                # The order is taken to be new (a repeat's member row fails the create),
                # on the load row as this instance's last change left it, or read alone.
                read = _Read(*(known or await self._read_load(pk)), None)
            else:
                read = await self._read(pk, order_id)
            if read.member is not None:
                waits = bool(read.member.get("Line"))
                return Entered(Admission.WAIT if waits else Admission.RUN, read.load, known=True)
            admission = admit(read.load, policy)
            if admission is Admission.REFUSE:
                if guess:
                    continue  # a refusal reads first: the order may be counted already
                return Entered(admission, read.load)
            waits = admission is Admission.WAIT
            line = _line_key(at, order_id) if waits else ""
            after = replace(
                read.load,
                running=read.load.running + (not waits),
                waiting=read.load.waiting + waits,
            )
            operations = [
                self._put_load(pk, customer, after, read.load_etag),
                ("create", {"PartitionKey": pk, "RowKey": _member_key(order_id), "Line": line}),
            ]
            if waits:
                operations.append(("create", {"PartitionKey": pk, "RowKey": line, "High": high}))
            if await self._commit(operations, turn, after):
                return Entered(admission, read.load)
        raise ConcurrencyConflict(f"customer {customer}: lost {_RACES} races in a row")

    async def rejoin(self, customer: str, order_id: str, at: datetime) -> None:
        pk = partition(customer)
        async with self._turn(pk) as turn:
            turn.known = None
            await self._rejoin(pk, customer, order_id)

    async def _rejoin(self, pk: str, customer: str, order_id: str) -> None:
        for _ in range(_RACES):
            read = await self._read(pk, order_id)
            line = str(read.member.get("Line") or "") if read.member is not None else None
            if line == "":
                return  # running already
            waiting = read.load.waiting - (line is not None)
            after = replace(read.load, running=read.load.running + 1, waiting=max(waiting, 0))
            member = {"PartitionKey": pk, "RowKey": _member_key(order_id), "Line": ""}
            operations = [
                self._put_load(pk, customer, after, read.load_etag),
                ("upsert", member, {"mode": UpdateMode.REPLACE}),
            ]
            if line:
                operations.append(("delete", {"PartitionKey": pk, "RowKey": line}))
            if await self._commit(operations):
                return
        raise ConcurrencyConflict(f"customer {customer}: lost {_RACES} races in a row")

    async def leave(
        self, customer: str, order_id: str, policy: CustomerPolicy, at: datetime | None = None
    ) -> Promoted | None:
        pk = partition(customer)
        async with self._turn(pk) as turn:
            return await self._leave(turn, pk, customer, order_id, policy, at)

    async def standing(self, customer: str, order_id: str) -> Admission | None:
        member = await self._get(partition(customer), _member_key(order_id))
        if member is None:
            return None
        return Admission.WAIT if member.get("Line") else Admission.RUN

    async def _leave(
        self,
        turn: _Turn,
        pk: str,
        customer: str,
        order_id: str,
        policy: CustomerPolicy,
        at: datetime | None,
    ) -> Promoted | None:
        for _ in range(_RACES):
            known, turn.known = turn.known, None
            if known is not None:
                member = await self._get(pk, _member_key(order_id))
                read = _Read(known[0], known[1], member)
            else:
                read = await self._read(pk, order_id)
            if read.member is None:
                return None
            line = str(read.member.get("Line") or "")
            running = not line
            after = replace(
                read.load if at is None else read.load.ended(at),
                running=max(read.load.running - running, 0),
                waiting=max(read.load.waiting - (not running), 0),
            )
            operations: list[Any] = [
                ("delete", read.member, _if_match(read.member.metadata["etag"])),
            ]
            if line:
                operations.append(("delete", {"PartitionKey": pk, "RowKey": line}))
            promoted = None
            if running and promotes(after, policy):
                head = await self._head(pk)
                if head is not None:
                    promoted = Promoted(
                        str(head["RowKey"]).split(":", 2)[2], bool(head.get("High", False))
                    )
                    after = replace(after, running=after.running + 1, waiting=after.waiting - 1)
                    operations.append(("delete", head, _if_match(head.metadata["etag"])))
                    member = {
                        "PartitionKey": pk,
                        "RowKey": _member_key(promoted.order_id),
                        "Line": "",
                    }
                    operations.append(("upsert", member, {"mode": UpdateMode.REPLACE}))
            operations.insert(0, self._put_load(pk, customer, after, read.load_etag))
            if await self._commit(operations, turn, after):
                return promoted
        raise ConcurrencyConflict(f"customer {customer}: lost {_RACES} races in a row")

    async def loads(self, limit: int) -> tuple[tuple[str, CustomerLoad], ...]:
        """One query over the customers' load rows: one row per customer with open orders."""
        with translated_errors():
            rows = [
                row
                async for row in self._table.query_entities(
                    "PartitionKey ge @lo and PartitionKey lt @hi and RowKey eq @rk",
                    parameters={"lo": PARTITION_PREFIX, "hi": "~customer;", "rk": LOAD_KEY},
                    select=["Customer", "Running", "Waiting", "Pace", "LeftAt"],
                )
            ]
        ranked = sorted(
            ((str(r["Customer"]), _load(r)) for r in rows),
            key=lambda item: (-item[1].open, item[0]),
        )
        return tuple(ranked[:limit])

    async def _read_load(self, pk: str) -> tuple[CustomerLoad, str | None]:
        load = await self._get(pk, LOAD_KEY)
        return (CustomerLoad(), None) if load is None else (_load(load), load.metadata["etag"])

    async def _read(self, pk: str, order_id: str) -> _Read:
        load = await self._get(pk, LOAD_KEY)
        member = await self._get(pk, _member_key(order_id))
        if load is None:
            return _Read(CustomerLoad(), None, member)
        return _Read(_load(load), load.metadata["etag"], member)

    async def _get(self, pk: str, rk: str) -> Any:
        with translated_errors(when=refused_with(ResourceNotFoundError)):
            return await self._table.get_entity(pk, rk)
        return None

    async def _head(self, pk: str) -> Any:
        with translated_errors():
            async for row in self._table.query_entities(
                "PartitionKey eq @pk and RowKey ge @lo and RowKey lt @hi",
                parameters={"pk": pk, "lo": "w:", "hi": "w;"},
                results_per_page=1,
            ):
                return row
        return None

    def _put_load(
        self, pk: str, customer: str, load: CustomerLoad, etag: str | None
    ) -> tuple[Any, ...]:
        entity: dict[str, Any] = {
            "PartitionKey": pk,
            "RowKey": LOAD_KEY,
            "Customer": customer,
            "Running": load.running,
            "Waiting": load.waiting,
        }
        if load.left_at is not None:
            entity["LeftAt"] = load.left_at
        if load.pace is not None:
            entity["Pace"] = float(load.pace)
        if etag is None:
            return ("create", entity)
        if load.open == 0:
            return ("delete", entity, _if_match(etag))
        return ("update", entity, {"mode": UpdateMode.REPLACE, **_if_match(etag)})

    async def _commit(
        self, operations: list[Any], turn: _Turn | None = None, after: CustomerLoad | None = None
    ) -> bool:
        """False: another change to the customer came first (an ETag or a key taken).
        With `turn`, what the load row now holds (`after`) is kept for the next change."""
        with translated_errors(when=refused_with(TableTransactionError)):
            answers = await self._table.submit_transaction(operations)
            if turn is not None and after is not None:
                turn.known = _left_as(after, answers[0] if answers else {})
            return True
        return False


def _left_as(after: CustomerLoad, answer: Any) -> tuple[CustomerLoad, str | None] | None:
    """The load row after a transaction: gone (its count reached zero), or `after` at
    the ETag the service answered; None when there is no ETag to write on."""
    if after.open == 0:
        return (replace(after, pace=None, left_at=None), None)
    etag = answer.get("etag") if hasattr(answer, "get") else None
    return (after, str(etag)) if etag else None


def _load(row: Any) -> CustomerLoad:
    pace = row.get("Pace")
    return CustomerLoad(
        int(row["Running"]),
        int(row["Waiting"]),
        None if pace is None else float(pace),
        row.get("LeftAt"),
    )


def _if_match(etag: str) -> dict[str, Any]:
    return {"etag": etag, "match_condition": MatchConditions.IfNotModified}
