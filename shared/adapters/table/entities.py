"""Single-entity requests to Table Storage sent on aiohttp directly: the state store's
hot path (insert, replace or merge with or without If-Match, delete, point read).

Why not the SDK: each such call through azure-data-tables and azure-core cost the
runtime 1.2-1.5 ms of CPU, and a fault-free order makes seven. Most of it is the
pipeline around one HTTP request: a dozen policies, each a coroutine layer; the
generated (de)serializer walking the entity; the transport's wrappers; a parsed Date
header and an echoed entity nobody reads (bench/README.md, "A lean path to Table
Storage"). Queries, entity-group transactions, table creation and every other call stay
on the SDK (`TableClient`): one path per operation, so the contract tests on Azurite
test the one that runs.

The request on the wire is the SDK's, built from its own helpers: the body is
`_add_entity_properties` (the `@odata.type` annotations for Int64, DateTime, Binary,
Guid and Double) dumped by `json.dumps` as the SDK's pipeline does, keys are escaped by
`_prepare_key` and quoted as its URL serializer quotes them, and a point read is parsed
by `_convert_to_entity`, so a row written here reads back through the SDK's queries
unchanged and the other way round. Its errors are the SDK's types
(`ResourceExistsError`, `ResourceModifiedError`, `ResourceNotFoundError`,
`HttpResponseError`, with `status_code` and `error_code`; `ServiceRequestError` and
`ServiceResponseError` when no answer came), so errors.py stays the one place that says
what a 404, 409 or 412 means to a caller.

What it keeps from client.py's pipeline: the connection and read timeouts; one quick
retry, of the same failures azure-core's retry policy retries (see `_retried`); the
emulator's short keep-alive; and `FailureCount`, which the health check reads.

What it costs to keep:
* The API version (`API_VERSION`) is pinned to what azure-data-tables 12.7 sends; an SDK
  upgrade that moves it should move this too (tests/integration/test_table_entities.py
  compares both requests field by field, and fails when they part).
* Authentication is written here: Shared Key from a connection string (the emulator),
  a SAS token, or a bearer token from the `AsyncTokenCredential` for
  `https://storage.azure.com/.default`, kept until five minutes before it expires, as
  azure-core's `BearerTokenCredentialPolicy` keeps it.
* What the SDK did that this does not: no `x-ms-client-request-id` per request (support
  cases then go by time and partition, not by request id); no HTTP logging policy (its
  records of each request at Information level); no distributed tracing spans (the app
  turns the SDK's off anyway); no answer to a 401 challenge by asking for a token of
  another tenant (the app's identity is in the storage account's tenant); no refusal of
  a bearer token over plain http of its own (`of` takes the endpoint and credential of
  the SDK's client, which refuses that pair when it is made); no follow of
  a redirect (the table service sends none); no secondary-region read; and an insert
  asks for no echo of the entity (`Prefer: return-no-content`), which the SDK parsed and
  the store never read.
* It imports three private helpers of azure-data-tables (`_serialize`, `_deserialize`,
  `_common_conversion`): a release may move them, and the import fails loudly.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Mapping
from typing import Any, Final, Protocol
from urllib.parse import quote
from wsgiref.handlers import format_date_time

import aiohttp
from azure.core.credentials import AccessToken, AzureNamedKeyCredential, AzureSasCredential
from azure.core.credentials_async import AsyncTokenCredential
from azure.core.exceptions import (
    HttpResponseError,
    ResourceExistsError,
    ResourceModifiedError,
    ResourceNotFoundError,
    ServiceRequestError,
    ServiceRequestTimeoutError,
    ServiceResponseError,
    ServiceResponseTimeoutError,
)
from azure.data.tables import TableEntity
from azure.data.tables._common_conversion import _sign_string
from azure.data.tables._deserialize import _convert_to_entity
from azure.data.tables._serialize import _add_entity_properties, _prepare_key
from azure.data.tables.aio import TableServiceClient
from yarl import URL

from shared.adapters.table import client as table_client

API_VERSION: Final = "2019-02-02"
"""The `x-ms-version` azure-data-tables 12.7 sends."""
STORAGE_SCOPE: Final = "https://storage.azure.com/.default"
TOKEN_REFRESH_MARGIN: Final = 300
"""Seconds before a token's expiry that a new one is asked for, azure-core's margin."""

_RETRIED_METHODS: Final = frozenset({"GET", "PUT", "DELETE"})
_RETRIED_STATUSES: Final = frozenset({408, 429, 500, 502, 503, 504, *range(506, 999)})
_RETRIED_ANY_METHOD: Final = frozenset({500, 503, 504})

_JSON: Final = "application/json"
_NO_METADATA: Final = "application/json;odata=nometadata"
_MINIMAL_METADATA: Final = "application/json;odata=minimalmetadata"

_EXISTS_CODES: Final = frozenset(
    {"EntityAlreadyExists", "TableAlreadyExists", "ResourceAlreadyExists", "AccountAlreadyExists"}
)
_CHANGED_CODES: Final = frozenset({"UpdateConditionNotSatisfied", "ConditionNotMet"})
_MISSING_CODES: Final = frozenset({"ResourceNotFound", "TableNotFound", "EntityNotFound"})
_STATUS_ERRORS: Final[Mapping[int, type[HttpResponseError]]] = {
    404: ResourceNotFoundError,
    409: ResourceExistsError,
}


class _Authorizer(Protocol):
    async def authorize(
        self, headers: dict[str, str], method: str, content_type: str, path: str
    ) -> None: ...


class _SharedKey:
    """The SDK's SharedKeyCredentialPolicy: verb, Content-MD5 (never sent), Content-Type
    and x-ms-date, then the account and the path as sent, HMAC-SHA256 with the key."""

    def __init__(self, credential: AzureNamedKeyCredential) -> None:
        self._credential = credential

    async def authorize(
        self, headers: dict[str, str], method: str, content_type: str, path: str
    ) -> None:
        name, key = self._credential.named_key
        signed = f"{method}\n\n{content_type}\n{headers['x-ms-date']}\n/{name}{path}"
        signature = _sign_string(key, signed)  # type: ignore[no-untyped-call]
        headers["Authorization"] = f"SharedKey {name}:{signature}"


class _Bearer:
    """A token for `scope`, asked for once and again only near its expiry; concurrent
    requests that find it stale wait for one refresh."""

    def __init__(self, credential: AsyncTokenCredential, scope: str = STORAGE_SCOPE) -> None:
        self._credential = credential
        self._scope = scope
        self._token: AccessToken | None = None
        self._lock = asyncio.Lock()

    def _stale(self) -> bool:
        return self._token is None or self._token.expires_on - time.time() < TOKEN_REFRESH_MARGIN

    async def authorize(
        self, headers: dict[str, str], method: str, content_type: str, path: str
    ) -> None:
        if self._stale():
            async with self._lock:
                if self._stale():
                    self._token = await self._credential.get_token(self._scope)
        assert self._token is not None
        headers["Authorization"] = f"Bearer {self._token.token}"


class _NoAuthorization:
    """A SAS token travels in the URL's query."""

    async def authorize(
        self, headers: dict[str, str], method: str, content_type: str, path: str
    ) -> None:
        return None


