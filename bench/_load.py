"""The load driver: orders over HTTP at a rate or a concurrency, completions as they happen.

Completions come from what a client of the system would watch, not from polling the
system under test: for ours, the ``order-status`` queue (read in receive-and-delete mode
with the real SDK); for the peer, its completions feed. Both carry server timestamps of
intake and of the end, so latency is measured from intake to Processed on the server
clock and, separately, from the moment the driver sent the POST to the moment it saw the
completion.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Protocol

import aiohttp
from azure.servicebus import ServiceBusReceiveMode
from azure.servicebus.aio import ServiceBusClient

from bench._common import LatencySummary
from shared.contract import Queue

DONE = frozenset({"Processed", "Compensated"})
SUBMIT_RETRIES = 5


def parse_time(value: str) -> datetime:
    return datetime.fromisoformat(value.replace("Z", "+00:00"))


@dataclass
class Tracked:
    order_id: str
    submitted: float = 0.0
    accepted: float | None = None
    created_at: datetime | None = None
    finished_at: datetime | None = None
    observed: float | None = None
    state: str | None = None
    done: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def server_latency(self) -> float | None:
        if self.created_at is None or self.finished_at is None:
            return None
        return (self.finished_at - self.created_at).total_seconds()

    @property
    def client_latency(self) -> float | None:
        if self.observed is None or not self.submitted:
            return None
        return self.observed - self.submitted


OnEvent = Callable[[str, str, datetime | None], None]


class CompletionSource(Protocol):
    async def run(self, on_event: OnEvent, stop: asyncio.Event) -> None: ...


class StatusQueue:
    """Our system's client view: status notifications on ``order-status``."""

    def __init__(self, connection_string: str, queue: str = Queue.ORDER_STATUS) -> None:
        self.connection_string = connection_string
        self.queue = queue
        self.received = 0

    async def run(self, on_event: OnEvent, stop: asyncio.Event) -> None:
        async with (
            ServiceBusClient.from_connection_string(self.connection_string) as client,
            client.get_queue_receiver(
                self.queue,
                receive_mode=ServiceBusReceiveMode.RECEIVE_AND_DELETE,
                prefetch_count=0,
            ) as receiver,
        ):
            while not stop.is_set():
                batch = await receiver.receive_messages(max_message_count=250, max_wait_time=0.2)
                for message in batch:
                    self.received += 1
                    try:
                        body = json.loads(b"".join(message.body))
                    except (ValueError, TypeError):
                        continue
                    at = body.get("at")
                    on_event(
                        str(body.get("orderId", "")),
                        str(body.get("status", "")),
                        parse_time(at) if isinstance(at, str) else None,
                    )


class CompletionsFeed:
    """The peer's client view: GET {base}/completions?after=N, long-polled."""

    def __init__(self, base: str) -> None:
        self.base = base
        self.received = 0

    async def run(self, on_event: OnEvent, stop: asyncio.Event) -> None:
        after = 0
        async with aiohttp.ClientSession() as session:
            while not stop.is_set():
                try:
                    async with session.get(
                        f"{self.base}/completions", params={"after": str(after)}
                    ) as r:
                        data: dict[str, Any] = await r.json()
                except (aiohttp.ClientError, TimeoutError, ValueError):
                    await asyncio.sleep(0.2)
                    continue
                for event in data.get("events", []):
                    self.received += 1
                    for status, key in (("Received", "createdAt"), (event["state"], "finishedAt")):
                        on_event(event["orderId"], status, parse_time(event[key]))
                after = int(data.get("next", after))
                if not data.get("events"):
                    await asyncio.sleep(0.05)


@dataclass(frozen=True)
class Load:
    """Closed loop (at most `concurrency` orders in flight) or open loop (`rate` per second)."""

    concurrency: int | None = None
    rate: float | None = None

    def describe(self) -> str:
        if self.rate is not None:
            return f"open loop, {self.rate:g} orders/s offered"
        return f"closed loop, {self.concurrency} orders in flight"


@dataclass
class LoadResult:
    load: Load
    orders: list[Tracked]
    started: float
    ended: float
    submit_seconds: float

    @property
    def finished(self) -> list[Tracked]:
        return [o for o in self.orders if o.state in DONE]

    @property
    def processed(self) -> int:
        return sum(1 for o in self.orders if o.state == "Processed")

    @property
    def elapsed(self) -> float:
        return self.ended - self.started

    @property
    def throughput(self) -> float:
        return len(self.finished) / self.elapsed if self.elapsed > 0 else 0.0

    @property
    def submit_rate(self) -> float:
        return len(self.orders) / self.submit_seconds if self.submit_seconds > 0 else 0.0

    @property
    def server(self) -> LatencySummary:
        return LatencySummary.of(
            [v for o in self.orders if o.state == "Processed" and (v := o.server_latency)]
        )

    @property
    def client(self) -> LatencySummary:
        return LatencySummary.of(
            [v for o in self.orders if o.state == "Processed" and (v := o.client_latency)]
        )


