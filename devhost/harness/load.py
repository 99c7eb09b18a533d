"""The load driver: orders over HTTP at a pace, completions followed as a client would.

One run goes through four phases: plan (the orders and their bodies, seeded), submit
(each order at its slot of an open-loop rate, while fewer than `concurrency` orders are
unfinished and fewer than `submitting` POSTs are under way; retried on other runtimes
when one does not answer), follow (a completion source: the ``order-status`` queue, a
peer's completions feed, or polling the order's view) and summarise (per-order records,
throughput and latency). Latency is measured from intake to the end on the server clock
and, separately, from the POST sent to the completion seen by the driver.

Submission is idempotent on the order id, so a retry never makes a second order.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from http import HTTPStatus
from typing import Any, Protocol

import aiohttp
from azure.servicebus import ServiceBusReceiveMode
from azure.servicebus.aio import ServiceBusClient

from shared.contract import Queue, Route
from shared.domain.model import ProcessState

DONE = frozenset({ProcessState.PROCESSED.value, ProcessState.COMPENSATED.value})
"""Where an order ends by itself; Error waits for an operator (`clients.TERMINAL` has all three)."""
SOURCE_STOP_SECONDS = 10.0


def parse_time(value: str) -> datetime:
    return datetime.fromisoformat(value.replace("Z", "+00:00"))


# -- plan ------------------------------------------------------------------------------------


@dataclass
class Tracked:
    """One order of a run: its body, how its submission went and how it ended."""

    order_id: str
    body: dict[str, Any] = field(default_factory=dict)
    submitted: float = 0.0
    accepted: float | None = None
    runtime: str = ""
    tries: int = 0
    throttled: int = 0
    """POSTs answered 429 (come back after Retry-After), among `tries`."""
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


def order_body(order_id: str, rng: random.Random, notify: str | None = None) -> dict[str, Any]:
    """A seeded order of one to three lines, as a shop would send it; `notify`: what its
    client asks to hear (docs/contract.md, the order submission body), None to leave it
    to the default (every status)."""
    return {
        "orderId": order_id,
        **({"notify": notify} if notify is not None else {}),
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


def plan(order_ids: Iterable[str], seed: int = 7, notify: str | None = None) -> list[Tracked]:
    rng = random.Random(seed)
    return [Tracked(order_id, order_body(order_id, rng, notify)) for order_id in order_ids]


# -- submit ----------------------------------------------------------------------------------


class SubmitError(RuntimeError):
    """An order was not accepted by any runtime within the retry policy."""


class SubmitRefused(SubmitError):
    """An order was refused with a 4xx: a bug in the load, not a fault to ride out."""


@dataclass(frozen=True)
class Retry:
    """How often and how long a POST is retried: `attempts` tries and/or `within` seconds,
    waiting min(step x tries, cap) after each failure."""

    attempts: int | None = 5
    within: float | None = None
    step: float = 0.2
    cap: float | None = None
    request_timeout: float | None = None

    def delay(self, tries: int) -> float:
        wait = self.step * tries
        return wait if self.cap is None else min(wait, self.cap)

    def more(self, tries: int, deadline: float | None) -> bool:
        if self.attempts is not None and tries >= self.attempts:
            return False
        return deadline is None or time.monotonic() < deadline


Target = tuple[str, str]
"""(runtime name, API base URL ending in /api)."""


async def submit_order(
    session: aiohttp.ClientSession,
    targets: Sequence[Target],
    order: Tracked,
    *,
    first: int = 0,
    retry: Retry = Retry(),
) -> None:
    """POST until some runtime answers 202, moving to the next runtime on every failure;
    records the time sent, the time accepted, the runtime and the tries on `order`. A
    `429` is sent again after its Retry-After, as a client told to come back would (and
    counted in `order.throttled`); any other 4xx is a bug in the load."""
    deadline = None if retry.within is None else time.monotonic() + retry.within
    timeout = aiohttp.ClientTimeout(total=retry.request_timeout) if retry.request_timeout else None
    tries, last = 0, ""
    order.submitted = time.monotonic()
    if order.body.get("notify") == "final":
        # No `Received` will carry the intake's time: the time it was sent stands in
        # (a little earlier, so the server latency is never flattered).
        order.created_at = datetime.now(UTC)
    while retry.more(tries, deadline):
        name, api = targets[(first + tries) % len(targets)]
        tries += 1
        pause = retry.delay(tries)
        try:
            async with session.post(f"{api}/{Route.ORDERS}", json=order.body, timeout=timeout) as r:
                if r.status == HTTPStatus.ACCEPTED:
                    order.accepted, order.runtime, order.tries = time.monotonic(), name, tries
                    return
                text = await r.text()
                if r.status == HTTPStatus.TOO_MANY_REQUESTS:
                    order.throttled += 1
                    pause = _seconds(r.headers.get("Retry-After"), pause)
                elif r.status < HTTPStatus.INTERNAL_SERVER_ERROR:
                    raise SubmitRefused(f"order {order.order_id} refused: {r.status} {text[:300]}")
                last = f"{r.status} {text[:200]}"
        except (aiohttp.ClientError, TimeoutError) as exc:
            last = f"{type(exc).__name__}: {exc}"
        await asyncio.sleep(pause)
    raise SubmitError(f"order {order.order_id} not accepted after {tries} tries; last: {last}")


def _seconds(retry_after: str | None, otherwise: float) -> float:
    """A Retry-After in seconds; `otherwise` when there is none to read."""
    try:
        return max(float(retry_after or ""), 0.0)
    except ValueError:
        return otherwise


class Admission(Protocol):
    """Holds a submission back, e.g. while too many orders are unfinished."""

    async def admit(self) -> None: ...

    def release(self) -> None: ...


@dataclass(frozen=True)
class Load:
    """The pace of a run. `rate`: open loop, order i leaves at `i / rate` s at the earliest;
    `concurrency`: closed loop, at most that many orders unfinished; `submitting`: at most
    that many POSTs under way. Any combination; none means all at once."""

    concurrency: int | None = None
    rate: float | None = None
    submitting: int | None = None

    def describe(self) -> str:
        if self.rate is not None:
            return f"open loop, {self.rate:g} orders/s offered"
        return f"closed loop, {self.concurrency} orders in flight"


# -- follow ----------------------------------------------------------------------------------


OnEvent = Callable[[str, str, datetime | None], None]
"""(order id, status, server time): "Received" carries the intake time, a final state
the time the order got there."""


class CompletionSource(Protocol):
    async def run(self, on_event: OnEvent, stop: asyncio.Event) -> None: ...


STATUS_PREFETCH = 250
STATUS_IDLE_SECONDS = 0.2


class StatusQueue:
    """Our system's client view: status notifications on ``order-status``, read in
    receive-and-delete mode with the real SDK, each as it arrives (a batch read holds
    the first notification until the batch's wait is over, up to 0.2 s on every order's
    latency, which a closed loop pays in throughput)."""

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
                prefetch_count=STATUS_PREFETCH,
                max_wait_time=STATUS_IDLE_SECONDS,
            ) as receiver,
        ):
            while not stop.is_set():
                async for message in receiver:
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
                    if stop.is_set():
                        break


class CompletionsFeed:
    """The DBOS peer's client view: GET {base}/completions?after=N, long-polled."""

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


