"""The order load: a seeded mix of orders, submitted over HTTP at a steady rate.

Orders go to the runtimes in turn; when one does not answer (it may just have been
killed) or answers 5xx (an injected crash), the order is sent again to the other one.
Submission is idempotent on the order id, so a retry never makes a second order.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable, Sequence
from typing import Protocol

import aiohttp

from chaos.config import SERVICES, ChaosConfig, failing_sku
from chaos.model import Accepted, PlannedOrder
from devhost.harness.clients import AppClient

SUBMIT_TIMEOUT_SECONDS = 120.0
REQUEST_TIMEOUT_SECONDS = 15.0


class LoadError(RuntimeError):
    """An order could not be submitted at all, or was refused (a bug in the load)."""


class Admission(Protocol):
    """Holds a submission back while too many orders are unfinished."""

    async def admit(self) -> None: ...

    def release(self) -> None: ...


def plan_orders(config: ChaosConfig, run_id: str) -> list[PlannedOrder]:
    """`config.orders` orders; a share of them carry a SKU one service always rejects,
    spread over the services so each step's compensation path is exercised."""
    rng = random.Random(config.seed)
    count = config.orders
    failing = min(count, max(1, round(count * config.failing_share))) if config.failing_share else 0
    services = [SERVICES[k % len(SERVICES)] for k in range(failing)]
    rng.shuffle(services)
    failing_at = dict(zip(sorted(rng.sample(range(count), failing)), services, strict=True))
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
        body = {"orderId": order_id, "customerId": f"cust-{rng.randint(1, 50)}", "items": items}
        planned.append(PlannedOrder(order_id, body, service))
    return planned


async def submit_one(
    session: aiohttp.ClientSession,
    targets: Sequence[tuple[str, str]],
    order: PlannedOrder,
    first: int,
    started: float,
) -> Accepted:
    """POST until some runtime answers 202, alternating runtimes on every failure.

    `targets` are (runtime name, API base URL) pairs.
    """
    deadline = time.monotonic() + SUBMIT_TIMEOUT_SECONDS
    tries = 0
    last = ""
    while time.monotonic() < deadline:
        name, api = targets[(first + tries) % len(targets)]
        tries += 1
        try:
            app = AppClient(session, api)
            status, answer = await app.submit(order.body, timeout=REQUEST_TIMEOUT_SECONDS)
            if status == 202:
                return Accepted(order.order_id, time.monotonic() - started, name, tries)
            if status < 500:
                raise LoadError(f"order {order.order_id} refused: {status} {str(answer)[:300]}")
            last = f"{status} {str(answer)[:200]}"
        except (aiohttp.ClientError, TimeoutError) as exc:
            last = f"{type(exc).__name__}: {exc}"
        await asyncio.sleep(min(0.1 * tries, 1.0))
    raise LoadError(f"order {order.order_id} not accepted after {tries} tries; last: {last}")


async def submit_all(
    session: aiohttp.ClientSession,
    targets: Sequence[tuple[str, str]],
    planned: Sequence[PlannedOrder],
    rate: float,
    concurrency: int,
    started: float,
    on_accepted: Callable[[Accepted], None] | None = None,
    admission: Admission | None = None,
) -> list[Accepted]:
    """Order i leaves at `started + i / rate` at the earliest, when fewer than
    `concurrency` submissions are under way and `admission` lets it in."""
    gate = asyncio.Semaphore(concurrency)

    async def one(i: int, order: PlannedOrder) -> Accepted:
        await asyncio.sleep(max(0.0, started + i / rate - time.monotonic()))
        async with gate:
            if admission is not None:
                await admission.admit()
            try:
                accepted = await submit_one(session, targets, order, i % len(targets), started)
                if on_accepted is not None:
                    on_accepted(accepted)
            finally:
                if admission is not None:
                    admission.release()
        return accepted

    tasks = [asyncio.ensure_future(one(i, order)) for i, order in enumerate(planned)]
    try:
        return list(await asyncio.gather(*tasks))
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
