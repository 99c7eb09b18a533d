"""Ops records (agent heartbeats, Supervisor sweeps) on Azure Table Storage.

They live in the state store's table, in two partitions no order can take (order ids
start with a letter or digit, these with `~`), so the deployment needs no second table
and no second role assignment:

- `~agents`: one row per (agent, instance), RowKey `{agent}:{instance}`, upserted on
  every heartbeat, so the partition holds as many rows as there are live views.
  The operators' drain flags share it, one row per agent, RowKey `~drain:{agent}` (after
  every heartbeat key, and without a `HeartbeatAt`, so sweeps of silent instances never
  touch them): the Scheduler's routing refresh reads heartbeats and drains in one query.
- `~sweeps`: one row per sweep, RowKey `{inverted started-at}:{instance}`, so the
  service's own key order is newest first and `recent_sweeps(n)` reads n rows.
  Growth is bounded by age: each `record_sweep` deletes (in one batch) up to
  `_PRUNE_BATCH` rows older than `retention` before its own `started_at`. A sweep adds
  one row and removes up to that many, so the partition holds about one retention
  window of sweeps (schedule rate x instances x retention), however long it runs.
- `~outages`: one row per instance, RowKey its name, the broker and store outages it saw
  (JSON), replaced when they change; a share deletes the rows of instances whose last
  outage ended more than `retention` ago, so the partition holds the recent ones.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from typing import Any, Final, TypeVar

from azure.core import MatchConditions
from azure.core.exceptions import (
    ResourceModifiedError,
    ResourceNotFoundError,
)
from azure.data.tables import TableTransactionError, UpdateMode
from azure.data.tables.aio import TableClient, TableServiceClient

from shared.adapters.table.conditional import creating_table
from shared.adapters.table.errors import refused_with, translated_errors
from shared.adapters.table.rows import utc, utc_or_none
from shared.domain.health import (
    AgentDrain,
    AgentHealth,
    AgentRecords,
    BreakerState,
    SeenOutages,
    SweepRecord,
)

AGENTS_PARTITION: Final = "~agents"
SWEEPS_PARTITION: Final = "~sweeps"
OUTAGES_PARTITION: Final = "~outages"
DRAIN_KEY_PREFIX: Final = "~drain:"
SWEEP_RETENTION: Final = timedelta(hours=1)
_PRUNE_BATCH: Final = 25
_EPOCH: Final = datetime(1970, 1, 1, tzinfo=UTC)
_KEY_WIDTH: Final = 19
_KEY_CEILING: Final = 10**_KEY_WIDTH - 1
_FORBIDDEN_IN_KEYS: Final = str.maketrans({c: "_" for c in "/\\#?\t\n\r"})
_T = TypeVar("_T")


def sweep_row_key(started_at: datetime, instance: str) -> str:
    """Inverted microseconds since the epoch, zero-padded: later sweeps sort first."""
    micros = (started_at - _EPOCH) // timedelta(microseconds=1)
    return f"{_KEY_CEILING - micros:0{_KEY_WIDTH}d}:{_key_part(instance)}"


def agent_row_key(agent: str, instance: str) -> str:
    return f"{_key_part(agent)}:{_key_part(instance)}"


def drain_row_key(agent: str) -> str:
    return f"{DRAIN_KEY_PREFIX}{_key_part(agent)}"


def _key_part(value: str) -> str:
    """Table keys may not contain / \\ # ? or control characters."""
    return value.translate(_FORBIDDEN_IN_KEYS)