Fetch = Callable[[str], Awaitable[Mapping[str, Any] | None]]
"""An order's view (GET /api/orders/{id}), or None when it could not be read."""


class OrderPolling:
    """An operator's view: each pending order's view read every `interval` seconds,
    at most `concurrency` reads at a time; the last view of each order is kept."""

    def __init__(
        self,
        fetch: Fetch,
        pending: Callable[[], Iterable[str]],
        *,
        interval: float = 1.0,
        concurrency: int = 8,
    ) -> None:
        self.fetch = fetch
        self.pending = pending
        self.interval = interval
        self.concurrency = concurrency
        self.views: dict[str, Mapping[str, Any]] = {}

    async def run(self, on_event: OnEvent, stop: asyncio.Event) -> None:
        gate = asyncio.Semaphore(self.concurrency)

        async def read(order_id: str) -> None:
            async with gate:
                view = await self.fetch(order_id)
            if view is not None:
                self.views[order_id] = view
                self.report(view, on_event)

        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self.interval)
            await asyncio.gather(*(read(order_id) for order_id in list(self.pending())))

    @staticmethod
    def report(view: Mapping[str, Any], on_event: OnEvent) -> None:
        order_id = str(view.get("orderId", ""))
        created, updated = view.get("createdAt"), view.get("updatedAt")
        if isinstance(created, str):
            on_event(order_id, "Received", parse_time(created))
        at = parse_time(updated) if isinstance(updated, str) else None
        on_event(order_id, str(view.get("processState", "")), at)


