"""A throwaway Function App with one trigger of each kind, built per test.

``get_functions()`` may be called only once per app, so every test gets a fresh app;
the ``Recorder`` is how the functions report back what the runtime handed them.
"""

from __future__ import annotations

import asyncio
import io
import json
import logging
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import azure.functions as func
import pytest

from devhost.__main__ import configure_logging
from devhost.host import HostConfig, LocalHost, functions_of

QUEUE = "devhost-test"


@dataclass
class Recorder:
    """What the test app's functions saw, plus knobs to make them slow or fail."""

    messages: list[dict[str, Any]] = field(default_factory=list)
    failed_once: set[str] = field(default_factory=set)
    succeeded: set[str] = field(default_factory=set)
    ticks: int = 0
    timer_running: int = 0
    timer_max_running: int = 0
    timer_delay: float = 0.0
    timer_started: asyncio.Event = field(default_factory=asyncio.Event)
    handler_delay: float = 0.0
    handlers_running: int = 0
    handlers_max_running: int = 0
    # Set once `expected` distinct messages were handled without raising.
    completed: asyncio.Event = field(default_factory=asyncio.Event)
    expected: int = 1


def build_app(
    recorder: Recorder,
    *,
    schedule: str = "*/1 * * * * *",
    timer: bool = True,
    servicebus: bool = True,
) -> func.FunctionApp:
    """HTTP routes always; the timer and the queue trigger only when the test wants them."""
    bp = func.Blueprint()

    @bp.route(route="items/{itemId}", methods=["GET"], auth_level=func.AuthLevel.FUNCTION)
    async def get_item(req: func.HttpRequest) -> func.HttpResponse:
        body = {
            "itemId": req.route_params["itemId"],
            "q": req.params.get("q"),
            "header": req.headers.get("x-test"),
            "url": req.url,
        }
        return func.HttpResponse(json.dumps(body), mimetype="application/json")

    @bp.route(route="items/special", methods=["GET"])
    def special_item(req: func.HttpRequest) -> func.HttpResponse:
        # A sync function: the runtime runs it in a worker thread.
        return func.HttpResponse("literal", headers={"X-Route": "literal"})

    @bp.route(route="items", methods=["POST"], auth_level=func.AuthLevel.ANONYMOUS)
    async def create_item(req: func.HttpRequest) -> func.HttpResponse:
        payload = req.get_json()
        return func.HttpResponse(
            json.dumps({"received": payload}), status_code=201, mimetype="application/json"
        )

    @bp.route(route="broken/{why?}", methods=["GET"])
    async def broken(req: func.HttpRequest) -> func.HttpResponse:
        # What the client chose, quoted in the exception as app code often does.
        raise RuntimeError(f"deliberately broken {req.route_params.get('why', '')}".rstrip())

    async def tick(timer: func.TimerRequest) -> None:
        recorder.ticks += 1
        recorder.timer_running += 1
        recorder.timer_started.set()
        recorder.timer_max_running = max(recorder.timer_max_running, recorder.timer_running)
        try:
            await asyncio.sleep(recorder.timer_delay)
        finally:
            recorder.timer_running -= 1

    async def consume(msg: func.ServiceBusMessage) -> None:
        recorder.handlers_running += 1
        recorder.handlers_max_running = max(
            recorder.handlers_max_running, recorder.handlers_running
        )
        try:
            recorder.messages.append(
                {
                    "id": msg.message_id,
                    "body": msg.get_body(),
                    "delivery_count": msg.delivery_count,
                    "properties": dict(msg.application_properties),
                    "content_type": msg.content_type,
                    "correlation_id": msg.correlation_id,
                }
            )
            await asyncio.sleep(recorder.handler_delay)
            if msg.message_id.startswith("fail-") and msg.message_id not in recorder.failed_once:
                recorder.failed_once.add(msg.message_id)
                raise RuntimeError(f"first delivery of {msg.message_id} fails")
            recorder.succeeded.add(msg.message_id)
            if len(recorder.succeeded) >= recorder.expected:
                recorder.completed.set()
        finally:
            recorder.handlers_running -= 1

    if timer:
        bp.timer_trigger(schedule=schedule, arg_name="timer")(tick)
    if servicebus:
        bp.service_bus_queue_trigger(arg_name="msg", queue_name=QUEUE, connection="TestBus")(
            consume
        )
    app = func.FunctionApp(http_auth_level=func.AuthLevel.FUNCTION)
    app.register_functions(bp)
    return app


HostFactory = Callable[..., LocalHost]


@pytest.fixture
async def make_host() -> AsyncIterator[HostFactory]:
    """Build and start ``LocalHost`` instances, stopping them whatever the test did."""
    hosts: list[LocalHost] = []

    def factory(
        app: func.FunctionApp,
        settings: dict[str, str],
        host_json: dict[str, Any] | None = None,
    ) -> LocalHost:
        host = LocalHost(
            functions_of(app),
            settings,
            config=HostConfig.from_dict(host_json or {}),
            port=0,
            drain_timeout=5.0,
        )
        hosts.append(host)
        return host

    yield factory
    for host in hosts:
        await host.stop()


@pytest.fixture
def console(monkeypatch: pytest.MonkeyPatch) -> Iterator[io.StringIO]:
    """The runtime's logging as `python -m devhost` configures it, into a buffer."""
    stream = io.StringIO()
    monkeypatch.setattr("sys.stderr", stream)
    root = logging.getLogger()
    saved = (root.handlers[:], root.level)
    configure_logging(verbose=False)
    try:
        yield stream
    finally:
        root.handlers[:], _ = saved
        root.setLevel(saved[1])
