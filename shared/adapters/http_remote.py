"""A remote service reached over HTTP (aiohttp): the one thing each Agent wraps."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from typing import Any
from urllib.parse import quote

import aiohttp

from shared.domain.in_doubt import IN_PROGRESS, NEVER_SEEN, NOT_APPLIED, RemoteOutcome
from shared.domain.model import JsonObject
from shared.ports import PermanentRemoteError, RemoteCall, TransientRemoteError
from shared.telemetry.propagation import carrier as trace_headers

_TRANSIENT_STATUSES = {408, 429}


@contextlib.contextmanager
def translated_errors(what: str) -> Iterator[None]:
    """Where the network's failures become the port's: a service that cannot be reached
    is a transient failure, worth a retry. aiohttp's exception is not chained (`from
    None`): its repr is in the message."""
    try:
        yield
    except (TimeoutError, aiohttp.ClientError, OSError) as exc:
        raise TransientRemoteError("unreachable", f"{what}: {exc!r}") from None


class HttpRemoteService:
    """Classifies answers the way the Agents' retry needs: 408/429/5xx and network
    failures are transient, any other 4xx is permanent."""

    def __init__(self, base_url: str, session: aiohttp.ClientSession) -> None:
        self._base_url = base_url.rstrip("/")
        self._session = session

    @property
    def base_url(self) -> str:
        return self._base_url

    async def invoke(self, call: RemoteCall, timeout: float) -> JsonObject:
        url = f"{self._base_url}/{call.operation}"
        body = {
            "orderId": call.order_id,
            "idempotencyKey": call.idempotency_key,
            "payload": dict(call.payload),
        }
        with translated_errors(call.operation):
            async with self._session.post(
                url,
                json=body,
                headers={"Idempotency-Key": call.idempotency_key, **trace_headers()},
                timeout=aiohttp.ClientTimeout(total=max(timeout, 0.001)),
            ) as response:
                text = await response.text()
                status = response.status
        data = _json(text)
        if status < 300:
            result = data.get("result", data)
            return result if isinstance(result, dict) else {"value": result}
        code = str(data.get("code") or data.get("title") or f"http-{status}")
        message = str(data.get("detail") or text[:200])
        if status in _TRANSIENT_STATUSES or status >= 500:
            raise TransientRemoteError(code, message)
        raise PermanentRemoteError(code, message)

    async def outcome(self, key: str, timeout: float) -> RemoteOutcome:
        """`GET {ServiceUrl}/operations/{key}`, the key percent-encoded whole (a key holds
        `:` and may hold `/`). 408/429/5xx and network failures raise for a retry."""
        url = f"{self._base_url}/operations/{quote(key, safe='')}"
        with translated_errors("outcome query"):
            async with self._session.get(
                url,
                headers=trace_headers(),
                timeout=aiohttp.ClientTimeout(total=max(timeout, 0.001)),
            ) as response:
                status, data = await _read(response)
        if status in _TRANSIENT_STATUSES or status >= 500:
            code = str(data.get("code") or f"http-{status}")
            raise TransientRemoteError(code, "outcome query")
        return _outcome(status, data)

    async def probe(self, timeout: float) -> None:
        with translated_errors("health probe"):
            async with self._session.get(
                f"{self._base_url}/health", timeout=aiohttp.ClientTimeout(total=timeout)
            ) as response:
                status = response.status
                await response.read()
        if status >= 300:
            raise TransientRemoteError(f"http-{status}", "health probe failed")


async def _read(response: aiohttp.ClientResponse) -> tuple[int, dict[str, Any]]:
    return response.status, _json(await response.text())


def _outcome(status: int, data: dict[str, Any]) -> RemoteOutcome:
    """Only the contract's exact answers count; anything else is no answer. A 404 counts
    as never seen only with the contract's code: a service without the read API also
    says 404, and reading that as "never seen" would send a retry elsewhere to apply the
    key twice."""
    if status == 200 and data.get("applied") is True:
        result = data.get("result")
        return RemoteOutcome.applied(result if isinstance(result, dict) else {})
    if status == 200 and data.get("applied") is False:
        return NOT_APPLIED
    if status == 404 and data.get("code") == "operation-not-found":
        return NEVER_SEEN
    if status == 409:
        return IN_PROGRESS
    return RemoteOutcome.unknown(f"http-{status} {data.get('code') or ''}".strip())


def _json(text: str) -> dict[str, Any]:
    try:
        value = json.loads(text) if text else {}
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}