def order_body(order_id: str, rng: random.Random) -> dict[str, Any]:
    return {
        "orderId": order_id,
        "customerId": f"cust-{rng.randint(1, 500)}",
        "items": [
            {
                "sku": f"SKU-{rng.randint(1, 40):03d}",
                "quantity": rng.randint(1, 4),
                "unitPrice": round(rng.uniform(2, 80), 2),
            }
            for _ in range(rng.randint(1, 3))
        ],
    }


async def _post(session: aiohttp.ClientSession, url: str, body: dict[str, Any]) -> None:
    for attempt in range(SUBMIT_RETRIES):
        try:
            async with session.post(url, json=body) as r:
                if r.status in (200, 202):
                    return
                text = await r.text()
                if r.status < 500:
                    raise RuntimeError(f"order {body['orderId']} refused: {r.status} {text}")
        except (aiohttp.ClientError, TimeoutError):
            pass
        await asyncio.sleep(0.2 * (attempt + 1))
    raise RuntimeError(f"order {body['orderId']} could not be submitted")


async def run_load(
    submit_url: str,
    order_ids: list[str],
    load: Load,
    source: CompletionSource,
    *,
    timeout: float,
    seed: int = 7,
    on_progress: Callable[[int, int], None] | None = None,
    before_start: Callable[[], Awaitable[None]] | None = None,
) -> LoadResult:
    """Submit every order and wait (bounded by `timeout`) until each has finished."""
    rng = random.Random(seed)
    tracked = {order_id: Tracked(order_id) for order_id in order_ids}
    bodies = {order_id: order_body(order_id, rng) for order_id in order_ids}
    finished = 0

    def on_event(order_id: str, status: str, at: datetime | None) -> None:
        nonlocal finished
        order = tracked.get(order_id)
        if order is None:
            return
        if status == "Received" and at is not None:
            order.created_at = at
        elif status in DONE and order.state not in DONE:
            order.state = status
            order.finished_at = at
            order.observed = time.monotonic()
            order.done.set()
            finished += 1
            if on_progress is not None:
                on_progress(finished, len(tracked))

    stop = asyncio.Event()
    watcher = asyncio.create_task(source.run(on_event, stop))

    def on_watcher_end(task: asyncio.Task[None]) -> None:
        # A dead completion source would leave every wait to the timeout: end them now.
        if not stop.is_set():
            for order in tracked.values():
                order.done.set()

    watcher.add_done_callback(on_watcher_end)
    connector = aiohttp.TCPConnector(limit=64)
    timeouts = aiohttp.ClientTimeout(total=60)
    submit_done = 0.0
    try:
        async with aiohttp.ClientSession(connector=connector, timeout=timeouts) as session:
            if before_start is not None:
                await before_start()
            started = time.monotonic()
            end_by = started + timeout

            async def submit(order: Tracked) -> None:
                order.submitted = time.monotonic()
                await _post(session, submit_url, bodies[order.order_id])
                order.accepted = time.monotonic()

            async def wait_done(order: Tracked) -> None:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(order.done.wait(), max(end_by - time.monotonic(), 0))

            orders = list(tracked.values())
            if load.rate is not None:
                interval = 1.0 / load.rate

                async def paced(i: int, order: Tracked) -> None:
                    await asyncio.sleep(max(started + i * interval - time.monotonic(), 0))
                    await submit(order)

                await asyncio.gather(*(paced(i, o) for i, o in enumerate(orders)))
                submit_done = time.monotonic() - started
                await asyncio.gather(*(wait_done(o) for o in orders))
            else:
                gate = asyncio.Semaphore(load.concurrency or 1)
                submitted = 0

                async def closed(order: Tracked) -> None:
                    nonlocal submitted, submit_done
                    async with gate:
                        if time.monotonic() > end_by:
                            return
                        await submit(order)
                        submitted += 1
                        if submitted == len(orders):
                            submit_done = time.monotonic() - started
                        await wait_done(order)

                await asyncio.gather(*(closed(o) for o in orders))
            ended = max((o.observed for o in orders if o.observed), default=time.monotonic())
    finally:
        stop.set()
        try:
            await asyncio.wait_for(watcher, 10)
        except (TimeoutError, asyncio.CancelledError):
            watcher.cancel()
        except Exception:  # the watcher's own failure must not hide the result
            watcher.cancel()
    if watcher.done() and not watcher.cancelled() and (exc := watcher.exception()) is not None:
        raise RuntimeError(f"completion source failed: {exc!r}") from exc
    return LoadResult(load, orders, started, ended, submit_done or (ended - started))