class _Counter(Protocol):
    failures: int


class _OwnCount:
    """The count of a client not made by client.py, which nothing reads."""

    def __init__(self) -> None:
        self.failures = 0


class TableEntities:
    """One table's single-entity requests. The aiohttp session is made on first use,
    inside the running loop, and closed by `close`."""

    def __init__(
        self,
        account_url: str,
        table_name: str,
        credential: Any,
        *,
        keepalive: float | None = None,
        failures: _Counter | None = None,
        trace_configs: list[aiohttp.TraceConfig] | None = None,
    ) -> None:
        base = URL(account_url)
        query = base.query_string
        self._base = str(base.with_query(None)).rstrip("/")
        self._table = table_name
        self._query = query
        self._authorizer: _Authorizer
        if isinstance(credential, AzureNamedKeyCredential):
            self._authorizer = _SharedKey(credential)
        elif isinstance(credential, AzureSasCredential):
            self._query = credential.signature.lstrip("?")
            self._authorizer = _NoAuthorization()
        elif hasattr(credential, "get_token"):
            self._authorizer = _Bearer(credential)
        elif credential is None and query:
            self._authorizer = _NoAuthorization()
        else:
            raise TypeError(f"unsupported Table credential: {type(credential).__name__}")
        self._keepalive = keepalive
        self._count: _Counter = failures if failures is not None else _OwnCount()
        self._trace_configs = trace_configs
        self._session: aiohttp.ClientSession | None = None
        self._dated = (0, "")

    @classmethod
    def of(
        cls,
        service: TableServiceClient,
        table_name: str,
        *,
        trace_configs: list[aiohttp.TraceConfig] | None = None,
    ) -> TableEntities:
        """For a table of `service`: its endpoint and credential, and its failure count
        when client.py made it. A key or a SAS token means a connection string, an
        emulator's in this app, so idle connections go after `EMULATOR_KEEPALIVE` as
        client.py's transport lets them go."""
        credential = service.credential
        emulator = isinstance(credential, (AzureNamedKeyCredential, AzureSasCredential))
        return cls(
            service.url,
            table_name,
            credential,
            keepalive=table_client.EMULATOR_KEEPALIVE if emulator else None,
            failures=getattr(service, "failure_count", None),
            trace_configs=trace_configs,
        )

    @property
    def failures(self) -> int:
        return self._count.failures

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def insert(self, entity: Mapping[str, Any]) -> str:
        """The new entity's ETag; an existing one is ResourceExistsError (409)."""
        return await self._write("POST", self._entity_set(), entity, None, _NO_METADATA)

    async def replace(self, entity: Mapping[str, Any], if_match: str | None) -> str:
        """The whole entity: at `if_match` (an ETag, or `*` for any existing one), or
        inserted or replaced when None (an upsert)."""
        return await self._write("PUT", self._keyed(entity), entity, if_match, _JSON)

    async def merge(self, entity: Mapping[str, Any], if_match: str | None) -> str:
        """The given properties into the entity, with `replace`'s conditions."""
        return await self._write("PATCH", self._keyed(entity), entity, if_match, _JSON)

    async def delete(self, partition_key: str, row_key: str, if_match: str = "*") -> None:
        """Quiet when the entity is already gone, as the SDK's `delete_entity` is; a
        changed one is ResourceModifiedError (412)."""
        path = self._path(partition_key, row_key)
        try:
            await self._send("DELETE", path, None, {"If-Match": if_match}, _MINIMAL_METADATA)
        except ResourceNotFoundError:
            return

    async def read(
        self, partition_key: str, row_key: str, select: list[str] | None = None
    ) -> TableEntity:
        """The entity, typed as the SDK types it, its ETag in `metadata`; a missing one
        is ResourceNotFoundError (404)."""
        path = self._path(partition_key, row_key)
        query = f"$select={','.join(select)}" if select else ""
        _, _, body = await self._send("GET", path, None, {}, _MINIMAL_METADATA, query)
        entity: TableEntity = _convert_to_entity(json.loads(body))  # type: ignore[no-untyped-call]
        return entity

    def _entity_set(self) -> str:
        return f"/{quote(self._table, safe='')}"

    def _keyed(self, entity: Mapping[str, Any]) -> str:
        return self._path(entity["PartitionKey"], entity["RowKey"])

    def _path(self, partition_key: str, row_key: str) -> str:
        """As the SDK's URL serializer writes it: quotes doubled, then every character
        but the unreserved ones percent-encoded (a lone surrogate raises, as there)."""
        pk = quote(_prepare_key(partition_key), safe="")
        rk = quote(_prepare_key(row_key), safe="")
        return f"{self._entity_set()}(PartitionKey='{pk}',RowKey='{rk}')"

    async def _write(
        self,
        method: str,
        path: str,
        entity: Mapping[str, Any],
        if_match: str | None,
        content_type: str,
    ) -> str:
        body = json.dumps(_add_entity_properties(entity)).encode()
        headers = {"Content-Type": content_type}
        if if_match is not None:
            headers["If-Match"] = if_match
        if method == "POST":
            headers["Prefer"] = "return-no-content"
        _, etag, _ = await self._send(
            method, path, body, headers, _MINIMAL_METADATA if method == "POST" else _JSON
        )
        return etag

    def _date(self) -> str:
        now = int(time.time())
        if self._dated[0] != now:
            self._dated = (now, format_date_time(now))
        return self._dated[1]

    def _open(self) -> aiohttp.ClientSession:
        if self._session is None:
            connector = (
                aiohttp.TCPConnector(keepalive_timeout=self._keepalive)
                if self._keepalive is not None
                else aiohttp.TCPConnector()
            )
            self._session = aiohttp.ClientSession(
                connector=connector,
                timeout=aiohttp.ClientTimeout(
                    total=None,
                    sock_connect=table_client.CONNECTION_TIMEOUT,
                    sock_read=table_client.READ_TIMEOUT,
                ),
                trust_env=False,
                cookie_jar=aiohttp.DummyCookieJar(),
                trace_configs=self._trace_configs,
            )
        return self._session

    async def _send(
        self,
        method: str,
        path: str,
        body: bytes | None,
        headers: dict[str, str],
        accept: str,
        query: str = "",
    ) -> tuple[int, str, bytes]:
        """(status, ETag, body) of a 2xx answer; anything else raises the SDK's error.
        A failed call (no answer, or a 5xx) counts once, after its retry."""
        try:
            answer = await self._with_retry(method, path, body, headers, accept, query)
        except (Exception, asyncio.CancelledError):
            self._count.failures += 1
            raise
        status, answered, content = answer
        if status >= 300:
            if status >= 500:
                self._count.failures += 1
            raise _error(status, answered, content)
        return status, answered.get("ETag", ""), content

    async def _with_retry(
        self,
        method: str,
        path: str,
        body: bytes | None,
        headers: dict[str, str],
        accept: str,
        query: str,
    ) -> tuple[int, Mapping[str, str], bytes]:
        """One retry, of what azure-core's retry policy retries with `retry_total=1`: a
        request that got no answer (refused, reset, "Server disconnected", timed out)
        when its method is GET, PUT or DELETE, which the service may see twice without
        harm (a replace at an ETag that landed meets 412, an upsert writes the same
        entity, a delete of a gone entity is quiet); a 408, 429, 502 or 5xx answer to
        those, and a 500, 503 or 504 to any method, since the service did not apply
        it; any refusal with a Retry-After header, after that many seconds. An insert
        (POST) or a merge (PATCH) that got no answer is not sent again: a landed insert
        would meet 409 and read as the order existing. The retry goes at once, as
        azure-core's first retry does."""
        queries = "&".join(q for q in (query, self._query) if q)
        url = URL(f"{self._base}{path}?{queries}" if queries else f"{self._base}{path}")
        for attempt in (0, 1):
            sent = {
                **headers,
                "x-ms-version": API_VERSION,
                "DataServiceVersion": "3.0",
                "Accept": accept,
                "x-ms-date": self._date(),
            }
            sent["Date"] = sent["x-ms-date"]
            await self._authorizer.authorize(
                sent, method, headers.get("Content-Type", ""), url.raw_path
            )
            try:
                async with self._open().request(
                    method, url, data=body, headers=sent, allow_redirects=False
                ) as response:
                    content = await response.read()
                    status, answered = response.status, response.headers
            except (aiohttp.ClientError, TimeoutError) as exc:
                if attempt or method not in _RETRIED_METHODS:
                    raise _no_answer(exc) from exc
                continue
            if attempt or not _retried(method, status, answered):
                return status, answered, content
            after = answered.get("Retry-After")
            if after:
                await asyncio.sleep(_seconds(after))
        raise AssertionError("unreachable")  # pragma: no cover


