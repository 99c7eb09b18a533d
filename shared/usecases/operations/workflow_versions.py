"""Which workflow versions orders still run on, and whether a catalogue keeps them all.

A deploy whose catalogue drops a version with orders still in flight would strand them:
their next step has no definition. `workflows check --against` runs this before the
deploy; the Supervisor alerts if such an order is met after one anyway.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from shared.domain.model import ProcessState
from shared.domain.workflow import Catalogue
from shared.ports import OrderRows

IN_FLIGHT = tuple(s for s in ProcessState if not s.is_final)
"""Error and Suspended orders too: an operator may move them on, on their version."""
PAGE = 1000


@dataclass(frozen=True)
class Stranded:
    workflow: str
    version: int
    orders: int
    sample_order_id: str


async def versions_in_flight(store: OrderRows) -> dict[tuple[str, int], list[str]]:
    """Every order's pinned (workflow, version), with its order ids, while it is not final. A scan
    of the state rows: an offline check before a deploy, never on a request's path."""
    found: dict[tuple[str, int], list[str]] = {}
    for state in IN_FLIGHT:
        continuation: str | None = None
        while True:
            page = await store.list_by_state(state, PAGE, continuation)
            for row in page.items:
                found.setdefault((row.workflow, row.workflow_version), []).append(row.order_id)
            continuation = page.continuation
            if continuation is None:
                break
    return found


def stranded(catalogue: Catalogue, in_flight: dict[tuple[str, int], list[str]]) -> list[Stranded]:
    """The pinned versions this catalogue no longer keeps, most orders first."""
    gone = [
        Stranded(name, version, len(ids), ids[0])
        for (name, version), ids in in_flight.items()
        if catalogue.get(name, version) is None
    ]
    return sorted(gone, key=lambda s: (-s.orders, s.workflow, s.version))


def counts(in_flight: dict[tuple[str, int], list[str]]) -> Counter[tuple[str, int]]:
    return Counter({key: len(ids) for key, ids in in_flight.items()})
