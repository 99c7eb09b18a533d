"""The limit rows (domain.limits) on Azure Table Storage, in the state table.

Partition `~limits` (no order id starts with `~`), so the deployment needs no other
table or role:

- `{agent}:rate`: the agent's rate schedule (`NextStart`), replaced If-Match on its ETag
  (inserted the first time: a second insert is refused, which is the same lost race);
- `{agent}:claims`: the slots handed-back requests started calls in (`Slots`, epoch
  microseconds), replaced If-Match like the schedule, so a request delivered twice
  uses its carried slot once;
- `{agent}:slot:{nnnn}`: one concurrency lease (`Holder`, `Expires`), inserted when the
  slot was never used, replaced If-Match when its lease expired, deleted If-Match when
  its call ends.

Each is one entity, so each change is one transaction; a conflict is a race lost.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from datetime import UTC, datetime, timedelta
from typing import Any, Final, TypeVar

from azure.core import MatchConditions
from azure.core.exceptions import (
    ResourceExistsError,
    ResourceModifiedError,
    ResourceNotFoundError,
)
from azure.data.tables.aio import TableClient, TableServiceClient

from shared.adapters.table.conditional import creating_table, put_row
from shared.adapters.table.errors import refused_with, translated_errors
from shared.adapters.table.rows import utc
from shared.domain.limits import Claims, Schedule, SlotLease
from shared.ports import ConcurrencyConflict

LIMITS_PARTITION: Final = "~limits"
_T = TypeVar("_T")
_lost = refused_with(ResourceExistsError, ResourceModifiedError, ResourceNotFoundError)


def rate_key(agent: str) -> str:
    return f"{agent}:rate"


def claims_key(agent: str) -> str:
    return f"{agent}:claims"


def slot_key(agent: str, slot: int) -> str:
    return f"{agent}:slot:{slot:04d}"


class TableLimitStore:
    """Shares the state store's TableServiceClient; closes only its own table client."""

    def __init__(self, service: TableServiceClient, table_name: str) -> None:
        self._service = service
        self._table: TableClient = service.get_table_client(table_name)
        self._table_name = table_name

    async def close(self) -> None:
        await self._table.close()

    async def schedule(self, agent: str) -> Schedule | None:
        with translated_errors(where=f"table {self._table_name}: "):
            try:
                entity = await self._table.get_entity(LIMITS_PARTITION, rate_key(agent))
            except ResourceNotFoundError:
                return None
        return Schedule(utc(entity["NextStart"]), str(entity.metadata["etag"]))

    async def put_schedule(
        self, agent: str, next_start: datetime, seen: Schedule | None
    ) -> Schedule:
        entity = {
            "PartitionKey": LIMITS_PARTITION,
            "RowKey": rate_key(agent),
            "NextStart": next_start,
        }
        conflict = ConcurrencyConflict(f"rate row of {agent} changed")
        written = await self._put(entity, seen.etag if seen else None, conflict)
        return Schedule(next_start, str(written["etag"]))

    async def claims(self, agent: str) -> Claims | None:
        with translated_errors(where=f"table {self._table_name}: "):
            try:
                entity = await self._table.get_entity(LIMITS_PARTITION, claims_key(agent))
            except ResourceNotFoundError:
                return None
        text = str(entity.get("Slots") or "")
        slots = tuple(_from_us(int(us)) for us in text.split(",") if us)
        return Claims(slots, str(entity.metadata["etag"]))

    async def put_claims(
        self, agent: str, slots: tuple[datetime, ...], seen: Claims | None
    ) -> Claims:
        entity = {
            "PartitionKey": LIMITS_PARTITION,
            "RowKey": claims_key(agent),
            "Slots": ",".join(str(_to_us(slot)) for slot in slots),
        }
        conflict = ConcurrencyConflict(f"claimed slots of {agent} changed")
        written = await self._put(entity, seen.etag if seen else None, conflict)
        return Claims(slots, str(written["etag"]))

    async def leases(self, agent: str) -> tuple[SlotLease, ...]:
        found: list[SlotLease] = []
        with translated_errors(where=f"table {self._table_name}: "):
            try:
                pager = self._table.query_entities(
                    "PartitionKey eq @pk and RowKey ge @low and RowKey lt @high",
                    parameters={
                        "pk": LIMITS_PARTITION,
                        "low": f"{agent}:slot:",
                        "high": f"{agent}:slot;",
                    },
                )
                async for entity in pager:
                    found.append(_to_lease(entity))
            except ResourceNotFoundError:
                return ()
        return tuple(found)

    async def take(
        self, agent: str, slot: int, holder: str, expires: datetime, seen: SlotLease | None
    ) -> SlotLease:
        entity = {
            "PartitionKey": LIMITS_PARTITION,
            "RowKey": slot_key(agent, slot),
            "Slot": slot,
            "Holder": holder,
            "Expires": expires,
        }
        conflict = ConcurrencyConflict(f"slot {slot} of {agent} taken")
        written = await self._put(entity, seen.etag if seen else None, conflict)
        return SlotLease(slot, holder, expires, str(written["etag"]))

    async def release(self, agent: str, lease: SlotLease) -> None:
        with translated_errors(when=_lost, where=f"table {self._table_name}: "):
            await self._table.delete_entity(
                LIMITS_PARTITION,
                slot_key(agent, lease.slot),
                etag=lease.etag,
                match_condition=MatchConditions.IfNotModified,
            )

    async def _put(
        self, entity: dict[str, Any], etag: str | None, conflict: ConcurrencyConflict
    ) -> Mapping[str, Any]:
        """Create the row (etag None: it must not exist), or replace it at `etag`."""
        return await self._write(lambda: put_row(self._table, entity, etag), conflict)

    async def _write(
        self, operation: Callable[[], Awaitable[_T]], conflict: ConcurrencyConflict
    ) -> _T:
        with translated_errors(conflict, when=_lost, where=f"table {self._table_name}: "):
            return await creating_table(self._service, self._table_name, operation)


_EPOCH: Final = datetime(1970, 1, 1, tzinfo=UTC)
_MICROSECOND: Final = timedelta(microseconds=1)


def _to_us(moment: datetime) -> int:
    """Whole microseconds since the epoch, exact both ways: a slot read back must equal
    the one a request carries (its ISO text keeps microseconds)."""
    return (moment - _EPOCH) // _MICROSECOND


def _from_us(us: int) -> datetime:
    return _EPOCH + us * _MICROSECOND


def _to_lease(entity: Any) -> SlotLease:
    return SlotLease(
        int(entity["Slot"]),
        str(entity["Holder"]),
        utc(entity["Expires"]),
        str(entity.metadata["etag"]),
    )
