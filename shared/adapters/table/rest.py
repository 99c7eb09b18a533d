"""The rest index on Table Storage (shared/domain/rest_index.py): per rest state,
`REST_SHARDS` partitions `~rest-{state}-NN` in the state table, the order's shard a hash
of its id, row key `{created day}|{order id}`. One partition per state took a write for
every order that came to rest, so the index capped the system at a partition's 2,000
entities/s (docs/capacity.md, "Table Storage"); sharded, a partition takes one order in
`REST_SHARDS`.

A page is one range read per shard, all at once, merged in key order: each shard gives
its first `limit` entries past the cursor, so the first `limit` of the merge are the
range's, and the cursor stays the last key handed out. The customer filter is a
property filter inside each range, so the service never walks another partition (order
ids never start with `~`).

Entries written before the shards sit in the one `~rest-{state}` partition (`legacy`):
they are read as one more shard, and a drop deletes there too, until the move
(shared/usecases/history/rest_shards.py) has emptied it."""

from __future__ import annotations

import asyncio
import zlib
from collections.abc import Coroutine
from typing import Any, Final, TypeVar, cast

from azure.core.exceptions import HttpResponseError, ResourceModifiedError, ResourceNotFoundError
from azure.data.tables.aio import TableClient

from shared.adapters.table import rows
from shared.adapters.table.entities import TableEntities
from shared.adapters.table.errors import translated_errors
from shared.domain.model import Phase, ProcessState
from shared.domain.rest_index import RestEntry, RestPage, RestRange

T = TypeVar("T")

PREFIX: Final = "~rest-"
REST_SHARDS: Final = 4
"""Partitions per rest state: 8,000 orders come to rest a second before one of them
reaches its 2,000 entities/s, twice what the storage account allows at five requests an
order (docs/capacity.md). Each is one more query per page read. Changing it moves
every entry's partition: reads and drops would miss the entries where the old count put
them until a move like shared/usecases/history/rest_shards.py took them over."""


def legacy(state: ProcessState) -> str:
    """The one partition a state's entries had before the shards."""
    return f"{PREFIX}{state.value}"


def partition(state: ProcessState, order_id: str) -> str:
    return f"{legacy(state)}-{zlib.crc32(order_id.encode()) % REST_SHARDS:02d}"


def partitions(state: ProcessState) -> list[str]:
    """Every partition a state's entries may be in: its shards, and the legacy one."""
    return [*(f"{legacy(state)}-{n:02d}" for n in range(REST_SHARDS)), legacy(state)]


def entity(entry: RestEntry) -> dict[str, Any]:
    found: dict[str, Any] = {
        "PartitionKey": partition(entry.state, entry.order_id),
        "RowKey": entry.key,
        "OrderID": entry.order_id,
        "Version": entry.version,
        "CreatedAt": entry.created_at,
        "UpdatedAt": entry.updated_at,
        "Customer": entry.customer_id,
        "Workflow": entry.workflow,
        "WorkflowVersion": entry.workflow_version,
        "CurrentStep": entry.current_step,
        "FailureCount": entry.failure_count,
        "Phase": entry.phase.value,
        "Attempt": entry.attempt,
    }
    optional = {
        "LastError": entry.last_error,
        "Step": entry.step,
        "ErrorCode": entry.error_code,
        "LockedBy": entry.locked_by,
        "CompleteBy": entry.complete_by,
    }
    found.update({k: v for k, v in optional.items() if v is not None})
    return found


def to_entry(state: ProcessState, found: Any) -> RestEntry:
    return RestEntry(
        order_id=str(found["OrderID"]),
        state=state,
        version=int(found.get("Version", 0)),
        created_at=rows.utc(found["CreatedAt"]),
        updated_at=rows.utc(found["UpdatedAt"]),
        customer_id=str(found.get("Customer") or ""),
        workflow=str(found["Workflow"]),
        workflow_version=int(found.get("WorkflowVersion", 1)),
        current_step=int(found.get("CurrentStep", 0)),
        failure_count=int(found.get("FailureCount", 0)),
        last_error=found.get("LastError"),
        step=found.get("Step"),
        error_code=found.get("ErrorCode"),
        phase=Phase(found.get("Phase") or Phase.FORWARD.value),
        attempt=int(found.get("Attempt", 0)),
        locked_by=found.get("LockedBy"),
        complete_by=rows.utc_or_none(found.get("CompleteBy")),
    )


async def put(entities: TableEntities, entry: RestEntry) -> None:
    with translated_errors():
        await entities.replace(entity(entry), None)


