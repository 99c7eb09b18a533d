"""Counting decorators for the StateStore and MessageBus ports, and per-function attribution.

``CountingStore`` and ``CountingBus`` wrap the real adapters and record, per calling
function (a context variable set by a wrapper around each Functions entry point), how
many times each port method ran, how long it took, how many Table Storage operations and
entities that is, and which messages were sent. ``install()`` hands them to the
composition root's port decorator hook (``shared.bootstrap.decorate_ports``) and wraps
the indexed functions, without changing ``devhost/``; ``bench.instrumented_runtime``
does that inside ``python -m devhost``.
"""

from __future__ import annotations

import contextvars
import functools
import gc
import json
import time
from collections import Counter, defaultdict
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench._activity import GroupClock, scale_group
from shared import bootstrap
from shared.adapters import table_rows
from shared.adapters.queues import queue_of
from shared.domain.archive import ArchivedMark
from shared.domain.model import HistoryEntry, OrderProcess, Outgoing, ProcessState, StateRecord
from shared.domain.rest_index import RestEntry, RestPage, RestRange
from shared.ports import (
    ConcurrencyConflict,
    MessageBus,
    Page,
    Poison,
    StateStore,
    WatchEntry,
    WatchPage,
)

ROLE: contextvars.ContextVar[str] = contextvars.ContextVar("bench_role", default="(outside)")

# How each port method maps onto Table Storage operations (what Azure bills and throttles).
# kind: "write" (one entity or one entity-group transaction), "query", "point read".
TABLE_KIND = {
    "create": "write",
    "save": "write",
    "watch": "write",
    "reschedule": "write",
    "unwatch": "write",
    "load": "point read",
    "history": "query",
    "list_by_state": "query",
    "due": "query",
    "ping": "point read",
    "put_rest": "write",
    "drop_rest": "write",
    "rest_entries": "query",
    "watch_list": "query",
    "states": "point read",
}


@dataclass
class OpStats:
    calls: int = 0
    seconds: float = 0.0
    table_ops: int = 0
    entities: int = 0
    conflicts: int = 0


@dataclass
class RoleStats:
    invocations: int = 0
    seconds: float = 0.0
    queue_wait: float = 0.0
    queue_waits: int = 0
    ops: dict[str, OpStats] = field(default_factory=lambda: defaultdict(OpStats))
    sent: Counter[str] = field(default_factory=Counter)
    send_seconds: float = 0.0
    send_calls: int = 0