class TableHealthStore:
    """Shares the state store's TableServiceClient; closes only its own table client."""

    def __init__(
        self,
        service: TableServiceClient,
        table_name: str,
        retention: timedelta = SWEEP_RETENTION,
    ) -> None:
        self._service = service
        self._table: TableClient = service.get_table_client(table_name)
        self._table_name = table_name
        self._retention = retention

    async def close(self) -> None:
        await self._table.close()

    async def publish_health(self, health: AgentHealth) -> None:
        entity = _health_entity(health)
        await self._write(lambda: self._table.upsert_entity(entity, mode=UpdateMode.REPLACE))

    async def agent_health(self) -> tuple[AgentHealth, ...]:
        return (await self.agent_records()).health

    async def agent_records(self) -> AgentRecords:
        entities = await self._read(
            "PartitionKey eq @pk", {"pk": AGENTS_PARTITION}, limit=None, select=None
        )
        drains = [e for e in entities if str(e["RowKey"]).startswith(DRAIN_KEY_PREFIX)]
        beats = [e for e in entities if not str(e["RowKey"]).startswith(DRAIN_KEY_PREFIX)]
        health = sorted((_to_health(e) for e in beats), key=lambda h: (h.agent, h.instance))
        return AgentRecords(
            tuple(health), tuple(sorted((_to_drain(e) for e in drains), key=lambda d: d.agent))
        )

    async def set_drain(self, drain: AgentDrain) -> None:
        entity = _drain_entity(drain)
        await self._write(lambda: self._table.upsert_entity(entity, mode=UpdateMode.REPLACE))

    async def forget_agents(self, silent_since: datetime) -> int:
        """Keys only; one delete per row, each conditional on the row not having been
        refreshed since it was read (a revived instance keeps its newer heartbeat)."""
        silent = await self._read(
            "PartitionKey eq @pk and HeartbeatAt lt @cut",
            {"pk": AGENTS_PARTITION, "cut": silent_since},
            limit=_PRUNE_BATCH,
            select=["PartitionKey", "RowKey"],
        )
        return await self._delete_unchanged(silent)

    async def record_sweep(self, sweep: SweepRecord) -> None:
        entity = _sweep_entity(sweep)
        await self._write(lambda: self._table.upsert_entity(entity, mode=UpdateMode.REPLACE))
        await self._prune(sweep.started_at - self._retention)

    async def recent_sweeps(self, limit: int) -> tuple[SweepRecord, ...]:
        if limit <= 0:
            return ()
        entities = await self._read(
            "PartitionKey eq @pk", {"pk": SWEEPS_PARTITION}, limit=limit, select=None
        )
        return tuple(_to_sweep(e) for e in entities)

    async def share_outages(self, seen: SeenOutages) -> None:
        entity = _outages_entity(seen)
        await self._write(lambda: self._table.upsert_entity(entity, mode=UpdateMode.REPLACE))
        ended = await self._read(
            "PartitionKey eq @pk and Until lt @cut",
            {"pk": OUTAGES_PARTITION, "cut": seen.at - self._retention},
            limit=_PRUNE_BATCH,
            select=["PartitionKey", "RowKey"],
        )
        await self._delete_unchanged(ended)

    async def seen_outages(self) -> tuple[SeenOutages, ...]:
        rows = await self._read(
            "PartitionKey eq @pk", {"pk": OUTAGES_PARTITION}, limit=None, select=None
        )
        return tuple(_to_outages(row) for row in rows)

    async def _delete_unchanged(self, rows: list[Any]) -> int:
        """One delete per row, each conditional on the row as read: a row refreshed since
        (a revived instance) or already gone stays as it is. Returns how many went."""
        deleted = 0
        for row in rows:
            with translated_errors(when=_revived_or_gone):
                await self._table.delete_entity(
                    row["PartitionKey"],
                    row["RowKey"],
                    etag=row.metadata["etag"],
                    match_condition=MatchConditions.IfNotModified,
                )
                deleted += 1
        return deleted

    async def _prune(self, older_than: datetime) -> None:
        """One small query (keys only) and at most one batch; usually finds nothing."""
        expired = await self._read(
            "PartitionKey eq @pk and RowKey gt @cut",
            {"pk": SWEEPS_PARTITION, "cut": sweep_row_key(older_than, "~")},
            limit=_PRUNE_BATCH,
            select=["PartitionKey", "RowKey"],
        )
        if not expired:
            return
        operations: list[Any] = [("delete", e) for e in expired]
        # a refused batch: another instance pruned the same rows first; the next sweep retries
        with translated_errors(when=refused_with(TableTransactionError)):
            await self._table.submit_transaction(operations)

    async def _write(self, operation: Callable[[], Awaitable[_T]]) -> _T:
        with translated_errors(where=f"table {self._table_name}: "):
            return await creating_table(self._service, self._table_name, operation)

    async def _read(
        self,
        query: str,
        parameters: dict[str, Any],
        *,
        limit: int | None,
        select: list[str] | None,
    ) -> list[Any]:
        """The first `limit` rows in key order (all of them without a limit); a missing
        table reads as empty."""
        found: list[Any] = []
        with translated_errors(where=f"table {self._table_name}: "):
            try:
                pager = self._table.query_entities(
                    query, parameters=parameters, select=select, results_per_page=limit
                )
                async for entity in pager:
                    found.append(entity)
                    if limit is not None and len(found) >= limit:
                        break
            except ResourceNotFoundError:
                return []
        return found


_revived_or_gone = refused_with(ResourceNotFoundError, ResourceModifiedError)
"""A silent agent's row was refreshed (the instance came back) or deleted since it was read."""


