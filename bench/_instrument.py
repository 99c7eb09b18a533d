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
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench._activity import GroupClock, scale_group
from shared import bootstrap
from shared.adapters.queues import queue_of
from shared.adapters.table import rows as table_rows
from shared.domain.model import OrderProcess, Outgoing, ProcessState
from shared.intercept import Call, Intercepted
from shared.ports import ConcurrencyConflict, MessageBus, StateStore

ROLE: contextvars.ContextVar[str] = contextvars.ContextVar("bench_role", default="(outside)")

# How each port method maps onto Table Storage operations (what Azure bills and throttles).
# kind: "write" (one entity or one entity-group transaction), "query", "point read".
TABLE_KIND = {
    "create": "write",
    "save": "write",
    "watch": "write",
    "rewatch": "write",
    "move_up": "write",
    "reschedule": "write",
    "unwatch": "write",
    "unwatch_entry": "write",
    "load": "point read",
    "archived": "point read",
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


COUNTED_AS = {"archived": "load", "unwatch_entry": "unwatch"}
"""Store methods counted under another's name (the same kind of Table operation)."""
WRITES_ONE = frozenset(
    {
        "create",
        "save",
        "watch",
        "rewatch",
        "reschedule",
        "unwatch",
        "unwatch_entry",
        "put_rest",
        "drop_rest",
    }
)
"""Store methods that write one entity: the state entity (order, state, steps and the
latest history in one; history rows only when it outgrows it, and the adapter's own
counter sees those transactions), a watch entry or a rest entry."""
ASKED: dict[str, Callable[[Call], int]] = {"states": lambda call: len(call.argument("order_ids"))}
"""Store methods that read entities by key: how many one call asks for."""
FOUND: dict[str, Callable[[Any], int]] = {
    "load": lambda found: int(found is not None),
    "history": len,
    "due": len,
}
"""Store methods whose entities are counted from the answer."""


class CountingStore(Intercepted[StateStore]):
    """A StateStore that records every call, then delegates to the real one. A method
    the tables above do not name is counted under its own name: one Table operation,
    no entities."""

    def __init__(self, inner: StateStore, stats: Stats = STATS) -> None:
        super().__init__(inner, StateStore)
        self.stats = stats
        stats.inner_store = inner

    def _record(self, op: str, started: float, entities: int, *, conflict: bool = False) -> None:
        s = self.stats.role().ops[op]
        s.calls += 1
        s.seconds += time.perf_counter() - started
        s.table_ops += table_rows.WATCH_SHARDS if op == "due" else 1
        s.entities += entities
        s.conflicts += int(conflict)

    async def around(self, call: Call) -> Any:
        op = COUNTED_AS.get(call.name, call.name)
        asked = ASKED.get(call.name)
        entities = asked(call) if asked is not None else int(call.name in WRITES_ONE)
        started = time.perf_counter()
        try:
            result = await call.proceed()
        except ConcurrencyConflict:
            self._record(op, started, entities, conflict=True)
            raise
        self._record(op, started, entities)
        found = FOUND.get(call.name)
        if found is not None:
            self.stats.role().ops[op].entities += found(result)
        if call.name == "save":
            self._processed(call.argument("process"))
        return result

    def _processed(self, process: OrderProcess) -> None:
        if process.state.process_state is ProcessState.PROCESSED:
            self.stats.processed_at.setdefault(process.order_id, time.time())


class CountingBus(Intercepted[MessageBus]):
    """A MessageBus that records what is sent (per queue) and how long sending takes."""

    def __init__(self, inner: MessageBus, stats: Stats = STATS) -> None:
        super().__init__(inner, MessageBus)
        self.stats = stats

    async def around(self, call: Call) -> Any:
        if call.name != "send":
            return await call.proceed()
        messages: Sequence[Outgoing] = call.argument("messages")
        started = time.perf_counter()
        await call.proceed()
        role = self.stats.role()
        role.send_seconds += time.perf_counter() - started
        role.send_calls += 1 if messages else 0
        for message in messages:
            role.sent[queue_of(message.destination)] += 1
        return None


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
