"""The state store's single-entity requests sent on aiohttp (shared/adapters/table/entities.py).

Against a local aiohttp server that records what reaches it: each request is the one the
SDK sends for the same call (method, path, query, headers that carry meaning, body byte
for byte), a bearer token goes in the header, and a failure is retried as azure-core's
retry policy retries it. Against Azurite: rows written one way read back identically the
other, with every property type the rows use; the service's refusals (409, 412, 404)
come back as the SDK's errors; odd keys and values travel as they do through the SDK.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import pytest
from aiohttp import web
from azure.core import MatchConditions
from azure.core.credentials import AccessToken
from azure.core.exceptions import (
    AzureError,
    HttpResponseError,
    ResourceExistsError,
    ResourceModifiedError,
    ResourceNotFoundError,
)
from azure.data.tables import EdmType, EntityProperty, UpdateMode
from azure.data.tables.aio import TableClient, TableServiceClient

from devhost.harness.ports import LOOPBACK, free_port
from shared.adapters.table import client as table_client
from shared.adapters.table.entities import STORAGE_SCOPE, TableEntities
from shared.settings import azurite_connection_string
from tests.integration.test_table_keepalive import SERVER_IDLE, proxy

ETAG = "W/\"datetime'2026-11-29T10%3A00%3A00.1234567Z'\""
ANSWER_HEADERS = {
    "ETag": ETAG,
    "x-ms-version": "2019-02-02",
    "Date": "Sun, 29 Nov 2026 10:00:00 GMT",
}
MEANINGFUL = ("Content-Type", "Accept", "If-Match", "x-ms-version", "DataServiceVersion")
"""Request headers the service acts on; the rest (date, request id, user agent) vary."""

ODD_KEYS = ["o'1", "o''2 é", "100% & + = ; , ( ) * ! $ @ :", "ü-日本-😀", "a~b_c.d-e"]
WIRE_KEYS = [*ODD_KEYS, "a/b#c?d\\e"]
"""With the characters the service refuses in keys: quoted on the wire as the SDK quotes them."""
ODD_TEXT = "quote ' double \" hash # ask ? slash / back \\ é 日本 😀 \t\n"


@dataclass
class Seen:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes


@dataclass
class Recorder:
    """A table service that records each request and answers from `answers` (status,
    extra headers) in turn, then 204 (200 with an entity for a GET)."""

    seen: list[Seen] = field(default_factory=list)
    answers: list[tuple[int, dict[str, str]]] = field(default_factory=list)
    port: int = 0

    async def handle(self, request: web.Request) -> web.StreamResponse:
        self.seen.append(
            Seen(request.method, request.raw_path, dict(request.headers), await request.read())
        )
        if self.answers:
            status, headers = self.answers.pop(0)
            body = {"odata.error": {"code": "ServerBusy", "message": {"value": "busy"}}}
            return web.json_response(body, status=status, headers={**ANSWER_HEADERS, **headers})
        if request.method == "GET":
            entity = {
                "odata.etag": ETAG,
                "PartitionKey": "p",
                "RowKey": "r",
                "Timestamp": "2026-11-29T10:00:00.1234567Z",
                "Text": ODD_TEXT,
                "At@odata.type": "Edm.DateTime",
                "At": "2026-11-29T10:00:00.123456Z",
            }
            return web.json_response(entity, headers=ANSWER_HEADERS)
        return web.Response(status=204, headers=ANSWER_HEADERS)

    def connection_string(self) -> str:
        return azurite_connection_string(self.port)


@pytest.fixture
async def recorder() -> AsyncIterator[Recorder]:
    recording = Recorder()
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", recording.handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, LOOPBACK, 0)
    await site.start()
    recording.port = int(site._server.sockets[0].getsockname()[1])  # type: ignore[union-attr]
    try:
        yield recording
    finally:
        await runner.cleanup()


def an_entity(pk: str = "o'1 é", rk: str = "state") -> dict[str, Any]:
    """Every property type the state, watch and rest rows hold, and the ones the SDK
    annotates that they may come to hold."""
    return {
        "PartitionKey": pk,
        "RowKey": rk,
        "Text": ODD_TEXT,
        "Count": 7,
        "Negative": -(2**31),
        "Flag": True,
        "Ratio": 2.5,
        "At": datetime(2026, 11, 29, 10, 11, 12, 345678, tzinfo=UTC),
        "Large": EntityProperty(2**40, EdmType.INT64),
        "Bytes": b"\x00\x01binary\xff",
        "Id": uuid.UUID("c9da6455-213d-42c9-9a79-3e9149a57833"),
    }


Call = Callable[[Any], Awaitable[object]]
"""One operation, given a TableClient (the SDK) or TableEntities (this path)."""


def upserts(key: str) -> tuple[Call, Call]:
    return (
        lambda t: t.upsert_entity(an_entity(key, key), mode=UpdateMode.REPLACE),
        lambda e: e.replace(an_entity(key, key), None),
    )


SAME_REQUESTS: dict[str, tuple[Call, Call]] = {
    "insert": (
        lambda t: t.create_entity(an_entity()),
        lambda e: e.insert(an_entity()),
    ),
    "If-Match replace": (
        lambda t: t.update_entity(
            an_entity(),
            mode=UpdateMode.REPLACE,
            etag=ETAG,
            match_condition=MatchConditions.IfNotModified,
        ),
        lambda e: e.replace(an_entity(), ETAG),
    ),
    "upsert": (
        lambda t: t.upsert_entity(an_entity(), mode=UpdateMode.REPLACE),
        lambda e: e.replace(an_entity(), None),
    ),
    "merge if present": (
        lambda t: t.update_entity(
            {"PartitionKey": "~watch-01", "RowKey": "o-1"}, mode=UpdateMode.MERGE
        ),
        lambda e: e.merge({"PartitionKey": "~watch-01", "RowKey": "o-1"}, "*"),
    ),
    "delete": (
        lambda t: t.delete_entity("~watch-01", "o-1"),
        lambda e: e.delete("~watch-01", "o-1"),
    ),
    "If-Match delete": (
        lambda t: t.delete_entity(
            "p", "r", etag=ETAG, match_condition=MatchConditions.IfNotModified
        ),
        lambda e: e.delete("p", "r", ETAG),
    ),
    "point read": (
        lambda t: t.get_entity("o'1 é", "state"),
        lambda e: e.read("o'1 é", "state"),
    ),
    "point read of some columns": (
        lambda t: t.get_entity("p", "r", select=["StateVersion", "Version"]),
        lambda e: e.read("p", "r", ["StateVersion", "Version"]),
    ),
    **{f"replace of key {key!r}": upserts(key) for key in WIRE_KEYS},
}


@pytest.mark.parametrize("operation", sorted(SAME_REQUESTS))
async def test_each_request_is_the_one_the_sdk_sends(recorder: Recorder, operation: str) -> None:
    through_sdk, through_here = SAME_REQUESTS[operation]
    service = TableServiceClient.from_connection_string(recorder.connection_string())
    table = service.get_table_client("Orders")
    entities = TableEntities.of(service, "Orders")
    try:
        sdk_result = await through_sdk(table)
        here_result = await through_here(entities)
    finally:
        await entities.close()
        await table.close()
        await service.close()
    sdk, here = recorder.seen
    assert (here.method, here.path) == (sdk.method, sdk.path)
    assert {h: here.headers.get(h) for h in MEANINGFUL} == {
        h: sdk.headers.get(h) for h in MEANINGFUL
    }
    assert here.body == sdk.body
    assert here.headers["Authorization"].startswith("SharedKey devstoreaccount1:")
    if sdk.method == "POST":
        assert here.headers["Prefer"] == "return-no-content"  # the one header added
    if sdk.method == "GET":
        assert here_result == sdk_result
        assert here_result.metadata == sdk_result.metadata  # type: ignore[attr-defined]
    elif isinstance(sdk_result, dict):
        assert here_result == sdk_result["etag"]


async def test_a_key_with_a_lone_surrogate_is_refused_as_the_sdk_refuses_it(
    recorder: Recorder,
) -> None:
    service = TableServiceClient.from_connection_string(recorder.connection_string())
    table = service.get_table_client("Orders")
    entities = TableEntities.of(service, "Orders")
    try:
        with pytest.raises(UnicodeEncodeError):
            await table.get_entity("o-\ud800", "state")
        with pytest.raises(UnicodeEncodeError):
            await entities.read("o-\ud800", "state")
        with pytest.raises(UnicodeEncodeError):
            await entities.replace(an_entity("o-\udfff"), None)
        assert recorder.seen == []
    finally:
        await entities.close()
        await table.close()
        await service.close()


class FakeCredential:
    """An AsyncTokenCredential whose tokens expire `lifetime` seconds after issue."""

    def __init__(self, lifetime: float) -> None:
        self.lifetime = lifetime
        self.asked: list[tuple[str, ...]] = []

    async def get_token(self, *scopes: str, **kwargs: Any) -> AccessToken:
        await asyncio.sleep(0)  # a credential's network call lets others run
        self.asked.append(scopes)
        return AccessToken(f"token-{len(self.asked)}", int(time.time() + self.lifetime))

    async def close(self) -> None:
        return None

    async def __aenter__(self) -> FakeCredential:
        return self

    async def __aexit__(self, *args: object) -> None:
        return None


@pytest.mark.parametrize(
    ("lifetime", "tokens"),
    [(3600, ["token-1", "token-1", "token-1"]), (200, ["token-1", "token-2", "token-3"])],
    ids=["kept while fresh", "asked again within five minutes of its expiry"],
)
async def test_a_bearer_token_from_the_credential_goes_in_the_header(
    recorder: Recorder, lifetime: float, tokens: list[str]
) -> None:
    """Over http only here: the SDK's client, whose endpoint and credential
    `TableEntities.of` takes in the app, refuses a token credential without https."""
    credential = FakeCredential(lifetime)
    entities = TableEntities(f"http://{LOOPBACK}:{recorder.port}/account", "Orders", credential)
    try:
        await entities.insert(an_entity())
        await entities.replace(an_entity(), ETAG)
        await entities.read("p", "r")
    finally:
        await entities.close()
    assert [s.headers["Authorization"] for s in recorder.seen] == [f"Bearer {t}" for t in tokens]
    assert set(credential.asked) == {(STORAGE_SCOPE,)}
    assert [s.path.split("(")[0] for s in recorder.seen] == ["/account/Orders"] * 3


async def test_a_token_expiring_under_concurrent_requests_is_asked_for_once(
    recorder: Recorder,
) -> None:
    credential = FakeCredential(3600)
    entities = TableEntities(f"http://{LOOPBACK}:{recorder.port}/account", "Orders", credential)
    try:
        await asyncio.gather(*(entities.read("p", f"r{i}") for i in range(8)))
    finally:
        await entities.close()
    assert len(credential.asked) == 1 and len(recorder.seen) == 8


def operation(name: str) -> Callable[[TableEntities], Awaitable[object]]:
    return {
        "insert": lambda e: e.insert(an_entity()),
        "replace": lambda e: e.replace(an_entity(), ETAG),
        "merge": lambda e: e.merge(an_entity(), "*"),
        "delete": lambda e: e.delete("p", "r", ETAG),
        "read": lambda e: e.read("p", "r"),
    }[name]


@pytest.mark.parametrize(
    ("name", "status", "headers", "requests"),
    [
        ("replace", 503, {}, 2),
        ("delete", 500, {}, 2),
        ("read", 429, {}, 2),
        ("read", 408, {}, 2),
        ("insert", 503, {}, 2),
        ("merge", 500, {}, 2),
        ("insert", 502, {}, 1),
        ("insert", 429, {}, 1),
        ("replace", 412, {}, 1),
        ("insert", 409, {}, 1),
        ("insert", 409, {"Retry-After": "0"}, 2),
    ],
)
async def test_a_refusal_is_retried_once_where_azure_core_retries_it(
    recorder: Recorder, name: str, status: int, headers: dict[str, str], requests: int
) -> None:
    """The status codes and methods of azure-core's RetryPolicy at `retry_total=1`."""
    recorder.answers = [(status, headers), (status, headers)]
    service = TableServiceClient.from_connection_string(recorder.connection_string())
    entities = TableEntities.of(service, "Orders")
    try:
        with pytest.raises(HttpResponseError) as refused:
            await operation(name)(entities)
    finally:
        await entities.close()
        await service.close()
    assert refused.value.status_code == status
    assert len(recorder.seen) == requests


