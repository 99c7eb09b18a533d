"""The Error orders grouped by step and error code, so an operator sees one line for
"412 orders, charge-payment, timeout" rather than 412 rows.

It reads the Error orders' rest entries (shared/domain/rest_index.py), which carry
each order's error group, so it costs what it shows, never the size of the table. It is
bounded too: at most `scan_cap` entries (range reads of `PAGE_SIZE`), and it says when
it stopped early.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Final

from shared.domain.failures import UNKNOWN
from shared.domain.model import ProcessState
from shared.domain.rest_index import RestEntry, RestRange
from shared.ports import RestIndex

SCAN_CAP: Final = 10_000
PAGE_SIZE: Final = 1000
SAMPLES: Final = 5


@dataclass(frozen=True)
class FailureGroup:
    step: str
    error_code: str
    count: int
    first_at: datetime
    last_at: datetime
    """When the first and the last of the group's orders last changed (went to Error)."""
    sample_order_ids: tuple[str, ...]
    """The most recent few."""


@dataclass(frozen=True)
class FailureReport:
    groups: tuple[FailureGroup, ...]
    """Largest first; ties: the most recent first."""
    scanned: int
    truncated: bool
    """The scan stopped at its cap: there may be more Error orders than counted."""


async def group_failures(store: RestIndex, scan_cap: int = SCAN_CAP) -> FailureReport:
    rows: list[RestEntry] = []
    continuation: str | None = None
    errors = RestRange(ProcessState.ERROR)
    while True:
        page = await store.rest_entries(errors, min(PAGE_SIZE, scan_cap - len(rows)), continuation)
        rows.extend(page.items[: scan_cap - len(rows)])
        continuation = page.continuation
        if continuation is None or len(rows) >= scan_cap:
            break
    return FailureReport(_groups(rows), len(rows), continuation is not None)


def _groups(rows: list[RestEntry]) -> tuple[FailureGroup, ...]:
    by_key: dict[tuple[str, str], list[RestEntry]] = {}
    for row in rows:
        key = (row.step or str(row.current_step), row.error_code or UNKNOWN)
        by_key.setdefault(key, []).append(row)
    groups = []
    for (step, code), members in by_key.items():
        members.sort(key=lambda r: r.updated_at, reverse=True)
        groups.append(
            FailureGroup(
                step=step,
                error_code=code,
                count=len(members),
                first_at=members[-1].updated_at,
                last_at=members[0].updated_at,
                sample_order_ids=tuple(r.order_id for r in members[:SAMPLES]),
            )
        )
    groups.sort(key=lambda g: (g.step, g.error_code))
    groups.sort(key=lambda g: (g.count, g.last_at), reverse=True)
    return tuple(groups)
