"""The port decorators through their one hook (shared/intercept.py): chaos crashes,
spans and the bench's counters, each pinned for every state-store method, and the hook
itself reaching a method a port gains without a change to the decorator."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any, Protocol

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from bench._instrument import CountingStore, Stats
from shared.adapters.chaos import ChaosFault, ChaosStateStore
from shared.adapters.memory.store import InMemoryStateStore
from shared.adapters.traced import OrderTraces, TracedStateStore
from shared.domain.machine.forward import start
from shared.domain.model import OrderProcess, ProcessState
from shared.domain.rest_index import RestEntry, RestRange
from shared.intercept import Call, Intercepted
from shared.ports import ConcurrencyConflict, StateStore, WatchEntry
from shared.telemetry import spans
from tests.builders import an_order
from tests.workflows import ORDER_FULFILMENT

NOW = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
ID = "dec-1"
NEW_ID = "dec-2"


@dataclass
class Stored:
    """A store holding one order, watched and with a rest entry, and what was read of it."""

    inner: InMemoryStateStore
    process: OrderProcess
    entry: WatchEntry
    rest: RestEntry
    new: OrderProcess
    """Another order, not stored yet."""


async def stored() -> Stored:
    inner = InMemoryStateStore()
    process = start(an_order(ID), ORDER_FULFILMENT, NOW).process
    etag = await inner.create(process, [])
    await inner.watch(ID, NOW, replace=True, version=1)
    (entry,) = await inner.due(NOW, 10)
    rest = RestEntry(ID, ProcessState.CANCELLED, 1, NOW, NOW, "c-1", "order-fulfilment", 1, 0)
    await inner.put_rest(rest)
    new = start(an_order(NEW_ID), ORDER_FULFILMENT, NOW).process
    return Stored(inner, replace(process, etag=etag), entry, rest, new)


Calling = Callable[[Any, Stored], Awaitable[object]]
CALLS: dict[str, Calling] = {
    "create": lambda s, o: s.create(o.new, []),
    "load": lambda s, o: s.load(ID),
    "archived": lambda s, o: s.archived(ID),
    "save": lambda s, o: s.save(o.process, []),
    "history": lambda s, o: s.history(ID),
    "list_by_state": lambda s, o: s.list_by_state(None, 10, None),
    "states": lambda s, o: s.states([ID, "gone"]),
    "watch": lambda s, o: s.watch(ID, NOW, replace=True),
    "rewatch": lambda s, o: s.rewatch(ID, NOW),
    "due": lambda s, o: s.due(NOW, 10),
    "reschedule": lambda s, o: s.reschedule(o.entry, NOW),
    "unwatch": lambda s, o: s.unwatch(ID),
    "unwatch_entry": lambda s, o: s.unwatch_entry(o.entry),
    "watch_list": lambda s, o: s.watch_list(10, None),
    "put_rest": lambda s, o: s.put_rest(o.rest),
    "drop_rest": lambda s, o: s.drop_rest(o.rest.state, ID, o.rest.created_at),
    "rest_entries": lambda s, o: s.rest_entries(RestRange(ProcessState.CANCELLED), 10, None),
    "ping": lambda s, o: s.ping(),
}
"""One call of each store method, on the stored order."""

CRASHES = {
    "create": ("after", "after storing a new order"),
    "load": ("before", "before reading an order"),
    "save": ("after", "after saving a transition, before its sends"),
    "reschedule": ("before", "before rescheduling a watch entry"),
    "unwatch": ("before", "before unwatching a finished order"),
    "unwatch_entry": ("before", "before dropping a missing order's watch entry"),
    "put_rest": ("before", "before writing a rest entry, after the state"),
    "drop_rest": ("before", "before dropping the rest entry of an order leaving it"),
}


@pytest.mark.parametrize("method", sorted(CALLS))
async def test_chaos_crashes_only_where_a_process_could_die(method: str) -> None:
    """At rate 1: a crash before the call leaves the store untouched, one after it
    leaves the write stored, and a call with no crash point goes through."""
    world = await stored()
    chaos = ChaosStateStore(world.inner, rate=1.0, seed=1)
    before = world.inner.operations.total()
    when, where = CRASHES.get(method, (None, ""))
    if when is None:
        await CALLS[method](chaos, world)
        assert chaos.dice.injected == 0
        return
    with pytest.raises(ChaosFault, match=f"injected crash {where}$"):
        await CALLS[method](chaos, world)
    reached = world.inner.operations.total() > before
    assert reached is (when == "after")
    assert chaos.dice.injected == 1


SPANS: dict[str, tuple[str, bool] | None] = {
    # method: (span name, names its one order), or None: no span
    "create": ("state create", True),
    "load": ("state load", True),
    "archived": ("state archived", True),
    "save": ("state save", True),
    "history": ("state history", True),
    "list_by_state": ("state list", False),
    "states": ("state states", False),
    "watch": ("state watch", True),
    "rewatch": ("state rewatch", True),
    "due": ("state due", False),
    "reschedule": ("state reschedule", True),
    "unwatch": ("state unwatch", True),
    "unwatch_entry": ("state unwatch", True),
    "watch_list": ("state watch list", False),
    "put_rest": ("state put rest", True),
    "drop_rest": ("state drop rest", True),
    "rest_entries": ("state rest entries", False),
    "ping": None,
}


@pytest.mark.parametrize("method", sorted(CALLS))
async def test_each_store_call_in_a_trace_is_its_span(
    method: str, exporter: InMemorySpanExporter
) -> None:
    world = await stored()
    traced = TracedStateStore(world.inner, OrderTraces())
    with spans.tracer().start_as_current_span("invocation"):
        await CALLS[method](traced, world)
    made = [s for s in exporter.get_finished_spans() if s.name != "invocation"]
    expected = SPANS[method]
    if expected is None:
        assert made == []
        return
    name, names_its_order = expected
    (span,) = made
    assert span.name == name
    attributes = dict(span.attributes or {})
    assert attributes["db.operation.name"] == name.removeprefix("state ")
    one_order = NEW_ID if method == "create" else ID
    assert attributes.get(spans.ORDER_ID) == (one_order if names_its_order else None)


async def test_a_write_span_says_it_won_and_a_lost_race_says_so(
    exporter: InMemorySpanExporter,
) -> None:
    world = await stored()
    traced = TracedStateStore(world.inner, OrderTraces())
    with spans.tracer().start_as_current_span("invocation"):
        await traced.save(world.process, [])
        with pytest.raises(ConcurrencyConflict):
            await traced.save(world.process, [])
    saves = [s for s in exporter.get_finished_spans() if s.name == "state save"]
    assert [(s.attributes or {}).get("db.etag.outcome") for s in saves] == ["won", "lost"]
    assert (saves[0].attributes or {}).get("order.state") == "Pending"


COUNTS = {
    # method: (counted as, table operations, entities)
    "create": ("create", 1, 1),
    "load": ("load", 1, 1),
    "archived": ("load", 1, 0),
    "save": ("save", 1, 1),
    "history": ("history", 1, 0),
    "list_by_state": ("list_by_state", 1, 0),
    "states": ("states", 1, 2),
    "watch": ("watch", 1, 1),
    "rewatch": ("rewatch", 1, 1),
    "due": ("due", 16, 1),
    "reschedule": ("reschedule", 1, 1),
    "unwatch": ("unwatch", 1, 1),
    "unwatch_entry": ("unwatch", 1, 1),
    "watch_list": ("watch_list", 1, 0),
    "put_rest": ("put_rest", 1, 1),
    "drop_rest": ("drop_rest", 1, 1),
    "rest_entries": ("rest_entries", 1, 0),
    "ping": ("ping", 1, 0),
}


@pytest.mark.parametrize("method", sorted(CALLS))
async def test_the_bench_counts_each_store_call_as_table_work(method: str) -> None:
    world = await stored()
    stats = Stats()
    await CALLS[method](CountingStore(world.inner, stats), world)
    counted, table_ops, entities = COUNTS[method]
    (ops,) = [role["ops"] for role in stats.to_json()["roles"].values()]
    assert list(ops) == [counted]
    assert ops[counted]["calls"] == 1 and ops[counted]["conflicts"] == 0
    assert (ops[counted]["table_ops"], ops[counted]["entities"]) == (table_ops, entities)


async def test_the_bench_counts_a_lost_race_and_an_order_processed() -> None:
    world = await stored()
    stats = Stats()
    counting = CountingStore(world.inner, stats)
    processed = replace(world.process.state, process_state=ProcessState.PROCESSED)
    done = replace(world.process, state=processed)
    await counting.save(done, [])
    with pytest.raises(ConcurrencyConflict):
        await counting.save(done, [])
    (role,) = stats.to_json()["roles"].values()
    assert (role["ops"]["save"]["calls"], role["ops"]["save"]["conflicts"]) == (2, 1)
    assert list(stats.processed_at) == [ID]


class Reads(Protocol):
    async def get(self, key: str, default: int = 0) -> int: ...

    def size(self) -> int: ...


class ReadsAndWrites(Reads, Protocol):
    async def put(self, key: str, value: int) -> None: ...


class Dict:
    """A port's adapter, with a helper of its own beside the port's methods."""

    def __init__(self) -> None:
        self.data: dict[str, int] = {}

    async def get(self, key: str, default: int = 0) -> int:
        return self.data.get(key, default)

    def size(self) -> int:
        return len(self.data)

    async def put(self, key: str, value: int) -> None:
        self.data[key] = value

    def helper(self) -> str:
        return "the adapter's own"


class Recorder(Intercepted[ReadsAndWrites]):
    def __init__(self, inner: ReadsAndWrites) -> None:
        super().__init__(inner, ReadsAndWrites)
        self.seen: list[tuple[str, str, Any]] = []

    async def around(self, call: Call) -> Any:
        self.seen.append(("async", call.name, call.argument("key")))
        return await call.proceed()

    def around_sync(self, call: Call) -> Any:
        self.seen.append(("sync", call.name, call.argument("key")))
        return call.proceed()


async def test_every_method_of_a_composed_port_goes_through_the_hook_as_declared() -> None:
    inner = Dict()
    wrapped = Recorder(inner)
    port: ReadsAndWrites = wrapped
    await port.put("a", 1)
    assert await port.get(key="a") == 1
    assert await port.get("b", 7) == 7
    assert port.size() == 1
    assert wrapped.seen == [
        ("async", "put", "a"),
        ("async", "get", "a"),
        ("async", "get", "b"),
        ("sync", "size", None),
    ]
    assert wrapped.helper() == "the adapter's own"
    assert ("async", "helper", None) not in wrapped.seen


async def test_a_method_replaced_on_the_inner_is_the_one_called() -> None:
    inner = Dict()
    wrapped = Recorder(inner)

    async def get(key: str, default: int = 0) -> int:
        return 42

    inner.get = get  # type: ignore[method-assign]
    assert await wrapped.get("a") == 42


async def test_closing_a_wrapper_closes_what_it_wraps_when_it_can() -> None:
    closed: list[str] = []

    class Closing(Dict):
        async def close(self) -> None:
            closed.append("inner")

    await Recorder(Closing()).close()
    await Recorder(Dict()).close()
    assert closed == ["inner"]


def test_the_store_decorators_are_state_stores() -> None:
    inner = InMemoryStateStore()
    decorated: list[StateStore] = [
        ChaosStateStore(inner, rate=0.0),
        TracedStateStore(inner, OrderTraces()),
        CountingStore(inner, Stats()),
    ]
    assert all(d.inner is inner for d in decorated if isinstance(d, Intercepted))