async def test_a_retry_that_is_answered_is_the_answer(recorder: Recorder) -> None:
    recorder.answers = [(503, {})]
    service = TableServiceClient.from_connection_string(recorder.connection_string())
    entities = TableEntities.of(service, "Orders")
    try:
        assert await entities.replace(an_entity(), None) == ETAG
    finally:
        await entities.close()
        await service.close()
    assert len(recorder.seen) == 2 and recorder.seen[0].body == recorder.seen[1].body


@dataclass
class Cutting:
    """A server that reads a request and closes the connection without an answer."""

    requests: int = 0

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while await reader.readuntil(b"\r\n\r\n"):
            self.requests += 1
            writer.close()
            return


def sdk_operation(name: str) -> Callable[[TableClient], Awaitable[object]]:
    return {
        "insert": lambda t: t.create_entity(an_entity()),
        "replace": lambda t: t.update_entity(
            an_entity(),
            mode=UpdateMode.REPLACE,
            etag=ETAG,
            match_condition=MatchConditions.IfNotModified,
        ),
        "merge": lambda t: t.update_entity(an_entity(), mode=UpdateMode.MERGE),
        "delete": lambda t: t.delete_entity(
            "p", "r", etag=ETAG, match_condition=MatchConditions.IfNotModified
        ),
        "read": lambda t: t.get_entity("p", "r"),
    }[name]