async def drop(
    entities: TableEntities, state: ProcessState, order_id: str, key: str, below: int | None
) -> None:
    """From the order's shard and from the legacy partition, at once (an order that
    came to rest before the shards may have its entry there)."""
    await _all(
        [
            _drop(entities, partition(state, order_id), key, below),
            _drop(entities, legacy(state), key, below),
        ]
    )


async def drop_legacy(entities: TableEntities, entry: RestEntry) -> None:
    """The entry in the legacy partition, as read (a newer one is only ever written to
    a shard, so nothing there changes but by a delete)."""
    await _drop(entities, legacy(entry.state), entry.key, None)


async def _drop(entities: TableEntities, pk: str, key: str, below: int | None) -> None:
    """With `below`: a point read, then a delete conditional on that read's ETag."""
    with translated_errors(when=_gone):
        if below is None:
            await entities.delete(pk, key)
            return
        found = await entities.read(pk, key, ["Version"])
        if int(found.get("Version", 0)) >= below:
            return
        await entities.delete(pk, key, str(found.metadata["etag"]))


async def _all(calls: list[Coroutine[Any, Any, T]]) -> list[T]:
    """Every call at once, each run to its end before the first failure is raised (no
    request is left behind with an error nobody reads)."""
    done = await asyncio.gather(*calls, return_exceptions=True)
    for result in done:
        if isinstance(result, BaseException):
            raise result
    return cast(list[T], done)


def _gone(exc: HttpResponseError) -> bool:
    """The entry went, or changed (a newer rest wrote it) since it was read."""
    return isinstance(exc, (ResourceNotFoundError, ResourceModifiedError)) or (
        exc.status_code in (404, 412)
    )


async def read(
    table: TableClient, keys: RestRange, limit: int, continuation: str | None
) -> RestPage:
    """Every shard's first `limit` entries past the cursor, merged in key order (an
    entry in both a shard and the legacy partition counts once, the newer version)."""
    start = keys.start(continuation)
    if limit <= 0:
        return RestPage((), None)
    pages = await _all(
        [read_partition(table, pk, keys, limit, start) for pk in partitions(keys.state)]
    )
    merged: dict[str, RestEntry] = {}
    for page in pages:
        for entry in page.items:
            kept = merged.get(entry.key)
            if kept is None or kept.version < entry.version:
                merged[entry.key] = entry
    chosen = [merged[key] for key in sorted(merged)[:limit]]
    more = len(merged) > limit or any(page.continuation is not None for page in pages)
    return RestPage(tuple(chosen), chosen[-1].key if more and chosen else None)


async def legacy_page(
    table: TableClient, state: ProcessState, limit: int, continuation: str | None
) -> RestPage:
    """Entries still in the legacy partition, in key order."""
    if limit <= 0:
        return RestPage((), None)
    keys = RestRange(state)
    return await read_partition(table, legacy(state), keys, limit, keys.start(continuation))


async def read_partition(
    table: TableClient, pk: str, keys: RestRange, limit: int, start: tuple[str, bool]
) -> RestPage:
    """Pages of the service are followed until `limit` entries (a page may come back
    short or empty, with a continuation, when the customer filter skips many). A
    customer id with a lone surrogate (a bulk job's filter stored before the edge
    refused them, issue 41) cannot go into the filter's URL: its entries are compared
    as they are read instead, the same answer for more reads."""
    lo, inclusive = start
    query = f"PartitionKey eq @pk and RowKey {'ge' if inclusive else 'gt'} @lo and RowKey lt @hi"
    parameters: dict[str, Any] = {"pk": pk, "lo": lo, "hi": keys.hi}
    customer = keys.customer_id
    if customer is not None and rows.in_url(customer):
        query += " and Customer eq @customer"
        parameters["customer"] = customer
    if keys.changed_since is not None:
        query += " and UpdatedAt ge @since"
        parameters["since"] = keys.changed_since
    if keys.changed_before is not None:
        query += " and UpdatedAt lt @before"
        parameters["before"] = keys.changed_before
    chosen: list[RestEntry] = []
    with translated_errors():
        async for found in table.query_entities(
            query, parameters=parameters, results_per_page=min(limit + 1, 1000)
        ):
            entry = to_entry(keys.state, found)
            if customer is not None and entry.customer_id != customer:
                continue  # a customer no URL can name, compared here
            if len(chosen) >= limit:
                return RestPage(tuple(chosen), chosen[-1].key)
            chosen.append(entry)
    return RestPage(tuple(chosen), None)
