"""A remote service reached over HTTP (aiohttp): the one thing each Agent wraps."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from typing import Any

import aiohttp

from shared.domain.model import JsonObject
from shared.ports import PermanentRemoteError, RemoteCall, TransientRemoteError

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
                headers={"Idempotency-Key": call.idempotency_key},
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

    async def probe(self, timeout: float) -> None:
        with translated_errors("health probe"):
            async with self._session.get(
                f"{self._base_url}/health", timeout=aiohttp.ClientTimeout(total=timeout)
            ) as response:
                status = response.status
                await response.read()
        if status >= 300:
            raise TransientRemoteError(f"http-{status}", "health probe failed")


def _json(text: str) -> dict[str, Any]:
    try:
        value = json.loads(text) if text else {}
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}