async def cut_off(call: Callable[[int], Awaitable[object]]) -> int:
    """Requests that reached a server which closes each connection unanswered."""
    cutting = Cutting()
    server = await asyncio.start_server(cutting.handle, LOOPBACK, 0)
    async with server:
        with pytest.raises(AzureError):
            await call(int(server.sockets[0].getsockname()[1]))
    return cutting.requests


@pytest.mark.parametrize(
    ("name", "sent_again"),
    [("read", True), ("replace", True), ("delete", True), ("insert", False), ("merge", False)],
)
async def test_a_request_left_unanswered_is_sent_again_as_the_sdk_sends_it(
    name: str, sent_again: bool
) -> None:
    """An insert or a merge the service may have applied is never sent twice; the store
    reads the failure as the store being unavailable, and the caller's retry decides. A
    GET, PUT or DELETE goes again as through the SDK: aiohttp itself sends such a
    request once more on a dropped connection, then the one retry does the same."""

    async def here(port: int) -> None:
        service = table_client.table_service_client(
            connection_string=azurite_connection_string(port)
        )
        entities = TableEntities.of(service, "Orders")
        try:
            await operation(name)(entities)
        finally:
            await entities.close()
            assert table_client.failures(service) == 1  # once per call, after its retry
            await service.close()

    async def sdk(port: int) -> None:
        service = table_client.table_service_client(
            connection_string=azurite_connection_string(port)
        )
        table = service.get_table_client("Orders")
        try:
            await sdk_operation(name)(table)
        finally:
            await table.close()
            await service.close()

    sent_here, sent_by_sdk = await cut_off(here), await cut_off(sdk)
    assert sent_here == sent_by_sdk
    assert (sent_here > 1) is sent_again


