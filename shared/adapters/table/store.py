"""The state store on Azure Table Storage: single-entity requests (the writes and point
reads of every order) on aiohttp directly (entities.py), queries, entity-group
transactions and table creation through azure-data-tables' async client.

An order's state, steps, outbox and latest history are one entity (see `table_rows`), so
`load` is one point read and `save` one conditional write of it (If-Match on its ETag):
the audit trail never misses or outruns a state change, and the common save spares the
multipart encoding of an entity-group transaction. Only a save whose history outgrows
the entity is a transaction, which moves the entries to rows. A save replaces the whole
entity, so it carries the history on: the store remembers, per order and ETag it read
or wrote, the history that entity holds, and reads it again only for one it never saw. The
Supervisor's watch list lives in a few `~watch-NN` partitions and is found by a filtered
query over in-flight orders only.
"""

from __future__ import annotations

import asyncio
import base64
import json
from collections import Counter, OrderedDict
from collections.abc import Awaitable, Iterable, Sequence
from datetime import datetime
from typing import Any

from azure.core import MatchConditions
from azure.core.exceptions import (
    HttpResponseError,
    ResourceExistsError,
    ResourceModifiedError,
    ResourceNotFoundError,
)
from azure.data.tables import TableTransactionError, UpdateMode
from azure.data.tables.aio import TableClient, TableServiceClient

from shared import jsonbounds
from shared.adapters.table import client as table_client
from shared.adapters.table import rest as table_rest
from shared.adapters.table import rows
from shared.adapters.table.entities import TableEntities
from shared.adapters.table.errors import (
    Refusal,
    refused_status,
    refused_with,
    translated_errors,
)
from shared.domain.archive import ArchivedMark
from shared.domain.model import HistoryEntry, OrderProcess, ProcessState, StateRecord
from shared.domain.rest_index import RestEntry, RestPage, RestRange, row_key
from shared.ports import (
    MOVE_RACES,
    AlreadyExists,
    ConcurrencyConflict,
    Page,
    StateStoreError,
    UnreadableOrder,
    WatchEntry,
    WatchPage,
)

LIST_CHUNK = 200
"""State rows an operator's listing asks the table for per request. A page of 1,000 in
one response is parsed whole, its thousand entities alive at once beside the records
made of them; in chunks the transient part of one such read fell from 1.9 to 0.5 MB
(tracemalloc, in process, chunks of 250), at four more requests per page. What a large
transient read leaves behind is pymalloc arenas pinned by the few objects that outlive
it (bench/README.md, "Memory under mixed traffic")."""

KEPT_HISTORIES = 4096
"""(order, ETag) pairs whose entity's history this store remembers from its own reads
and writes, so the save that follows a read needs no second one; a few MB at most. Keyed
by the order too: an ETag is the entity's timestamp, and two orders written in one tick
carry the same one."""

_CONFLICT_CODES = {"UpdateConditionNotSatisfied", "ConditionNotMet", "ResourceNotFound"}
_EXISTS_CODES = {"EntityAlreadyExists"}


def _transaction_refused(codes: set[str], statuses: tuple[int, ...] = ()) -> Refusal:
    def refused(exc: HttpResponseError) -> bool:
        code = getattr(exc, "error_code", None)
        return isinstance(exc, TableTransactionError) and (
            code in codes or exc.status_code in statuses
        )

    return refused


_ORDER_EXISTS = _transaction_refused(_EXISTS_CODES)
_STATE_CHANGED = _transaction_refused(_CONFLICT_CODES | _EXISTS_CODES, (404, 409, 412))


def _watch_moved_on(exc: HttpResponseError) -> bool:
    """The entry changed or went since it was read (a Scheduler, another Supervisor)."""
    return isinstance(exc, (ResourceModifiedError, ResourceNotFoundError)) or (
        exc.status_code in (404, 412)
    )


