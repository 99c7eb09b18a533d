"""What one fault-free order costs, per shipped workflow, pinned (bench/order_counts.py).

The app's own functions run as the host calls them (tests/functions), on the real Table
adapter over Azurite, so a table request is one HTTP request sent, classified from its
method, path and If-Match header by a counting transport (the SDK's requests) and by
aiohttp's request tracing (the store's single-entity requests, which skip the SDK); the
bus is the in-memory one, whose sends are the messages by queue. Each message is delivered to the
function whose trigger binding names its queue; a message no function listens to
(`order-status`) leaves the system. The counts are deterministic, so a change in either
direction fails here and the pinned table is updated on purpose.

The wait steps are driven by the test: `reviewed-order`'s approval is one
`POST /api/orders/{orderId}/approval`, and `scheduled-delivery`'s timer fires when the
test moves the clock to its scheduled nudge's time and delivers it.
"""

from __future__ import annotations

import json
import re
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any
from urllib.parse import unquote, urlsplit

import aiohttp
import azure.functions as func
import pytest
from azure.core.pipeline.transport import AioHttpTransport
from azure.data.tables.aio import TableServiceClient
from azure.functions.servicebus import ServiceBusMessage

from bench.order_counts import FINAL_ONLY, PINNED, OrderCounts
from devhost.host.loader import FunctionSpec
from shared import bootstrap
from shared.adapters.clock import FakeClock
from shared.adapters.memory.store import InMemoryBus
from shared.adapters.table import rest, rows
from shared.adapters.table.entities import TableEntities
from shared.adapters.table.store import TableStateStore
from shared.contract import Queue
from shared.domain.model import Outgoing, ProcessState
from shared.ports import RemoteService
from shared.settings import Settings, azurite_connection_string
from tests.app_functions import registered_functions
from tests.functions.conftest import SETTINGS, ScriptedRemote, context_for
from tests.waiting import eventually
from tests.workflows import AGENTS, CATALOGUE, AgentName

pytestmark = pytest.mark.azurite

_ENTITY = re.compile(r"\(PartitionKey='.*',RowKey='.*'\)$")
_KEYS = re.compile(r"\(PartitionKey='(?P<pk>(?:[^']|'')*)',RowKey='(?:[^']|'')*'\)$")


def request_kind(method: str, url: str, if_match: str | None) -> str:
    """What one Table REST request is, as the capacity page counts it."""
    path = unquote(urlsplit(url).path)
    if method == "POST":
        if path.endswith("/$batch"):
            return "transaction"
        return "create table" if path.endswith("/Tables") else "insert"
    if method == "GET":
        return "point read" if _ENTITY.search(path) else "query"
    conditional = if_match is not None and if_match != "*"
    if method == "PUT":
        return "If-Match replace" if conditional else ("replace" if if_match else "upsert")
    if method in ("MERGE", "PATCH"):
        return "If-Match merge" if conditional else ("merge" if if_match else "upsert merge")
    if method == "DELETE":
        return "If-Match delete" if conditional else "delete"
    return f"{method} {path}"


def written_partition(method: str, url: str, body: Any) -> str | None:
    """The partition a single-entity write goes to: in the URL's keys, or an insert's
    body; None for a read (and for a transaction, whose body is multipart)."""
    if method == "GET":
        return None
    if method == "POST":
        if urlsplit(url).path.endswith(("/$batch", "/Tables")):
            return None
        return str(json.loads(body)["PartitionKey"])
    found = _KEYS.search(unquote(urlsplit(url).path))
    return found["pk"].replace("''", "'") if found else None