async def test_a_store_that_is_down_counts_one_failure_per_call() -> None:
    service = table_client.table_service_client(
        connection_string=azurite_connection_string(free_port())
    )
    entities = TableEntities.of(service, "Orders")
    try:
        for call in ("insert", "read"):
            with pytest.raises(AzureError):
                await operation(call)(entities)
    finally:
        await entities.close()
        await service.close()
    assert table_client.failures(service) == 2


# Against Azurite.


@dataclass
class Both:
    table: TableClient
    entities: TableEntities


@pytest.fixture
async def both(azurite_table_port: int) -> AsyncIterator[Both]:
    service = table_client.table_service_client(
        connection_string=azurite_connection_string(azurite_table_port)
    )
    name = f"e{uuid.uuid4().hex[:16]}"
    await service.create_table(name)
    table = service.get_table_client(name)
    entities = TableEntities.of(service, name)
    try:
        yield Both(table, entities)
    finally:
        await entities.close()
        await table.delete_table()
        await table.close()
        await service.close()


def without_keys(entity: Any) -> dict[str, Any]:
    return {k: v for k, v in entity.items() if k not in ("PartitionKey", "RowKey")}


@pytest.mark.azurite
async def test_a_row_written_here_reads_back_through_the_sdk_as_the_sdks_own(both: Both) -> None:
    await both.entities.insert(an_entity("p", "here"))
    await both.table.create_entity(an_entity("p", "sdk"))
    found = {e["RowKey"]: e async for e in both.table.query_entities("PartitionKey eq 'p'")}
    assert without_keys(found["here"]) == without_keys(found["sdk"])
    assert {k: type(v) for k, v in found["here"].items()} == {
        k: type(v) for k, v in found["sdk"].items()
    }
    assert found["here"]["Large"] == EntityProperty(2**40, EdmType.INT64)
    assert found["here"]["At"] == an_entity()["At"]
    assert found["here"]["Bytes"] == an_entity()["Bytes"]