# -- summarise -------------------------------------------------------------------------------


@dataclass
class LoadResult:
    load: Load
    orders: list[Tracked]
    started: float
    ended: float
    submit_seconds: float
    done_states: frozenset[str] = DONE

    @property
    def finished(self) -> list[Tracked]:
        return [o for o in self.orders if o.state in self.done_states]

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
    def server_latencies(self) -> list[float]:
        """Intake to Processed, server clock, seconds; Processed orders only."""
        return [v for o in self.orders if o.state == "Processed" and (v := o.server_latency)]

    @property
    def client_latencies(self) -> list[float]:
        """POST sent to the Processed completion seen, seconds; Processed orders only."""
        return [v for o in self.orders if o.state == "Processed" and (v := o.client_latency)]


# -- one run ---------------------------------------------------------------------------------


OnOrder = Callable[[Tracked], None]


class LoadRun:
    """Submits planned orders at the pace of `load` to `targets` and, while a completion
    source is followed, waits until each reached one of `done_states` or `timeout` passed
    (counted from the first submission)."""

    def __init__(
        self,
        orders: Sequence[Tracked],
        load: Load,
        targets: Sequence[Target],
        *,
        timeout: float | None = None,
        done_states: frozenset[str] = DONE,
        retry: Retry = Retry(),
        admission: Admission | None = None,
        on_submitted: OnOrder | None = None,
        on_finished: OnOrder | None = None,
    ) -> None:
        self.orders = list(orders)
        self.by_id = {o.order_id: o for o in self.orders}
        self.load, self.targets, self.timeout = load, list(targets), timeout
        self.done_states, self.retry, self.admission = done_states, retry, admission
        self.on_submitted, self.on_finished = on_submitted, on_finished
        self.finished = 0
        self.submit_seconds = 0.0
        self.started: float | None = None
        self._following = False

    def pending(self) -> list[str]:
        """Orders submitted and not yet finished."""
        return [o.order_id for o in self.orders if o.accepted and o.state not in self.done_states]

    def on_event(self, order_id: str, status: str, at: datetime | None) -> None:
        order = self.by_id.get(order_id)
        if order is None:
            return
        if status == "Received":
            order.created_at = at or order.created_at
        elif order.state in self.done_states:
            return
        elif status in self.done_states:
            order.state, order.finished_at, order.observed = status, at, time.monotonic()
            order.done.set()
            self.finished += 1
            if self.on_finished is not None:
                self.on_finished(order)
        elif status:
            order.state = status

    def _left(self) -> float | None:
        if self.timeout is None or self.started is None:
            return None
        return self.started + self.timeout - time.monotonic()

    async def _wait_done(self, order: Tracked) -> None:
        if not self._following:
            return
        left = self._left()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(order.done.wait(), None if left is None else max(left, 0))

    async def _post(self, session: aiohttp.ClientSession, i: int, order: Tracked) -> None:
        if self.admission is not None:
            await self.admission.admit()
        try:
            first = i % len(self.targets)
            await submit_order(session, self.targets, order, first=first, retry=self.retry)
        finally:
            if self.admission is not None:
                self.admission.release()
        if self.on_submitted is not None:
            self.on_submitted(order)

    async def _one(
        self, session: aiohttp.ClientSession, i: int, order: Tracked, pace: _Pace
    ) -> None:
        if pace.load.rate is not None:
            await asyncio.sleep(max(pace.origin + i / pace.load.rate - time.monotonic(), 0))
        async with pace.room or contextlib.nullcontext():
            left = self._left()
            if left is not None and left < 0:
                return
            async with pace.gate or contextlib.nullcontext():
                await self._post(session, i, order)
            if pace.room is not None:
                await self._wait_done(order)

    async def submit(
        self,
        session: aiohttp.ClientSession,
        orders: Sequence[Tracked] | None = None,
        *,
        load: Load | None = None,
        started: float | None = None,
    ) -> None:
        """Every order (of the run, or the `orders` given) at its slot of `load` (the run's
        by default), counted from `started` (now by default). While following, a slot of
        `concurrency` is held until its order finished (so a closed loop returns when its
        orders did). The first failure cancels the rest."""
        pace = _Pace.of(load or self.load, time.monotonic() if started is None else started)
        if self.started is None:
            self.started = pace.origin
        batch = self.orders if orders is None else list(orders)
        tasks = [
            asyncio.ensure_future(self._one(session, i, order, pace))
            for i, order in enumerate(batch)
        ]
        try:
            await asyncio.gather(*tasks)
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        if all(o.accepted for o in batch):
            self.submit_seconds = max(o.accepted or 0.0 for o in batch) - pace.origin

    async def wait(self) -> None:
        """Until every order finished, the timeout passed or the source stopped."""
        await asyncio.gather(*(self._wait_done(o) for o in self.orders))

    def result(self) -> LoadResult:
        started = self.started if self.started is not None else time.monotonic()
        ended = max((o.observed for o in self.orders if o.observed), default=time.monotonic())
        submit_seconds = self.submit_seconds or (ended - started)
        return LoadResult(self.load, self.orders, started, ended, submit_seconds, self.done_states)

    async def run(
        self,
        session: aiohttp.ClientSession,
        source: CompletionSource,
        before_start: Callable[[], Awaitable[None]] | None = None,
    ) -> LoadResult:
        """Submit and follow; ends when every order finished or the timeout passed."""
        async with self.following(source):
            if before_start is not None:
                await before_start()
            await self.submit(session)
            await self.wait()
        return self.result()

    @contextlib.asynccontextmanager
    async def following(self, source: CompletionSource) -> AsyncIterator[None]:
        """`source` feeds this run's orders while the block runs."""
        stop = asyncio.Event()
        watcher = asyncio.create_task(source.run(self.on_event, stop))

        def on_watcher_end(task: asyncio.Task[None]) -> None:
            # A dead completion source would leave every wait to the timeout: end them now.
            if not stop.is_set():
                for order in self.orders:
                    order.done.set()

        watcher.add_done_callback(on_watcher_end)
        self._following = True
        try:
            yield
        finally:
            self._following = False
            stop.set()
            await _stop(watcher)
        if watcher.done() and not watcher.cancelled() and (exc := watcher.exception()) is not None:
            raise RuntimeError(f"completion source failed: {exc!r}") from exc


