"""Every registered function, called as the host would, on in-memory adapters."""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import json
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import azure.functions as func
import pytest
from azure.functions.servicebus import ServiceBusMessage

from devhost.host.invoke import InvocationContext, TraceContext
from devhost.host.loader import FunctionSpec
from shared import bootstrap
from shared.adapters.clock import FakeClock
from shared.adapters.memory.store import InMemoryBus, InMemoryStateStore
from shared.domain.in_doubt import RemoteOutcome
from shared.domain.model import JsonObject
from shared.domain.workflow import Catalogue
from shared.ports import RemoteCall, RemoteService
from shared.settings import Settings
from tests.app_functions import registered_functions
from tests.workflows import AGENTS, CATALOGUE, AgentName

SETTINGS = {
    "AzureWebJobsStorage": "UseDevelopmentStorage=true",
    "ServiceBusConnection": "Endpoint=sb://127.0.0.1;SharedAccessKeyName=k;SharedAccessKey=v;UseDevelopmentEmulator=true;",
    "StepTimeoutSeconds": "30",
    "PendingTimeoutSeconds": "60",
    "MaxFailureCount": "3",
    "ReplyToAllowList": "client-a,order-status",
    "WEBSITE_INSTANCE_ID": "test-instance",
}


@dataclass
class ScriptedRemote:
    """A remote service that answers from a script and records every call."""

    answers: list[Any] = field(default_factory=list)
    calls: list[RemoteCall] = field(default_factory=list)
    probes: int = 0
    outcomes: dict[str, RemoteOutcome] = field(default_factory=dict)
    queries: list[str] = field(default_factory=list)
    abandons: dict[str, RemoteOutcome] = field(default_factory=dict)
    abandoned: list[str] = field(default_factory=list)

    async def invoke(self, call: RemoteCall, timeout: float) -> JsonObject:
        self.calls.append(call)
        answer = self.answers.pop(0) if self.answers else {"ok": True}
        if isinstance(answer, Exception):
            raise answer
        return dict(answer)

    async def probe(self, timeout: float) -> None:
        self.probes += 1

    async def outcome(self, key: str, timeout: float) -> RemoteOutcome:
        """No answer unless scripted: the Supervisor then retries as it would without asking."""
        self.queries.append(key)
        return self.outcomes.get(key, RemoteOutcome.unknown("not scripted"))

    async def abandon(self, key: str, timeout: float) -> RemoteOutcome:
        """No answer unless scripted: the key then stays unsettled."""
        self.abandoned.append(key)
        return self.abandons.get(key, RemoteOutcome.unknown("not scripted"))


@dataclass
class Harness:
    store: InMemoryStateStore
    bus: InMemoryBus
    clock: FakeClock
    remotes: dict[AgentName, ScriptedRemote]
    functions: dict[str, FunctionSpec]
    container: bootstrap.Container

    def run_on(self, catalogue: Catalogue) -> None:
        """The app runs `catalogue` from the next call on, as an instance deployed with it
        would (its settings and its use cases' catalogue alike)."""
        c = self.container
        c.settings = dataclasses.replace(c.settings, catalogue=catalogue)
        c.process = dataclasses.replace(c.process, catalogue=catalogue)

    async def http(
        self,
        name: str,
        method: str,
        path: str,
        body: Any = None,
        *,
        raw: bytes | None = None,
        headers: dict[str, str] | None = None,
        params: dict[str, str] | None = None,
        route_params: dict[str, str] | None = None,
    ) -> func.HttpResponse:
        data = raw if raw is not None else (json.dumps(body).encode() if body is not None else b"")
        request = func.HttpRequest(
            method,
            f"http://localhost:7071/api/{path}",
            headers={"content-type": "application/json", **(headers or {})},
            params=params or {},
            route_params=route_params or {},
            body=data,
        )
        response: func.HttpResponse = await self.functions[name].func(
            request, **context_for(self.functions[name])
        )
        return response

    async def message(
        self,
        name: str,
        body: Any,
        message_id: str = "m-1",
        properties: dict[str, Any] | None = None,
    ) -> None:
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        msg = ServiceBusMessage(
            body=data,
            message_id=message_id,
            delivery_count=1,
            application_properties=properties or {},
            user_properties=properties or {},
        )
        await self.functions[name].func(msg, **context_for(self.functions[name]))


def context_for(spec: FunctionSpec, trace_parent: str = "") -> dict[str, Any]:
    """The `context` argument, for the functions that take one, as the host passes it."""
    if "context" not in inspect.signature(spec.func).parameters:
        return {}
    trace = TraceContext(trace_parent=trace_parent)
    return {"context": InvocationContext("test-invocation", spec.name, trace_context=trace)}


@contextlib.asynccontextmanager
async def harness_with(settings: Mapping[str, str]) -> AsyncIterator[Harness]:
    """The harness with `settings` over SETTINGS (e.g. EventSigningSecret)."""
    store, bus, clock = InMemoryStateStore(), InMemoryBus(), FakeClock()
    remotes = {name: ScriptedRemote() for name in AGENTS}
    remote_ports: dict[AgentName, RemoteService] = dict(remotes)
    values = Settings.from_env({**SETTINGS, **settings}, catalogue=CATALOGUE)
    container = bootstrap.compose(values, store, bus, remote_ports, clock)
    bootstrap.use(container)
    try:
        functions = {f.name: f for f in registered_functions()}
        yield Harness(store, bus, clock, remotes, functions, container)
    finally:
        bootstrap.reset()


@pytest.fixture
async def harness() -> AsyncIterator[Harness]:
    async with harness_with({}) as started:
        yield started