@pytest.mark.azurite
async def test_a_row_the_sdk_wrote_is_read_here_as_the_sdk_reads_it(both: Both) -> None:
    written = await both.table.create_entity(an_entity("p", "sdk"))
    here = await both.entities.read("p", "sdk")
    sdk = await both.table.get_entity("p", "sdk")
    assert here == sdk
    assert here.metadata == sdk.metadata
    assert here.metadata["etag"] == written["etag"]
    assert dict(await both.entities.read("p", "sdk", ["Count", "Text"])) == dict(
        await both.table.get_entity("p", "sdk", select=["Count", "Text"])
    )


@pytest.mark.azurite
async def test_the_etag_a_write_returns_is_the_one_a_read_finds(both: Both) -> None:
    inserted = await both.entities.insert(an_entity("p", "r"))
    assert (await both.entities.read("p", "r")).metadata["etag"] == inserted
    replaced = await both.entities.replace(an_entity("p", "r"), inserted)
    assert replaced != inserted
    assert (await both.table.get_entity("p", "r")).metadata["etag"] == replaced
    merged = await both.entities.merge({"PartitionKey": "p", "RowKey": "r"}, "*")
    assert (await both.entities.read("p", "r")).metadata["etag"] == merged


@pytest.mark.azurite
async def test_the_services_refusals_are_the_sdks_errors(both: Both) -> None:
    first = await both.entities.insert(an_entity("p", "r"))
    with pytest.raises(ResourceExistsError) as exists:
        await both.entities.insert(an_entity("p", "r"))
    assert exists.value.status_code == 409
    assert "EntityAlreadyExists" in str(exists.value)
    await both.entities.replace(an_entity("p", "r"), first)
    with pytest.raises(ResourceModifiedError) as stale:
        await both.entities.replace(an_entity("p", "r"), first)
    assert stale.value.status_code == 412
    with pytest.raises(ResourceModifiedError):
        await both.entities.delete("p", "r", first)
    with pytest.raises(ResourceNotFoundError) as missing:
        await both.entities.replace(an_entity("p", "gone"), first)
    assert missing.value.status_code == 404
    with pytest.raises(ResourceNotFoundError):
        await both.entities.merge({"PartitionKey": "p", "RowKey": "gone"}, "*")
    with pytest.raises(ResourceNotFoundError):
        await both.entities.read("p", "gone")
    await both.entities.delete("p", "gone")  # quiet, as the SDK's delete is
    await both.entities.delete("p", "r")
    with pytest.raises(ResourceNotFoundError):
        await both.table.get_entity("p", "r")


@pytest.mark.azurite
@pytest.mark.parametrize("key", ODD_KEYS)
async def test_an_odd_key_and_odd_text_travel_as_through_the_sdk(both: Both, key: str) -> None:
    etag = await both.entities.replace(an_entity(key, key), None)
    found = await both.table.get_entity(key, key)
    assert found["Text"] == ODD_TEXT and found.metadata["etag"] == etag
    assert await both.entities.read(key, key) == found
    await both.entities.delete(key, key, etag)
    assert [e async for e in both.table.list_entities()] == []


@pytest.mark.azurite
async def test_a_value_with_a_lone_surrogate_meets_what_the_sdk_meets(both: Both) -> None:
    """The SDK's JSON escapes it (`\\ud800`); whatever the service does with that, it
    does the same with a row written here."""
    odd = {"PartitionKey": "p", "RowKey": "r", "Text": "a\ud800b"}

    async def outcome(write: Callable[[], Awaitable[object]], row: str) -> object:
        try:
            await write()
        except HttpResponseError as exc:
            return exc.status_code
        return (await both.table.get_entity("p", row))["Text"]

    sdk = await outcome(lambda: both.table.create_entity({**odd, "RowKey": "sdk"}), "sdk")
    here = await outcome(lambda: both.entities.insert({**odd, "RowKey": "here"}), "here")
    assert here == sdk


@pytest.mark.azurite
async def test_an_insert_after_a_pause_does_not_meet_a_closing_connection(
    azurite_table_port: int,
) -> None:
    """The case client.py's short keep-alive is for, on this path's own connections: an
    insert is not retried, so a connection the emulator is closing would lose it."""
    async with proxy(azurite_table_port) as (closing, port):
        service = table_client.table_service_client(
            connection_string=azurite_connection_string(port)
        )
        name = f"k{uuid.uuid4().hex[:16]}"
        await service.create_table(name)
        entities = TableEntities.of(service, name)
        try:
            await entities.insert(an_entity("p", "1"))
            await asyncio.sleep(SERVER_IDLE + 0.2)
            await entities.insert(an_entity("p", "2"))
            assert closing.dropped == 0
        finally:
            await entities.close()
            await service.delete_table(name)
            await service.close()