def _no_answer(
    exc: aiohttp.ClientError | TimeoutError,
) -> ServiceRequestError | ServiceResponseError:
    """The SDK's error for a request that got no answer, as azure-core's aiohttp
    transport names it: cut off or malformed on the way back, a connect that timed
    out, a read that timed out, anything else on the way there."""
    kind: type[ServiceRequestError] | type[ServiceResponseError]
    if isinstance(exc, (aiohttp.ClientResponseError, aiohttp.ClientPayloadError)):
        kind = ServiceResponseError
    elif isinstance(exc, aiohttp.ConnectionTimeoutError):
        kind = ServiceRequestTimeoutError
    elif isinstance(exc, TimeoutError):
        kind = ServiceResponseTimeoutError
    else:
        kind = ServiceRequestError
    return kind(str(exc), error=exc)


def _retried(method: str, status: int, headers: Mapping[str, str]) -> bool:
    if status < 400:
        return False
    if headers.get("Retry-After"):
        return True
    if method in ("POST", "PATCH") and status in _RETRIED_ANY_METHOD:
        return True
    return method in _RETRIED_METHODS and status in _RETRIED_STATUSES


def _seconds(retry_after: str) -> float:
    try:
        return max(0.0, float(retry_after))
    except ValueError:
        return 0.0


def _error(status: int, headers: Mapping[str, str], content: bytes) -> HttpResponseError:
    """The SDK's error for a refusal: its type from the service's error code as the
    SDK's `_decode_error` picks it (by status when there is none), its message the
    service's with `ErrorCode:` appended."""
    code = headers.get("x-ms-error-code")
    message = ""
    try:
        found = json.loads(content)["odata.error"]
        code = found.get("code", code)
        message = found.get("message", {}).get("value", "")
    except (ValueError, KeyError, TypeError, AttributeError):
        message = content.decode("utf-8", "replace")
    kind: type[HttpResponseError]
    if code in _CHANGED_CODES:
        kind = ResourceModifiedError
    elif code in _EXISTS_CODES:
        kind = ResourceExistsError
    elif code in _MISSING_CODES:
        kind = ResourceNotFoundError
    else:
        kind = _STATUS_ERRORS.get(status, HttpResponseError)
    error = kind(message=f"{message}\nErrorCode:{code}")
    error.status_code = status
    error.reason = None
    error.error_code = code  # type: ignore[attr-defined]
    return error