def _health_entity(health: AgentHealth) -> dict[str, Any]:
    entity: dict[str, Any] = {
        "PartitionKey": AGENTS_PARTITION,
        "RowKey": agent_row_key(health.agent, health.instance),
        "Agent": health.agent,
        "Instance": health.instance,
        "Breaker": health.breaker.value,
        "SuccessRate": float(health.success_rate),
        "LatencyMs": float(health.latency_ms),
        "InFlight": health.in_flight,
        "Capacity": health.capacity,
        "Calls": health.calls,
        "HeartbeatAt": health.heartbeat_at,
    }
    if health.open_until is not None:
        entity["OpenUntil"] = health.open_until
    if health.max_concurrent is not None:
        entity["MaxConcurrent"] = health.max_concurrent
    if health.calls_per_second is not None:
        entity["CallsPerSecond"] = float(health.calls_per_second)
    entity["Rate"] = float(health.rate)
    entity["Throttled"] = health.throttled
    if health.last_limited_at is not None:
        entity["LastLimitedAt"] = health.last_limited_at
    return entity


def _to_health(entity: Any) -> AgentHealth:
    open_until = entity.get("OpenUntil")
    return AgentHealth(
        agent=str(entity["Agent"]),
        instance=str(entity["Instance"]),
        breaker=BreakerState(entity["Breaker"]),
        success_rate=float(entity["SuccessRate"]),
        latency_ms=float(entity["LatencyMs"]),
        in_flight=int(entity["InFlight"]),
        capacity=int(entity["Capacity"]),
        calls=int(entity["Calls"]),
        heartbeat_at=utc(entity["HeartbeatAt"]),
        open_until=utc_or_none(open_until),
        max_concurrent=_int_or_none(entity.get("MaxConcurrent")),
        calls_per_second=_float_or_none(entity.get("CallsPerSecond")),
        rate=float(entity.get("Rate", 0.0)),
        throttled=int(entity.get("Throttled", 0)),
        last_limited_at=utc_or_none(entity.get("LastLimitedAt")),
    )


def _int_or_none(value: Any) -> int | None:
    return None if value is None else int(value)


def _float_or_none(value: Any) -> float | None:
    return None if value is None else float(value)


def _drain_entity(drain: AgentDrain) -> dict[str, Any]:
    entity: dict[str, Any] = {
        "PartitionKey": AGENTS_PARTITION,
        "RowKey": drain_row_key(drain.agent),
        "Agent": drain.agent,
        "Drained": drain.drained,
        "Since": drain.since,
        "By": drain.by,
    }
    if drain.reason is not None:
        entity["Reason"] = drain.reason
    return entity


def _to_drain(entity: Any) -> AgentDrain:
    reason = entity.get("Reason")
    return AgentDrain(
        agent=str(entity["Agent"]),
        drained=bool(entity["Drained"]),
        reason=None if reason is None else str(reason),
        since=utc(entity["Since"]),
        by=str(entity.get("By", "operator")),
    )


def _outages_entity(seen: SeenOutages) -> dict[str, Any]:
    windows = [[start.isoformat(), end.isoformat()] for start, end in seen.windows]
    return {
        "PartitionKey": OUTAGES_PARTITION,
        "RowKey": _key_part(seen.instance),
        "Instance": seen.instance,
        "At": seen.at,
        "Until": seen.until,
        "Windows": json.dumps(windows),
    }


def _to_outages(entity: Any) -> SeenOutages:
    windows = tuple((utc(start), utc(end)) for start, end in json.loads(str(entity["Windows"])))
    return SeenOutages(str(entity["Instance"]), windows, utc(entity["At"]))


_SWEEP_COUNTS: Final = (
    ("due", "Due"),
    ("requeued", "Requeued"),
    ("errored", "Errored"),
    ("compensating", "Compensating"),
    ("rescheduled", "Rescheduled"),
    ("finished", "Finished"),
    ("lost_races", "LostRaces"),
    ("failed", "Failed"),
)


def _sweep_entity(sweep: SweepRecord) -> dict[str, Any]:
    return {
        "PartitionKey": SWEEPS_PARTITION,
        "RowKey": sweep_row_key(sweep.started_at, sweep.instance),
        "Instance": sweep.instance,
        "StartedAt": sweep.started_at,
        "FinishedAt": sweep.finished_at,
        **{column: getattr(sweep, name) for name, column in _SWEEP_COUNTS},
    }


def _to_sweep(entity: Any) -> SweepRecord:
    counts = {name: int(entity.get(column, 0)) for name, column in _SWEEP_COUNTS}
    return SweepRecord(
        instance=str(entity["Instance"]),
        started_at=utc(entity["StartedAt"]),
        finished_at=utc(entity["FinishedAt"]),
        **counts,
    )
