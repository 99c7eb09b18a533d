"""Reconciliation on Azure Table Storage: the sample of orders at rest, and the runs.

The sample reads the rest states' entries of the window's days
(shared/adapters/finished_sample.py), never a filter over every state row, then loads
the sampled orders, since the check needs each step's agent.

Runs are rows in the state table's `~reconcile` partition (RowKey: inverted start time
and instance, newest first, as the Supervisor's sweeps), each with its first
`KEPT_MISMATCHES` mismatches as JSON; each run deletes up to a batch of rows older
than `retention`, so the partition stays about one retention window of runs.
"""

from __future__ import annotations

import json
from datetime import datetime, timedelta
from typing import Any, Final

from azure.data.tables import TableTransactionError, UpdateMode

from shared.adapters.finished_sample import finished_sample
from shared.adapters.table.errors import refused_with, translated_errors
from shared.adapters.table.health import sweep_row_key
from shared.adapters.table.rows import utc
from shared.adapters.table.store import TableStateStore
from shared.domain.model import OrderProcess, ProcessState
from shared.domain.reconcile import MISMATCH_REASON, Mismatch, ReconcileRun

RECONCILE_PARTITION: Final = "~reconcile"
KEPT_MISMATCHES: Final = 50
"""Mismatches kept per run (the alerts carry every one): a row stays well under 1 MB."""
RUN_RETENTION: Final = timedelta(days=7)
_PRUNE_BATCH: Final = 25


class TableReconcileStore:
    """Shares the state store's table client (and its table's creation)."""

    def __init__(self, store: TableStateStore, retention: timedelta = RUN_RETENTION) -> None:
        self._store = store
        self._retention = retention

    async def finished_sample(
        self, since: datetime, start: str, limit: int
    ) -> tuple[OrderProcess, ...]:
        return await finished_sample(self._store, since, start, limit)

    async def record_run(self, run: ReconcileRun) -> None:
        await self._store.ensure_table()
        entity = _run_entity(run)
        with translated_errors():
            await self._store.table.upsert_entity(entity, mode=UpdateMode.REPLACE)
        await self._prune(run.started_at - self._retention)

    async def recent_runs(self, limit: int) -> tuple[ReconcileRun, ...]:
        if limit <= 0:
            return ()
        await self._store.ensure_table()
        found: list[Any] = []
        with translated_errors():
            async for entity in self._store.table.query_entities(
                "PartitionKey eq @pk",
                parameters={"pk": RECONCILE_PARTITION},
                results_per_page=limit,
            ):
                found.append(entity)
                if len(found) >= limit:
                    break
        return tuple(_to_run(e) for e in found)

    async def _prune(self, older_than: datetime) -> None:
        """Keys only, one batch at most; usually finds nothing."""
        expired: list[Any] = []
        with translated_errors():
            async for entity in self._store.table.query_entities(
                "PartitionKey eq @pk and RowKey gt @cut",
                parameters={"pk": RECONCILE_PARTITION, "cut": sweep_row_key(older_than, "~")},
                select=["PartitionKey", "RowKey"],
                results_per_page=_PRUNE_BATCH,
            ):
                expired.append(entity)
                if len(expired) >= _PRUNE_BATCH:
                    break
        if not expired:
            return
        # refused: another instance pruned the same rows first; the next run retries
        with translated_errors(when=refused_with(TableTransactionError)):
            await self._store.table.submit_transaction([("delete", e) for e in expired])


def _run_entity(run: ReconcileRun) -> dict[str, Any]:
    return {
        "PartitionKey": RECONCILE_PARTITION,
        "RowKey": sweep_row_key(run.started_at, run.instance),
        "Instance": run.instance,
        "StartedAt": run.started_at,
        "FinishedAt": run.finished_at,
        "Orders": run.orders,
        "Queries": run.queries,
        "Unknown": run.unknown,
        "MismatchCount": len(run.mismatches),
        "Mismatches": json.dumps([_mismatch_json(m) for m in run.mismatches[:KEPT_MISMATCHES]]),
    }


def _mismatch_json(m: Mismatch) -> dict[str, str]:
    return {
        "orderId": m.order_id,
        "state": m.state.value,
        "step": m.step,
        "agent": m.agent,
        "key": m.key,
        "expected": m.expected,
        "found": m.found,
        "reason": m.reason,
    }


def _to_mismatch(data: dict[str, str]) -> Mismatch:
    return Mismatch(
        order_id=data["orderId"],
        state=ProcessState(data["state"]),
        step=data["step"],
        agent=data["agent"],
        key=data["key"],
        expected=data["expected"],
        found=data["found"],
        reason=data.get("reason", MISMATCH_REASON),
    )


def _to_run(entity: Any) -> ReconcileRun:
    return ReconcileRun(
        instance=str(entity["Instance"]),
        started_at=utc(entity["StartedAt"]),
        finished_at=utc(entity["FinishedAt"]),
        orders=int(entity.get("Orders", 0)),
        queries=int(entity.get("Queries", 0)),
        unknown=int(entity.get("Unknown", 0)),
        mismatches=tuple(_to_mismatch(m) for m in json.loads(str(entity.get("Mismatches", "[]")))),
    )
