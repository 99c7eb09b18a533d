"""The order load: a seeded mix of orders, submitted over HTTP at a steady rate.

Submission is the harness's load driver: orders go to the runtimes in turn; when one does
not answer (it may just have been killed) or answers 5xx (an injected crash), the order is
sent again to the other one. Submission is idempotent on the order id, so a retry never
makes a second order.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta

import aiohttp

from chaos.config import ChaosConfig, failing_sku, services_of
from chaos.model import Accepted, PlannedOrder
from devhost.harness.load import Admission, Load, LoadRun, Retry, Target, Tracked
from shared.domain.model import Notify


def plan_orders(config: ChaosConfig, run_id: str) -> list[PlannedOrder]:
    """`config.orders` orders, spread over the workflows of the mix; a share of them
    carry a SKU one service of their workflow always rejects, spread over every
    (workflow, service) pair so each step's failure path is exercised: compensation
    before the pivot, the hold in Error at a retriable step."""
    rng = random.Random(config.seed)
    count = config.orders
    workflows = [config.workflow_of(i) for i in range(count)]
    later = _not_before_offsets(config, workflows)
    final_only = _final_only(config)
    pairs = [(w.name, service) for w in config.mix for service in services_of(w)]
    failing = 0
    if config.failing_share:
        failing = min(count, max(len(pairs), round(count * config.failing_share)))
    wanted = [pairs[k % len(pairs)] for k in range(failing)]
    rng.shuffle(wanted)
    free: dict[str, list[int]] = {}
    for i, name in enumerate(workflows):
        free.setdefault(name, []).append(i)
    failing_at: dict[int, str] = {}
    for name, rejecting in wanted:
        if free[name]:
            i = free[name].pop(rng.randrange(len(free[name])))
            failing_at[i] = rejecting
    planned = []
    for i in range(count):
        items: list[dict[str, object]] = [
            {
                "sku": f"SKU-{rng.randint(1, 40):03d}",
                "quantity": rng.randint(1, 4),
                "unitPrice": round(rng.uniform(2, 80), 2),
            }
            for _ in range(rng.randint(1, 3))
        ]
        service = failing_at.get(i)
        if service is not None:
            rejected = {"sku": failing_sku(service), "quantity": 1, "unitPrice": 10.0}
            items.insert(rng.randint(0, len(items)), rejected)
        order_id = f"{run_id}-{i:05d}"
        body = {
            "orderId": order_id,
            "customerId": f"cust-{rng.randint(1, 50)}",
            "items": items,
            "workflow": workflows[i],
        }
        if i in final_only:
            body["notify"] = Notify.FINAL.value
        planned.append(PlannedOrder(order_id, body, service, workflows[i], later.get(i)))
    return planned


def _not_before_offsets(config: ChaosConfig, workflows: list[str]) -> dict[int, float]:
    """Seconds after its slot each order of a workflow waiting for `notBefore` may ship
    (a generator of its own, so the rest of the plan stays as it was)."""
    rng = random.Random(config.seed * 7919 + 3)
    waits = {w.name for w in config.mix if any(s.until == "notBefore" for s in w.steps)}
    span = config.schedules
    return {
        i: round(rng.uniform(span.min_seconds, span.max_seconds), 2)
        for i, name in enumerate(workflows)
        if name in waits
    }


def _final_only(config: ChaosConfig) -> set[int]:
    """The orders whose client asks for the final status only (a generator of its own,
    so the rest of the plan stays as it was)."""
    rng = random.Random(config.seed * 104729 + 11)
    return {i for i in range(config.orders) if rng.random() < config.final_share}


SUBMIT_RETRY = Retry(attempts=None, within=120.0, step=0.1, cap=1.0, request_timeout=15.0)
"""Ride out a killed or crashing runtime for two minutes, alternating runtimes."""


async def submit_all(
    session: aiohttp.ClientSession,
    targets: Sequence[Target],
    planned: Sequence[PlannedOrder],
    rate: float,
    concurrency: int,
    started: float,
    on_accepted: Callable[[Accepted], None] | None = None,
    admission: Admission | None = None,
) -> list[Accepted]:
    """The harness's load driver with chaos's pace: order i leaves at `started + i / rate`
    at the earliest, when fewer than `concurrency` submissions are under way and
    `admission` lets it in. The first order not accepted (SubmitError) cancels the rest."""

    def accepted(order: Tracked) -> Accepted:
        at = (order.accepted or started) - started
        return Accepted(order.order_id, at, order.runtime, order.tries)

    orders = [Tracked(p.order_id, dict(p.body)) for p in planned]
    # A notBefore counted from the order's slot in the load, so it is still ahead when
    # the order is submitted (unless the window or an outage held the order back).
    wall = datetime.now(UTC) - timedelta(seconds=time.monotonic() - started)
    for i, (order, p) in enumerate(zip(orders, planned, strict=True)):
        if p.not_before_after is not None:
            at = wall + timedelta(seconds=i / rate + p.not_before_after)
            order.body["notBefore"] = at.isoformat()
    run = LoadRun(
        orders,
        Load(rate=rate, submitting=concurrency),
        targets,
        retry=SUBMIT_RETRY,
        admission=admission,
        on_submitted=None if on_accepted is None else lambda o: on_accepted(accepted(o)),
    )
    await run.submit(session, started=started)
    return [accepted(o) for o in orders]
