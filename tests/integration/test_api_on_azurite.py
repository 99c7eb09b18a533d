"""The HTTP functions on real Azurite (table and blob), for what only the real stores
show (issue 41):

- their own continuations (a Table Storage token, a rest-index key, a watch-list order
  id, a blob marker) wrapped in the API's token, each listing paged to its end, junk
  refused with a 400 rather than read as a place to start;
- an archived order, gone from the table, is final to every action route (409), as
  `GET /api/orders/{id}` shows it, not unknown (404)."""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import azure.functions as func
import pytest
from azure.data.tables.aio import TableServiceClient
from azure.storage.blob.aio import BlobServiceClient

from devhost.host.loader import FunctionSpec
from shared import bootstrap
from shared.adapters.blob_archive import BlobArchive
from shared.adapters.clock import FakeClock
from shared.adapters.memory.store import InMemoryBus
from shared.adapters.table.archive import TableArchiveStore
from shared.adapters.table.store import TableStateStore
from shared.domain.archive import RetentionPolicy
from shared.domain.model import ProcessState
from shared.ports import RemoteService
from shared.settings import Settings, azurite_connection_string
from shared.usecases.history.archive import Archiver
from tests.app_functions import registered_functions
from tests.functions.conftest import SETTINGS, ScriptedRemote, context_for
from tests.functions.test_smaller_edges import JUNK_TOKENS
from tests.integration.test_archive_on_azurite import put
from tests.workflows import AGENTS, CATALOGUE, AgentName

pytestmark = pytest.mark.azurite

NOW = datetime(2026, 12, 31, 12, 0, tzinfo=UTC)
OLD = NOW - timedelta(days=40)
"""Past the default retention of a Processed order: due for the archive."""


@dataclass
class App:
    store: TableStateStore
    blobs: BlobArchive
    clock: FakeClock
    functions: dict[str, FunctionSpec]

    async def http(
        self,
        name: str,
        method: str = "GET",
        *,
        params: dict[str, str] | None = None,
        route_params: dict[str, str] | None = None,
        body: Any = None,
    ) -> func.HttpResponse:
        request = func.HttpRequest(
            method,
            f"http://localhost:7071/api/{name}",
            headers={"content-type": "application/json"},
            params=params or {},
            route_params=route_params or {},
            body=json.dumps(body).encode() if body is not None else b"",
        )
        spec = self.functions[name]
        response: func.HttpResponse = await spec.func(request, **context_for(spec))
        return response

    async def archive(self, page_size: int = 100) -> None:
        archive = TableArchiveStore(self.store)
        run = await Archiver(
            self.store,
            archive,
            self.blobs,
            self.clock,
            "test",
            RetentionPolicy(),
            page_size=page_size,
        ).run()
        assert run.archived > 0


@pytest.fixture
async def app(azurite_table_port: int, azurite_blob_port: int) -> AsyncIterator[App]:
    connection = azurite_connection_string(azurite_table_port, blob_port=azurite_blob_port)
    store = TableStateStore(
        TableServiceClient.from_connection_string(connection), f"a{uuid.uuid4().hex[:20]}"
    )
    blobs = BlobArchive(
        BlobServiceClient.from_connection_string(connection), f"a{uuid.uuid4().hex[:20]}"
    )
    clock = FakeClock(NOW)
    remotes: dict[AgentName, RemoteService] = {name: ScriptedRemote() for name in AGENTS}
    settings = Settings.from_env(SETTINGS, catalogue=CATALOGUE)
    bootstrap.use(bootstrap.compose(settings, store, InMemoryBus(), remotes, clock, blobs=blobs))
    try:
        yield App(store, blobs, clock, {f.name: f for f in registered_functions()})
    finally:
        bootstrap.reset()
        await store.close()
        await blobs.close()


def body(response: func.HttpResponse) -> Any:
    return json.loads(response.get_body())


