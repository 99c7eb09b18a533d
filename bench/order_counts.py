"""What one fault-free order costs, per shipped workflow: pinned here, once.

tests/integration/test_order_counts.py drives one order of each workflow in catalogue.json
through the app's own functions on the real Table adapter (Azurite) and fails when any
count differs, up or down, so this table changes only on purpose. `bench.compare` prints
it beside its CPU figures, and docs/capacity.md turns it into ceilings in Azure (a test
keeps that page's table equal to this one).

The wait steps are driven by that test, and their cost is in these counts:
`reviewed-order`'s approval is one `POST /api/orders/{orderId}/approval`, and
`scheduled-delivery`'s timer is a scheduled nudge delivered at its time.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from shared.contract import Queue, agent_queue


@dataclass(frozen=True)
class OrderCounts:
    """Per order: messages sent (by queue), Table Storage requests (by kind: one HTTP
    request each), trigger invocations (by function), HTTP requests to the app (by
    function) and calls to the remote services (by agent)."""

    messages: Mapping[str, int]
    table: Mapping[str, int]
    invocations: Mapping[str, int]
    http: Mapping[str, int]
    remote_calls: Mapping[str, int]

    @property
    def total_messages(self) -> int:
        return sum(self.messages.values())

    @property
    def total_table(self) -> int:
        return sum(self.table.values())

    @property
    def table_writes(self) -> int:
        """Every table request but a read or a query."""
        return sum(n for kind, n in self.table.items() if kind not in READS)

    @property
    def total_invocations(self) -> int:
        return sum(self.invocations.values())

    @property
    def total_http(self) -> int:
        return sum(self.http.values())

    @property
    def credits(self) -> int:
        """Service Bus operations: each message is sent once and received once
        (docs/capacity.md#service-bus)."""
        return 2 * self.total_messages


READS = frozenset({"point read", "query"})

_INTAKE = {"submit_order_http": 1}
_STATUS = {Queue.ORDER_STATUS: 3}
"""Received, Processing, and the final status: the intake claims the order (issue #39),
so no nudge brings it to the Scheduler."""
_THREE_STEPS = {
    agent_queue("inventory"): 1,
    agent_queue("payment"): 1,
    agent_queue("shipping"): 1,
}
_THREE_AGENTS = {"inventory_agent": 1, "payment_agent": 1, "shipping_agent": 1}
_THREE_CALLS = {"inventory": 1, "payment": 1, "shipping": 1}

PINNED: Mapping[str, OrderCounts] = {
    "order-fulfilment": OrderCounts(
        messages={**_STATUS, **_THREE_STEPS, Queue.AGENT_REPLIES: 3},
        table={"insert": 2, "If-Match replace": 3, "upsert": 1, "delete": 1},
        invocations={**_THREE_AGENTS, "scheduler_reply": 3},
        http=_INTAKE,
        remote_calls=_THREE_CALLS,
    ),
    "express-delivery": OrderCounts(
        messages={
            **_STATUS,
            **_THREE_STEPS,
            agent_queue("notifications"): 1,
            Queue.AGENT_REPLIES: 4,
        },
        table={"insert": 2, "If-Match replace": 4, "upsert": 1, "delete": 1},
        invocations={**_THREE_AGENTS, "notifications_agent": 1, "scheduler_reply": 4},
        http=_INTAKE,
        remote_calls={**_THREE_CALLS, "notifications": 1},
    ),
    "reviewed-order": OrderCounts(
        messages={**_STATUS, **_THREE_STEPS, Queue.AGENT_REPLIES: 3},
        table={"insert": 2, "If-Match replace": 4, "upsert": 3, "delete": 1, "point read": 2},
        invocations={**_THREE_AGENTS, "scheduler_reply": 3},
        http={**_INTAKE, "answer_approval_http": 1},
        remote_calls=_THREE_CALLS,
    ),
    "scheduled-delivery": OrderCounts(
        messages={**_STATUS, Queue.SCHEDULER: 1, **_THREE_STEPS, Queue.AGENT_REPLIES: 3},
        table={"insert": 2, "If-Match replace": 4, "upsert": 1, "delete": 1},
        invocations={"scheduler_nudge": 1, **_THREE_AGENTS, "scheduler_reply": 3},
        http=_INTAKE,
        remote_calls=_THREE_CALLS,
    ),
}
"""The default workflow first; the wait steps' extra hops are the test's approval and
timer (module docstring)."""

FINAL_ONLY: Mapping[str, OrderCounts] = {
    "order-fulfilment": OrderCounts(
        messages={Queue.ORDER_STATUS: 1, **_THREE_STEPS, Queue.AGENT_REPLIES: 3},
        table=PINNED["order-fulfilment"].table,
        invocations=PINNED["order-fulfilment"].invocations,
        http=_INTAKE,
        remote_calls=_THREE_CALLS,
    ),
}
"""The same order from a client that asked for the final status only (`"notify":
"final"`, as `bench.compare`'s client does): one notification, not three."""


TABLE_KINDS = ("insert", "If-Match replace", "upsert", "delete", "point read", "query")
"""The request kinds a column each in `rows`; any other kind a count holds is still
in its total."""

HEADERS = (
    "workflow",
    "messages",
    "Service Bus credits",
    "table requests",
    *TABLE_KINDS,
    "trigger invocations",
    "HTTP requests",
)


def rows(pinned: Mapping[str, OrderCounts] = PINNED) -> list[tuple[str, ...]]:
    """One row per workflow under `HEADERS`: what bench.compare prints and what
    docs/capacity.md's per-order table holds."""
    return [
        (
            name,
            str(c.total_messages),
            str(c.credits),
            str(c.total_table),
            *(str(c.table.get(kind, 0)) for kind in TABLE_KINDS),
            str(c.total_invocations),
            str(c.total_http),
        )
        for name, c in pinned.items()
    ]