@dataclass(frozen=True)
class _Pace:
    load: Load
    origin: float
    room: asyncio.Semaphore | None
    gate: asyncio.Semaphore | None

    @classmethod
    def of(cls, load: Load, origin: float) -> _Pace:
        room = asyncio.Semaphore(load.concurrency) if load.concurrency else None
        gate = asyncio.Semaphore(load.submitting) if load.submitting else None
        return cls(load, origin, room, gate)


async def _stop(watcher: asyncio.Task[None]) -> None:
    try:
        await asyncio.wait_for(watcher, SOURCE_STOP_SECONDS)
    except (TimeoutError, asyncio.CancelledError):
        watcher.cancel()
    except Exception:  # the watcher's own failure must not hide the result
        watcher.cancel()


async def run_load(
    api: str | Sequence[str],
    order_ids: list[str],
    load: Load,
    source: CompletionSource,
    *,
    timeout: float,
    seed: int = 7,
    on_progress: Callable[[int, int], None] | None = None,
    before_start: Callable[[], Awaitable[None]] | None = None,
    notify: str | None = None,
) -> LoadResult:
    """Seeded orders to one runtime's API (or, given several, round robin over them),
    completions from `source`, on a session of its own (64 connections, 60 s per
    request); waits (bounded by `timeout`) for each to end. `notify`: what each order
    asks to hear (`final`: its last status only)."""
    orders = plan(order_ids, seed, notify)
    apis = [api] if isinstance(api, str) else list(api)
    targets = [(f"runtime {i}" if len(apis) > 1 else "runtime", a) for i, a in enumerate(apis)]
    run = LoadRun(orders, load, targets, timeout=timeout)
    if on_progress is not None:
        run.on_finished = lambda _: on_progress(run.finished, len(orders))
    connector = aiohttp.TCPConnector(limit=64)
    timeouts = aiohttp.ClientTimeout(total=60)
    async with aiohttp.ClientSession(connector=connector, timeout=timeouts) as session:
        return await run.run(session, source, before_start)