class CountingTransport(AioHttpTransport):  # type: ignore[misc]
    """aiohttp's transport, counting every request it sends by kind while `counting`,
    and the partitions its writes go to."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.counts: Counter[str] = Counter()
        self.written: Counter[str] = Counter()
        self.counting = False

    async def send(self, request: Any, **kwargs: Any) -> Any:
        if self.counting:
            self.counts[
                request_kind(request.method, request.url, request.headers.get("If-Match"))
            ] += 1
            partition = written_partition(request.method, request.url, request.body)
            if partition is not None:
                self.written[partition] += 1
        return await super().send(request, **kwargs)

    def tracing(self) -> aiohttp.TraceConfig:
        """The same counts for the requests the state store sends on aiohttp itself
        (shared/adapters/table/entities.py): each one as it starts, an insert's
        partition from its body as it goes out."""
        trace = aiohttp.TraceConfig()

        async def started(_: Any, __: Any, sent: aiohttp.TraceRequestStartParams) -> None:
            if self.counting:
                url = str(sent.url)
                self.counts[request_kind(sent.method, url, sent.headers.get("If-Match"))] += 1
                if sent.method != "POST" and (found := written_partition(sent.method, url, None)):
                    self.written[found] += 1

        async def body(_: Any, __: Any, sent: aiohttp.TraceRequestChunkSentParams) -> None:
            if self.counting and sent.method == "POST":
                found = written_partition(sent.method, str(sent.url), sent.chunk)
                if found is not None:
                    self.written[found] += 1

        trace.on_request_start.append(started)
        trace.on_request_chunk_sent.append(body)
        return trace


@dataclass
class Run:
    """One order driven through the app's functions, and what it cost."""

    store: TableStateStore
    bus: InMemoryBus
    clock: FakeClock
    transport: CountingTransport
    functions: dict[str, FunctionSpec]
    remotes: dict[AgentName, ScriptedRemote]
    invocations: Counter[str] = field(default_factory=Counter)
    http: Counter[str] = field(default_factory=Counter)
    delivered: int = 0

    def listener(self, queue: str) -> FunctionSpec | None:
        for spec in self.functions.values():
            trigger = spec.trigger
            if trigger.get("type") == "serviceBusTrigger" and trigger.get("queueName") == queue:
                return spec
        return None

    async def call(
        self, name: str, path: str, body: Any, route: Mapping[str, str]
    ) -> func.HttpResponse:
        self.http[name] += 1
        request = func.HttpRequest(
            "POST",
            f"http://localhost:7071/api/{path}",
            headers={"content-type": "application/json", "x-operator": "counts"},
            params={},
            route_params=dict(route),
            body=json.dumps(body).encode(),
        )
        spec = self.functions[name]
        response: func.HttpResponse = await spec.func(request, **context_for(spec))
        return response

    async def deliver_all(self) -> None:
        """Every message sent so far, in order, to its queue's function; a scheduled one
        once the clock is moved to its time."""
        while self.delivered < len(self.bus.sent):
            message = self.bus.sent[self.delivered]
            self.delivered += 1
            spec = self.listener(message.queue)
            if spec is None:
                continue
            if message.deliver_at is not None and message.deliver_at > self.clock.now():
                self.clock.advance((message.deliver_at - self.clock.now()).total_seconds())
            await self.invoke(spec, message)

    async def invoke(self, spec: FunctionSpec, message: Outgoing) -> None:
        self.invocations[spec.name] += 1
        msg = ServiceBusMessage(
            body=json.dumps(dict(message.body)).encode(),
            message_id=message.message_id,
            delivery_count=1,
            application_properties=dict(message.properties),
            user_properties=dict(message.properties),
        )
        await spec.func(msg, **context_for(spec))

    def counted(self) -> OrderCounts:
        return OrderCounts(
            messages=dict(Counter(m.queue for m in self.bus.sent)),
            table=dict(self.transport.counts),
            invocations=dict(self.invocations),
            http=dict(self.http),
            remote_calls=dict(
                Counter({name: len(r.calls) for name, r in self.remotes.items() if r.calls})
            ),
        )


@pytest.fixture
async def run(azurite_table_port: int) -> AsyncIterator[Run]:
    connection = azurite_connection_string(azurite_table_port)
    transport = CountingTransport()
    service = TableServiceClient.from_connection_string(connection, transport=transport)
    name = f"t{uuid.uuid4().hex[:20]}"
    store = TableStateStore(service, name)
    store._entities = TableEntities.of(service, name, trace_configs=[transport.tracing()])
    await store.ensure_table()
    bus, clock = InMemoryBus(), FakeClock()
    remotes = {name: ScriptedRemote() for name in AGENTS}
    remote_ports: dict[AgentName, RemoteService] = dict(remotes)
    settings = Settings.from_env(
        {**SETTINGS, "AzureWebJobsStorage": connection}, catalogue=CATALOGUE
    )
    bootstrap.use(bootstrap.compose(settings, store, bus, remote_ports, clock))
    functions = {f.name: f for f in registered_functions()}
    try:
        yield Run(store, bus, clock, transport, functions, remotes)
    finally:
        bootstrap.reset()
        await store.close()