class TableStateStore:
    def __init__(self, service: TableServiceClient, table_name: str) -> None:
        self._service = service
        self._table: TableClient = service.get_table_client(table_name)
        self._entities = TableEntities.of(service, table_name)
        self._table_name = table_name
        self._ready = False
        self._ready_lock = asyncio.Lock()
        self.operations: Counter[str] = Counter()
        self._inline: OrderedDict[tuple[str, str], str] = OrderedDict()

    @property
    def table(self) -> TableClient:
        """The table client, shared with the bulk jobs' adapter (same table)."""
        return self._table

    @property
    def failures(self) -> int:
        """Calls to the store that failed, by any table adapter on this client."""
        return table_client.failures(self._service)

    async def close(self) -> None:
        await self._entities.close()
        await self._table.close()
        await self._service.close()

    async def ensure_table(self) -> None:
        """Create the table once per worker; in Azure the Bicep already did."""
        if self._ready:
            return
        async with self._ready_lock:
            if self._ready:
                return
            with translated_errors(
                when=refused_with(ResourceExistsError), where=f"table {self._table_name}: "
            ):
                await self._service.create_table(self._table_name)
            self._ready = True

    async def create(self, process: OrderProcess, history: Sequence[HistoryEntry]) -> str:
        await self.ensure_table()
        keyed = rows.keyed_history(process.state.version, list(history))
        inline = rows.inline_history_text(keyed)
        if inline is not None:
            entity = rows.state_entity(process, inline)
            etag = await self._write(process.order_id, self._entities.insert(entity), create=True)
            return self._kept(process, etag, inline)
        operations: list[Any] = [
            ("create", rows.state_entity(process)),
            *(("create", e) for e in rows.history_entities(process.order_id, keyed)),
        ]
        with translated_errors(AlreadyExists(process.order_id), when=_ORDER_EXISTS):
            results = await self._transact(operations)
        return self._kept(process, str(results[0]["etag"]), "[]")

    async def load(self, order_id: str) -> OrderProcess | None:
        await self.ensure_table()
        state = await self._read_state(order_id)
        if state is None or rows.is_mark(state):
            return None
        etag = str(state.metadata["etag"])
        if rows.is_current_layout(state):
            try:
                process: OrderProcess | None = rows.to_process(state, etag)
            except (ValueError, KeyError, TypeError) as exc:
                raise UnreadableOrder(f"order {order_id}: {type(exc).__name__}: {exc}") from exc
        else:
            process = await self._load_legacy(order_id, etag)
        if process is not None:
            self._kept(process, etag, rows.history_text(state))
        return process

    async def archived(self, order_id: str) -> ArchivedMark | None:
        await self.ensure_table()
        state = await self._read_state(order_id)
        return rows.to_mark(state) if state is not None and rows.is_mark(state) else None

    async def processes(self, states: Iterable[Any]) -> tuple[OrderProcess, ...]:
        """Orders from state entities a query found: one in the current layout is whole
        as found; one written before steps moved into it is loaded (and skipped if it
        went meanwhile). Listings, bulk scans, the archive and reconciliation share it."""
        found: list[OrderProcess] = []
        for entity in states:
            if rows.is_current_layout(entity):
                found.append(rows.to_process(entity, str(entity.metadata["etag"])))
            else:
                legacy = await self.load(str(entity["PartitionKey"]))
                if legacy is not None:
                    found.append(legacy)
        return tuple(found)

    async def _read_state(self, order_id: str) -> Any:
        self.operations["read"] += 1
        with translated_errors():
            try:
                return await self._entities.read(order_id, rows.STATE_ROW)
            except ResourceNotFoundError:
                return None

    async def _load_legacy(self, order_id: str, etag: str) -> OrderProcess | None:
        """An order written before steps moved into the state entity: its rows, read with
        the ETag of the state entity that was just read, so a save stays conditional."""
        entities = await self._query(
            "PartitionKey eq @pk and RowKey ge @first",
            {"pk": order_id, "first": rows.ORDER_ROW},
        )
        return rows.from_legacy_rows(entities, etag)

    def _kept(self, process: OrderProcess, etag: str, history: str) -> str:
        """Remember the history the order's entity at `etag` carries, for the save that
        follows the read (a save replaces the whole entity, so it must carry it on).
        A final order (Processed, Compensated, Cancelled) is never saved again: kept, the
        history of each order that finished here or that an operator looked at stayed
        until 4,096 others pushed it out, about 9 MB that grew for half an hour at two
        orders a second (issue 27, item 5)."""
        if process.state.process_state.is_final:
            return etag
        self._inline[(process.order_id, etag)] = history
        while len(self._inline) > KEPT_HISTORIES:
            self._inline.popitem(last=False)
        return etag

    async def _inline_at(self, order_id: str, etag: str) -> list[rows.Keyed]:
        """The history the entity carries at `etag`: kept from this store's own read or
        write, else read (a process read elsewhere, or long ago); a changed entity is a
        lost race either way."""
        kept = self._inline.pop((order_id, etag), None)
        if kept is None:
            state = await self._read_state(order_id)
            if state is None or str(state.metadata["etag"]) != etag:
                raise ConcurrencyConflict(order_id)
            kept = rows.history_text(state)
        return rows.parse_history(kept)

    async def save(self, process: OrderProcess, history: Sequence[HistoryEntry]) -> str:
        """One conditional replace of the state entity, its history carried in it; when
        that would grow past its bound, one transaction that also moves it to rows."""
        if process.etag is None:
            raise ConcurrencyConflict(f"order {process.order_id} was not read before saving")
        await self.ensure_table()
        keyed = rows.keyed_history(process.state.version, list(history))
        entries = await self._inline_at(process.order_id, process.etag)
        inline = rows.inline_history_text([*entries, *keyed])
        if inline is not None:
            entity = rows.state_entity(process, inline)
            etag = await self._write(
                process.order_id, self._entities.replace(entity, process.etag), create=False
            )
            return self._kept(process, etag, inline)
        conditional: dict[str, Any] = {
            "mode": UpdateMode.REPLACE,
            "etag": process.etag,
            "match_condition": MatchConditions.IfNotModified,
        }
        operations: list[Any] = [
            ("update", rows.state_entity(process), conditional),
            *(("create", e) for e in rows.history_entities(process.order_id, [*entries, *keyed])),
        ]
        with translated_errors(ConcurrencyConflict(process.order_id), when=_STATE_CHANGED):
            results = await self._transact(operations)
        return self._kept(process, str(results[0]["etag"]), "[]")

    async def _write(self, order_id: str, call: Awaitable[str], *, create: bool) -> str:
        """One single-entity write. On create an existing entity means the order exists;
        on update a changed or missing one means a lost race."""
        self.operations["write"] += 1
        lost: StateStoreError
        if create:
            lost, refused = AlreadyExists(order_id), refused_status(409)
        else:
            lost, refused = ConcurrencyConflict(order_id), refused_status(404, 409, 412)
        with translated_errors(lost, when=refused):
            return await call

    async def history(self, order_id: str) -> tuple[HistoryEntry, ...]:
        """The rows and the state entity's own entries, in one query, in key order."""
        entities = await self._query(  # spaced: the SDK finds parameters between spaces
            "PartitionKey eq @pk and ( RowKey eq @state or ( RowKey ge @lo and RowKey lt @hi ) )",
            {"pk": order_id, "state": rows.STATE_ROW, "lo": rows.HISTORY_PREFIX, "hi": "hist."},
        )
        keyed: dict[str, HistoryEntry] = {}
        for entity in entities:
            if entity["RowKey"] == rows.STATE_ROW:
                keyed.update(rows.parse_history(rows.history_text(entity)))
            else:
                keyed[entity["RowKey"]] = rows.to_history(entity)
        return tuple(entry for _, entry in sorted(keyed.items()))

    async def list_by_state(
        self, state: ProcessState | None, page_size: int, continuation: str | None
    ) -> Page:
        """A scan of every state row (with a state, filtered server-side), page by page,
        each page read `LIST_CHUNK` rows at a time: left for `GET /api/orders` without a
        state, the rest index's backfill and the workflow-version check; the views of one
        state read the rest index and the watch list instead
        (shared/usecases/operations/order_views.py)."""
        await self.ensure_table()
        query = "RowKey eq @row" + (" and ProcessState eq @state" if state else "")
        parameters = {"row": rows.STATE_ROW, **({"state": state.value} if state else {})}
        token = _decode_token(continuation)
        items: list[StateRecord] = []
        with translated_errors():
            while True:
                self.operations["query"] += 1
                pager: Any = self._table.query_entities(
                    query,
                    parameters=parameters,
                    results_per_page=min(page_size - len(items), LIST_CHUNK),
                    select=[*rows.STATE_COLUMNS, rows.ARCHIVED_STATE],
                ).by_page(continuation_token=token)
                async for page in pager:
                    async for entity in page:
                        if rows.is_mark(entity):  # an archived order's
                            continue
                        selected = rows.selected_state(entity)
                        if selected is None:
                            selected = await self._read_state(entity["OrderID"])
                        if selected is not None and not rows.is_mark(selected):
                            items.append(rows.to_state(selected))  # else archived meanwhile
                    break
                token = pager.continuation_token
                if not token or len(items) >= page_size:
                    break
        return Page(tuple(items), _encode_token(token))

    async def watch(
        self,
        order_id: str,
        check_at: datetime,
        *,
        replace: bool,
        version: int = 0,
        customer: str = "",
    ) -> str | None:
        await self.ensure_table()
        entity: dict[str, Any] = {
            "PartitionKey": rows.watch_partition(order_id),
            "RowKey": order_id,
            "CheckAt": check_at,
            "StateVersion": version,
        }
        if customer:
            entity["Customer"] = customer
        self.operations["write"] += 1
        with translated_errors(when=refused_with(ResourceExistsError)):
            if replace:
                return await self._entities.replace(entity, None)
            return await self._entities.insert(entity)
        return None

    async def rewatch(self, order_id: str, check_at: datetime, *, version: int = 0) -> None:
        """A merge of the keys alone: the service gives the entry a new ETag and changes
        nothing else. Gone, it is created; if someone else creates it first, theirs is
        as new as ours would have been, so that is kept."""
        await self.ensure_table()
        keys = {"PartitionKey": rows.watch_partition(order_id), "RowKey": order_id}
        self.operations["write"] += 1
        with translated_errors(when=refused_status(404)):
            await self._entities.merge(keys, "*")
            return
        await self.watch(order_id, check_at, replace=False, version=version)

    async def move_up(self, order_id: str, check_at: datetime, *, version: int = 0) -> bool:
        """A point read of the check, then a merge of the earlier of the two If-Match on
        that read (the version and customer stay as they are): the service has no
        conditional write on a property's value, so "only if earlier" is this read's to
        decide."""
        await self.ensure_table()
        keys = {"PartitionKey": rows.watch_partition(order_id), "RowKey": order_id}
        for _ in range(MOVE_RACES):
            found = await self._check_of(keys)
            if found is None:
                if await self.watch(order_id, check_at, replace=False, version=version):
                    return True
                continue
            watched_at, etag = found
            self.operations["write"] += 1
            with translated_errors(when=_watch_moved_on):
                await self._entities.merge({**keys, "CheckAt": min(watched_at, check_at)}, etag)
                return check_at < watched_at
        raise ConcurrencyConflict(f"watch entry of {order_id}: lost {MOVE_RACES} races")

    async def _check_of(self, keys: dict[str, str]) -> tuple[datetime, str] | None:
        """The entry's check time and ETag; None when there is no entry."""
        self.operations["read"] += 1
        with translated_errors(when=refused_status(404)):
            found = await self._entities.read(keys["PartitionKey"], keys["RowKey"], ["CheckAt"])
            return found["CheckAt"], str(found.metadata["etag"])
        return None

    async def due(self, now: datetime, limit: int) -> tuple[WatchEntry, ...]:
        await self.ensure_table()
        found = await asyncio.gather(
            *(
                self._query(
                    "PartitionKey eq @pk and CheckAt le @now",
                    {"pk": partition, "now": now},
                    select=_WATCH_COLUMNS,
                )
                for partition in rows.watch_partitions()
            )
        )
        entries = [_watch_entry(e) for shard in found for e in shard]
        entries.sort(key=lambda e: (e.check_at, e.order_id))
        return tuple(entries[:limit])

    async def watch_list(self, limit: int, continuation: str | None) -> WatchPage:
        """One range read over the `~watch-NN` partitions, which sort together, in
        (shard, order id) order: the cursor is the last order id handed out, whose shard
        its id names. The service follows the range from shard to shard, so this costs
        what the watch list holds, never the table."""
        await self.ensure_table()
        shards = rows.watch_partitions()
        first = shards[0] if continuation is None else rows.watch_partition(continuation)
        self.operations["query"] += 1
        found: list[WatchEntry] = []
        if limit <= 0:
            return WatchPage((), None)
        with translated_errors():  # spaced: the SDK finds parameters between spaces
            async for e in self._table.query_entities(
                "PartitionKey ge @first and PartitionKey le @last and "
                "( PartitionKey gt @first or RowKey gt @after )",
                parameters={"first": first, "last": shards[-1], "after": continuation or ""},
                select=[*_WATCH_COLUMNS, "PartitionKey"],
                results_per_page=min(limit + 1, 1000),
            ):
                if len(found) >= limit:
                    return WatchPage(tuple(found), found[-1].order_id)
                found.append(_watch_entry(e))
        return WatchPage(tuple(found), None)

    async def states(self, order_ids: Sequence[str]) -> tuple[StateRecord, ...]:
        await self.ensure_table()

        async def state(order_id: str) -> Any:
            self.operations["read"] += 1
            with translated_errors():
                try:
                    found = await self._entities.read(
                        order_id, rows.STATE_ROW, [*rows.STATE_COLUMNS, rows.ARCHIVED_STATE]
                    )
                except ResourceNotFoundError:
                    return None
            if rows.is_mark(found):
                return None
            return rows.selected_state(found) or await self._read_state(order_id)

        found = await asyncio.gather(*(state(i) for i in order_ids))
        return tuple(rows.to_state(f) for f in found if f is not None and not rows.is_mark(f))

    async def put_rest(self, entry: RestEntry) -> None:
        await self.ensure_table()
        self.operations["write"] += 1
        await table_rest.put(self._entities, entry)

    async def drop_rest(
        self, state: ProcessState, order_id: str, created_at: datetime, *, below: int | None = None
    ) -> None:
        await self.ensure_table()
        self.operations["write"] += 1
        await table_rest.drop(self._entities, state, order_id, row_key(created_at, order_id), below)

    async def rest_entries(self, keys: RestRange, limit: int, continuation: str | None) -> RestPage:
        await self.ensure_table()
        self.operations["query"] += len(table_rest.partitions(keys.state))
        return await table_rest.read(self._table, keys, limit, continuation)

    async def unsharded_rest(
        self, state: ProcessState, limit: int, continuation: str | None
    ) -> RestPage:
        await self.ensure_table()
        self.operations["query"] += 1
        return await table_rest.legacy_page(self._table, state, limit, continuation)

    async def drop_unsharded_rest(self, entry: RestEntry) -> None:
        await self.ensure_table()
        self.operations["write"] += 1
        await table_rest.drop_legacy(self._entities, entry)

    async def reschedule(self, entry: WatchEntry, check_at: datetime) -> None:
        entity = {
            "PartitionKey": rows.watch_partition(entry.order_id),
            "RowKey": entry.order_id,
            "CheckAt": check_at,
            "StateVersion": entry.version,
        }
        self.operations["write"] += 1
        with translated_errors(when=_watch_moved_on):
            await self._entities.replace(entity, entry.etag)

    async def unwatch(self, order_id: str, version: int | None = None) -> None:
        """With `version`: a point read, then a delete conditional on that read's ETag."""
        partition = rows.watch_partition(order_id)
        etag = "*"
        with translated_errors(when=_watch_moved_on):
            if version is not None:
                self.operations["read"] += 1
                entry = await self._entities.read(partition, order_id, ["StateVersion"])
                if int(entry.get("StateVersion", 0)) > version:
                    return
                etag = str(entry.metadata["etag"])
            self.operations["write"] += 1
            await self._entities.delete(partition, order_id, etag)

    async def unwatch_entry(self, entry: WatchEntry) -> None:
        self.operations["write"] += 1
        with translated_errors(when=_watch_moved_on):
            await self._entities.delete(
                rows.watch_partition(entry.order_id), entry.order_id, entry.etag
            )

    async def ping(self) -> None:
        await self.ensure_table()
        with translated_errors(when=refused_with(ResourceNotFoundError)):
            await self._entities.read("~ping", "~ping")

    async def _transact(self, operations: list[Any]) -> list[dict[str, Any]]:
        """Raises the driver's errors: each caller knows what a refused transaction means."""
        self.operations["write"] += 1
        self.operations["transaction"] += 1
        return [dict(r) for r in await self._table.submit_transaction(operations)]

    async def _query(
        self, query: str, parameters: dict[str, Any], select: list[str] | None = None
    ) -> list[Any]:
        self.operations["query"] += 1
        with translated_errors():
            return [
                e
                async for e in self._table.query_entities(
                    query, parameters=parameters, select=select
                )
            ]


_WATCH_COLUMNS = ["RowKey", "CheckAt", "StateVersion", "Customer"]


def _watch_entry(e: Any) -> WatchEntry:
    return WatchEntry(
        e["RowKey"],
        e["CheckAt"],
        e.metadata["etag"],
        int(e.get("StateVersion", 0)),
        str(e.get("Customer") or ""),
    )


def _encode_token(token: Any) -> str | None:
    if not token:
        return None
    return base64.urlsafe_b64encode(json.dumps(token).encode()).decode()


def _decode_token(token: str | None) -> Any:
    if not token:
        return None
    try:
        return jsonbounds.loads(base64.urlsafe_b64decode(token.encode()))
    except ValueError:
        raise ValueError("invalid continuation token") from None