class CollectorStats:
    """Time the cyclic garbage collector spends, by generation (gc.callbacks)."""

    def __init__(self) -> None:
        self.seconds = [0.0, 0.0, 0.0]
        self.collections = [0, 0, 0]
        self._began = 0.0

    def on_gc(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._began = time.perf_counter()
            return
        generation = int(info["generation"])
        self.seconds[generation] += time.perf_counter() - self._began
        self.collections[generation] += 1

    def reset(self) -> None:
        self.seconds = [0.0, 0.0, 0.0]
        self.collections = [0, 0, 0]


class Stats:
    def __init__(self) -> None:
        self.roles: dict[str, RoleStats] = defaultdict(RoleStats)
        self.processed_at: dict[str, float] = {}
        self.inner_store: Any = None
        self.collector = CollectorStats()
        self.clocks: dict[str, GroupClock] = defaultdict(GroupClock)

    def role(self) -> RoleStats:
        return self.roles[ROLE.get()]

    def reset(self) -> None:
        self.roles.clear()
        self.processed_at.clear()
        self.collector.reset()
        now = time.perf_counter()
        for clock in self.clocks.values():
            clock.reset(now)
        if self.inner_store is not None and hasattr(self.inner_store, "operations"):
            self.inner_store.operations.clear()

    def to_json(self) -> dict[str, Any]:
        roles: dict[str, Any] = {}
        for name, role in list(self.roles.items()):
            roles[name] = {
                "invocations": role.invocations,
                "seconds": role.seconds,
                "queueWait": role.queue_wait,
                "queueWaits": role.queue_waits,
                "ops": {op: vars(s).copy() for op, s in list(role.ops.items())},
                "sent": dict(role.sent),
                "sendSeconds": role.send_seconds,
                "sendCalls": role.send_calls,
            }
        operations = getattr(self.inner_store, "operations", None)
        return {
            "roles": roles,
            "adapterOperations": dict(operations) if operations is not None else {},
            "processed": len(self.processed_at),
            "gc": {"seconds": self.collector.seconds, "collections": self.collector.collections},
            "activity": {name: c.to_json() for name, c in list(self.clocks.items())},
        }


STATS = Stats()


def _entities(history: Sequence[HistoryEntry]) -> int:
    """The state entity: order, state, steps and the latest history in one (history
    rows only when it outgrows it; the adapter's own counter sees those transactions)."""
    return 1


class CountingStore:
    """A StateStore that records every call, then delegates to the real one."""

    def __init__(self, inner: StateStore, stats: Stats = STATS) -> None:
        self.inner = inner
        self.stats = stats
        stats.inner_store = inner

    def _record(self, op: str, started: float, entities: int, *, conflict: bool = False) -> None:
        s = self.stats.role().ops[op]
        s.calls += 1
        s.seconds += time.perf_counter() - started
        s.table_ops += table_rows.WATCH_SHARDS if op == "due" else 1
        s.entities += entities
        s.conflicts += int(conflict)

    async def _timed(self, op: str, entities: int, call: Awaitable[Any]) -> Any:
        started = time.perf_counter()
        try:
            result = await call
        except ConcurrencyConflict:
            self._record(op, started, entities, conflict=True)
            raise
        self._record(op, started, entities)
        return result

    async def create(self, process: OrderProcess, history: Sequence[HistoryEntry]) -> str:
        n = _entities(history)
        result: str = await self._timed("create", n, self.inner.create(process, history))
        return result

    async def load(self, order_id: str) -> OrderProcess | None:
        result: OrderProcess | None = await self._timed("load", 0, self.inner.load(order_id))
        if result is not None:
            self.stats.role().ops["load"].entities += 1
        return result

    async def archived(self, order_id: str) -> ArchivedMark | None:
        found: ArchivedMark | None = await self._timed("load", 0, self.inner.archived(order_id))
        return found

    async def save(self, process: OrderProcess, history: Sequence[HistoryEntry]) -> str:
        n = _entities(history)
        result: str = await self._timed("save", n, self.inner.save(process, history))
        if process.state.process_state is ProcessState.PROCESSED:
            self.stats.processed_at.setdefault(process.order_id, time.time())
        return result

    async def history(self, order_id: str) -> tuple[HistoryEntry, ...]:
        result: tuple[HistoryEntry, ...] = await self._timed(
            "history", 0, self.inner.history(order_id)
        )
        self.stats.role().ops["history"].entities += len(result)
        return result

    async def list_by_state(
        self, state: ProcessState | None, page_size: int, continuation: str | None
    ) -> Page:
        result: Page = await self._timed(
            "list_by_state", 0, self.inner.list_by_state(state, page_size, continuation)
        )
        return result

    async def watch(
        self,
        order_id: str,
        check_at: datetime,
        *,
        replace: bool,
        version: int = 0,
        customer: str = "",
    ) -> bool:
        wrote: bool = await self._timed(
            "watch",
            1,
            self.inner.watch(
                order_id,
                check_at,
                replace=replace,
                version=version,
                customer=customer,
            ),
        )
        return wrote

    async def watch_list(self, limit: int, continuation: str | None) -> WatchPage:
        result: WatchPage = await self._timed(
            "watch_list", 0, self.inner.watch_list(limit, continuation)
        )
        return result

    async def states(self, order_ids: Sequence[str]) -> tuple[StateRecord, ...]:
        result: tuple[StateRecord, ...] = await self._timed(
            "states", len(order_ids), self.inner.states(order_ids)
        )
        return result

    async def put_rest(self, entry: RestEntry) -> None:
        await self._timed("put_rest", 1, self.inner.put_rest(entry))

    async def drop_rest(
        self, state: ProcessState, order_id: str, created_at: datetime, *, below: int | None = None
    ) -> None:
        await self._timed(
            "drop_rest", 1, self.inner.drop_rest(state, order_id, created_at, below=below)
        )

    async def rest_entries(self, keys: RestRange, limit: int, continuation: str | None) -> RestPage:
        result: RestPage = await self._timed(
            "rest_entries", 0, self.inner.rest_entries(keys, limit, continuation)
        )
        return result

    async def rewatch(self, order_id: str, check_at: datetime, *, version: int = 0) -> None:
        await self._timed("rewatch", 1, self.inner.rewatch(order_id, check_at, version=version))

    async def due(self, now: datetime, limit: int) -> tuple[WatchEntry, ...]:
        result: tuple[WatchEntry, ...] = await self._timed("due", 0, self.inner.due(now, limit))
        self.stats.role().ops["due"].entities += len(result)
        return result

    async def reschedule(self, entry: WatchEntry, check_at: datetime) -> None:
        await self._timed("reschedule", 1, self.inner.reschedule(entry, check_at))

    async def unwatch(self, order_id: str, version: int | None = None) -> None:
        await self._timed("unwatch", 1, self.inner.unwatch(order_id, version))

    async def unwatch_entry(self, entry: WatchEntry) -> None:
        await self._timed("unwatch", 1, self.inner.unwatch_entry(entry))

    async def ping(self) -> None:
        await self._timed("ping", 0, self.inner.ping())

    async def close(self) -> None:
        closer = getattr(self.inner, "close", None)
        if closer is not None:
            await closer()


class CountingBus:
    """A MessageBus that records what is sent (per queue) and how long sending takes."""

    def __init__(self, inner: MessageBus, stats: Stats = STATS) -> None:
        self.inner = inner
        self.stats = stats

    async def send(self, messages: Sequence[Outgoing]) -> None:
        started = time.perf_counter()
        await self.inner.send(messages)
        role = self.stats.role()
        role.send_seconds += time.perf_counter() - started
        role.send_calls += 1 if messages else 0
        for message in messages:
            role.sent[queue_of(message.destination)] += 1

    async def park(self, poison: Poison) -> None:
        await self.inner.park(poison)

    async def ping(self) -> None:
        await self.inner.ping()

    async def close(self) -> None:
        closer = getattr(self.inner, "close", None)
        if closer is not None:
            await closer()


# -- attribution of work to functions ------------------------------------------------------


def _label(function_name: str, kwargs: dict[str, Any]) -> tuple[str, float | None]:
    """The role name of one invocation, and how long its message waited in the queue."""
    msg = kwargs.get("msg")
    if msg is None or not hasattr(msg, "get_body"):
        return function_name, None
    wait: float | None = None
    enqueued = getattr(msg, "enqueued_time_utc", None)
    scheduled = getattr(msg, "scheduled_enqueue_time_utc", None)
    base = max((t for t in (enqueued, scheduled) if isinstance(t, datetime)), default=None)
    if base is not None:
        if base.tzinfo is None:
            base = base.replace(tzinfo=UTC)
        wait = max((datetime.now(UTC) - base).total_seconds(), 0.0)
    try:
        body = json.loads(msg.get_body())
    except (ValueError, TypeError):
        return function_name, wait
    step = body.get("step") if isinstance(body, dict) else None
    if step and body.get("action") == "compensate":
        step = f"undo {step}"
    return (f"{function_name} ({step})" if step else function_name), wait


def wrap_function(
    name: str, func: Callable[..., Any], stats: Stats = STATS, group: str | None = None
) -> Callable[..., Any]:
    """`group`: the Flex Consumption scale group whose instance the invocation keeps active."""
    clock = stats.clocks[group or name]

    @functools.wraps(func)
    async def wrapped(**kwargs: Any) -> Any:
        label, wait = _label(name, kwargs)
        token = ROLE.set(label)
        role = stats.roles[label]
        started = time.perf_counter()
        clock.begin(started)
        try:
            return await func(**kwargs)
        finally:
            ended = time.perf_counter()
            clock.end(ended, started)
            role.invocations += 1
            role.seconds += ended - started
            if wait is not None:
                role.queue_wait += wait
                role.queue_waits += 1
            ROLE.reset(token)

    return wrapped


def wrap_specs(specs: list[Any], stats: Stats = STATS) -> None:
    """Replace each indexed function in place (the loader caches this very list)."""
    for i, spec in enumerate(specs):
        if getattr(spec.func, "__bench_wrapped__", False):
            continue
        group = scale_group(spec.name, spec.trigger_type)
        wrapped = wrap_function(spec.name, spec.func, stats, group)
        wrapped.__bench_wrapped__ = True  # type: ignore[attr-defined]
        specs[i] = replace(spec, func=wrapped)


def counting(stats: Stats = STATS) -> bootstrap.PortDecorator:
    """Counters outermost: above chaos faults, when a run injects them."""

    def decorate(ports: bootstrap.Ports) -> bootstrap.Ports:
        return bootstrap.Ports(CountingStore(ports.store, stats), CountingBus(ports.bus, stats))

    return decorate


def install(stats: Stats = STATS) -> None:
    """Counting decorators on the ports of every container built, and around every function."""
    import function_app  # noqa: PLC0415 - imported only when instrumenting
    from devhost.host.loader import functions_of  # noqa: PLC0415

    wrap_specs(functions_of(function_app.app), stats)
    bootstrap.decorate_ports(counting(stats))
    gc.callbacks.append(stats.collector.on_gc)


def dump(path: Path, stats: Stats = STATS) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(stats.to_json(), default=str))
    tmp.replace(path)