def an_order(workflow: str, clock: FakeClock) -> dict[str, Any]:
    order: dict[str, Any] = {
        "orderId": f"count-{workflow}",
        "customerId": "c-1",
        "items": [{"sku": "A", "quantity": 2, "unitPrice": 3.5}],
        "workflow": workflow,
    }
    if workflow == "scheduled-delivery":
        order["notBefore"] = (clock.now() + timedelta(hours=1)).isoformat()
    return order


async def drive(run: Run, workflow: str, **asked: str) -> None:
    """Intake, every message, and the approval a review waits for, until the order ends;
    `asked`: more fields of the body (`notify`)."""
    order = {**an_order(workflow, run.clock), **asked}
    order_id = order["orderId"]
    run.transport.counting = True
    response = await run.call("submit_order_http", "orders", order, {})
    assert response.status_code == 202, response.get_body()
    await run.deliver_all()
    if workflow == "reviewed-order":
        approval = {"eventId": "review-1", "approved": True}
        path = f"orders/{order_id}/approval"
        answered = await run.call("answer_approval_http", path, approval, {"orderId": order_id})
        assert answered.status_code == 202, answered.get_body()
        await run.deliver_all()
    run.transport.counting = False

    async def finished() -> bool:
        process = await run.store.load(order_id)
        return process is not None and process.state.process_state is ProcessState.PROCESSED

    await eventually(f"{workflow} order Processed", finished, timeout=10)
    assert order_id not in {e.order_id for e in (await run.store.watch_list(10, None)).items}


SHIPPED = sorted({w.name for w in CATALOGUE.workflows})


def test_every_shipped_workflow_is_pinned() -> None:
    assert sorted(PINNED) == SHIPPED


@pytest.mark.parametrize("workflow", SHIPPED)
async def test_a_fault_free_order_costs_what_is_pinned(run: Run, workflow: str) -> None:
    await drive(run, workflow)
    assert run.counted() == PINNED[workflow]


@pytest.mark.parametrize("workflow", sorted(FINAL_ONLY))
async def test_a_client_that_asks_for_the_final_status_only_costs_what_is_pinned(
    run: Run, workflow: str
) -> None:
    await drive(run, workflow, notify="final")
    assert run.counted() == FINAL_ONLY[workflow]
    assert [m.body["status"] for m in run.bus.on(Queue.ORDER_STATUS)] == ["Processed"]


async def test_the_fault_free_order_fulfilment_order_meets_issue_39s_message_target(
    run: Run,
) -> None:
    """At most 9 messages, and no nudge: the intake claimed it. (The table's target, 5
    requests, is not met: the sharded rest index keeps 7, and docs/capacity.md, "One
    write per order in a shared partition", says what 5 would take.)"""
    await drive(run, "order-fulfilment")
    counted = run.counted()
    assert counted.total_messages <= 9
    assert Queue.SCHEDULER not in counted.messages


async def test_the_partitions_one_orders_writes_touch_are_its_own_and_two_shards(
    run: Run,
) -> None:
    """Issue #39: no partition takes a write for every order. A fault-free order writes
    its own partition, its watch shard and its rest shard, each of these one in
    `WATCH_SHARDS` or `REST_SHARDS` (docs/capacity.md, "Table Storage")."""
    await drive(run, "order-fulfilment")
    order_id = "count-order-fulfilment"
    assert dict(run.transport.written) == {
        order_id: 4,
        rows.watch_partition(order_id): 2,
        rest.partition(ProcessState.PROCESSED, order_id): 1,
    }
    assert rest.partition(ProcessState.PROCESSED, order_id) != rest.legacy(ProcessState.PROCESSED)
