"""Bulk jobs on Azure Table Storage, and the page-by-page scan of orders they work through.

A job is one row in the state table's `~bulk` partition (RowKey: the bulk id), beside
the orders' partitions and out of their way (order ids never start with `~`). Every
change is a REPLACE conditional on the ETag read, so two timer runs on two instances
cannot both claim the same page. The filter, the cursor and the page in flight are JSON
properties; the counters are real properties, so a progress read is one point read.
The runners' lease is one more row there, RowKey `~lease` (no bulk id starts with `~`,
and it has no `State`, so the jobs' query never returns it).

The orders a job works through are found where the operator's views find them
(shared/adapters/bulk_scan.py): never by a filter over every state row.
"""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any, Final

from azure.core import MatchConditions
from azure.core.exceptions import ResourceNotFoundError
from azure.data.tables import UpdateMode
from azure.data.tables.aio import TableClient

from shared.adapters import bulk_scan
from shared.adapters.table import rows
from shared.adapters.table.conditional import put_row
from shared.adapters.table.errors import refused_status, translated_errors
from shared.adapters.table.store import TableStateStore
from shared.domain.bulk import BulkJob, Cursor, JobState, Lease
from shared.domain.bulk_request import BulkAction, BulkFilter, parse_filter
from shared.domain.model import ProcessState
from shared.ports import AlreadyExists, ConcurrencyConflict, OrderPage

BULK_PARTITION: Final = "~bulk"
LEASE_ROW: Final = "~lease"


class TableBulkStore:
    """Shares the state store's table client (and its table's creation)."""

    def __init__(self, store: TableStateStore) -> None:
        self._store = store

    @property
    def _table(self) -> TableClient:
        return self._store.table

    async def create_job(self, job: BulkJob) -> str:
        await self._store.ensure_table()
        with translated_errors(AlreadyExists(job.bulk_id), when=refused_status(409)):
            result = await self._table.create_entity(_job_entity(job))
        return str(result["etag"])

    async def load_job(self, bulk_id: str) -> BulkJob | None:
        await self._store.ensure_table()
        with translated_errors():
            try:
                entity = await self._table.get_entity(BULK_PARTITION, bulk_id)
            except ResourceNotFoundError:
                return None
        return _to_job(entity)

    async def save_job(self, job: BulkJob) -> str:
        if job.etag is None:
            raise ConcurrencyConflict(f"bulk job {job.bulk_id} was not read before saving")
        with translated_errors(
            ConcurrencyConflict(job.bulk_id), when=refused_status(404, 409, 412)
        ):
            result = await self._table.update_entity(
                _job_entity(job),
                mode=UpdateMode.REPLACE,
                etag=job.etag,
                match_condition=MatchConditions.IfNotModified,
            )
        return str(result["etag"])

    async def jobs(self, state: JobState) -> tuple[BulkJob, ...]:
        await self._store.ensure_table()
        with translated_errors():
            found = [
                e
                async for e in self._table.query_entities(
                    "PartitionKey eq @pk and State eq @state",
                    parameters={"pk": BULK_PARTITION, "state": state.value},
                )
            ]
        return tuple(_to_job(e) for e in found)

    async def orders(
        self,
        state: ProcessState,
        page_size: int,
        continuation: str | None,
        flt: BulkFilter | None = None,
        *,
        whole: bool = True,
    ) -> OrderPage:
        return await bulk_scan.orders(self._store, state, page_size, continuation, flt, whole=whole)

    async def lease(self) -> Lease | None:
        await self._store.ensure_table()
        with translated_errors():
            try:
                entity = await self._table.get_entity(BULK_PARTITION, LEASE_ROW)
            except ResourceNotFoundError:
                return None
        return Lease(str(entity["Holder"]), rows.utc(entity["Until"]), str(entity.metadata["etag"]))

    async def put_lease(self, lease: Lease, seen: Lease | None) -> Lease:
        await self._store.ensure_table()
        entity = {
            "PartitionKey": BULK_PARTITION,
            "RowKey": LEASE_ROW,
            "Holder": lease.holder,
            "Until": lease.until,
        }
        with translated_errors(
            ConcurrencyConflict("bulk lease"), when=refused_status(404, 409, 412)
        ):
            result = await put_row(self._table, entity, seen.etag if seen else None)
        return replace(lease, etag=str(result["etag"]))


def _cursor_json(cursor: Cursor | None) -> str | None:
    if cursor is None:
        return None
    return json.dumps({"stateIndex": cursor.state_index, "continuation": cursor.continuation})


def _cursor(raw: Any) -> Cursor | None:
    if raw is None:
        return None
    data = json.loads(str(raw))
    return Cursor(int(data["stateIndex"]), data.get("continuation"))


def _job_entity(job: BulkJob) -> dict[str, Any]:
    entity: dict[str, Any] = {
        "PartitionKey": BULK_PARTITION,
        "RowKey": job.bulk_id,
        "Action": job.action.value,
        "Filter": json.dumps(job.filter.to_json()),
        "State": job.state.value,
        "Matched": job.matched,
        "Done": job.done,
        "Skipped": job.skipped,
        "Failed": job.failed,
        "Operator": job.operator,
        "CreatedAt": job.created_at,
        "UpdatedAt": job.updated_at,
        "Cursor": _cursor_json(job.cursor),
        "InFlight": json.dumps(list(job.in_flight)),
    }
    if job.next_cursor is not None:
        entity["NextCursor"] = _cursor_json(job.next_cursor)
    if job.to_version is not None:
        entity["ToVersion"] = job.to_version
    return entity


def _to_job(entity: Any) -> BulkJob:
    flt = json.loads(entity["Filter"])
    return BulkJob(
        bulk_id=str(entity["RowKey"]),
        action=BulkAction(entity["Action"]),
        filter=parse_filter(flt) if flt else BulkFilter(),
        matched=int(entity.get("Matched", 0)),
        created_at=rows.utc(entity["CreatedAt"]),
        updated_at=rows.utc(entity["UpdatedAt"]),
        operator=str(entity.get("Operator", "operator")),
        # Jobs stored before migrate existed have no ToVersion.
        to_version=int(entity["ToVersion"]) if entity.get("ToVersion") is not None else None,
        state=JobState(entity["State"]),
        done=int(entity.get("Done", 0)),
        skipped=int(entity.get("Skipped", 0)),
        failed=int(entity.get("Failed", 0)),
        cursor=_cursor(entity.get("Cursor")) or Cursor(),
        in_flight=tuple(json.loads(entity.get("InFlight") or "[]")),
        next_cursor=_cursor(entity.get("NextCursor")),
        etag=str(entity.metadata["etag"]),
    )