async def pages(app: App, name: str, size: dict[str, str], **kw: Any) -> list[list[str]]:
    """Every page of a listing, followed by its tokens to the end."""
    found: list[list[str]] = []
    params = {**kw.pop("params", {}), **size}
    for _ in range(20):
        answer = await app.http(name, params=params, **kw)
        assert answer.status_code == 200, answer.get_body()
        page = body(answer)
        found.append([item["orderId"] for item in page["items"]])
        if page["continuation"] is None:
            return found
        params = {**params, "continuation": page["continuation"]}
    raise AssertionError(f"{name} never ended: {found}")


LISTINGS = {"every order": {}, "at rest": {"state": "Suspended"}, "in flight": {"state": "Pending"}}


async def test_every_listing_pages_by_its_tokens_and_refuses_junk(app: App) -> None:
    for i in range(3):
        await put(app.store, f"sus-{i}", ProcessState.SUSPENDED, NOW)
    for i in range(3):
        await put(app.store, f"pen-{i}", ProcessState.PENDING, NOW)
    expected = {"every order": 6, "at rest": 3, "in flight": 3}
    for listing, params in LISTINGS.items():
        found = await pages(app, "list_orders_http", {"pageSize": "2"}, params=params)
        ids = [i for page in found for i in page]
        assert len(ids) == len(set(ids)) == expected[listing], (listing, found)
        for junk, token in JUNK_TOKENS.items():
            answer = await app.http("list_orders_http", params={**params, "continuation": token})
            assert answer.status_code == 400, (listing, junk, answer.get_body())


async def test_an_archive_day_pages_by_its_tokens_and_refuses_junk(app: App) -> None:
    for i in range(5):
        await put(app.store, f"arch-{i}", ProcessState.PROCESSED, OLD)
    await app.archive(page_size=2)  # three blobs under the day
    day = OLD.date().isoformat()
    found = await pages(app, "archive_day", {"pages": "1"}, route_params={"day": day})
    assert len(found) == 3 and sorted(i for p in found for i in p) == [
        f"arch-{i}" for i in range(5)
    ]
    first = body(await app.http("archive_day", params={"pages": "1"}, route_params={"day": day}))
    other_day = (OLD.date() + timedelta(days=1)).isoformat()
    elsewhere = await app.http(
        "archive_day",
        params={"continuation": first["continuation"]},
        route_params={"day": other_day},
    )
    assert elsewhere.status_code == 400, "a token of one day does not page another"
    for junk, token in JUNK_TOKENS.items():
        answer = await app.http(
            "archive_day", params={"continuation": token}, route_params={"day": day}
        )
        assert answer.status_code == 400, (junk, answer.get_body())


ACTIONS = (
    "resubmit_order_http",
    "cancel_order_http",
    "suspend_order_http",
    "resume_order_http",
    "send_event_http",
)


async def act(app: App, name: str, order_id: str) -> func.HttpResponse:
    if name == "send_event_http":
        route = {"orderId": order_id, "eventName": "review"}
        return await app.http(name, "POST", route_params=route, body={"eventId": "ev-1"})
    return await app.http(name, "POST", route_params={"orderId": order_id})


async def test_every_action_on_an_archived_order_is_a_409_as_for_any_final_order(
    app: App,
) -> None:
    await put(app.store, "gone-1", ProcessState.PROCESSED, OLD)
    await app.archive()
    assert await app.store.load("gone-1") is None, "its rows left the table"
    shown = await app.http("get_order", route_params={"orderId": "gone-1"})
    assert shown.status_code == 200
    assert body(shown)["processState"] == "Processed" and body(shown)["archived"] is True

    for name in ACTIONS:
        answer = await act(app, name, "gone-1")
        assert answer.status_code == 409, (name, answer.get_body())
        problem = body(answer)
        assert (problem["title"], problem["code"]) == ("Archived", "archived"), name
        assert "gone-1" in problem["detail"] and "archived" in problem["detail"], name
        assert (await act(app, name, "never-was")).status_code == 404, name
