"""A remote service reached over HTTP (aiohttp): the one thing each Agent wraps.

A provider's answer is read for what it says about the key, not only its status: a
`409 operation-in-progress` is an earlier call with the same key still running (Stripe
answers so a retry that comes while the first charge is being processed). Read as a
failure, it would undo an order whose charge then applies: it is a transient answer,
retried with the same key.

`abandon` settles a key, so the order can undo the step or move it to another provider
without waiting until no request sent with the key can apply. Not every provider has
it: a 404 without the contract's codes reads as "not supported" (the caller waits
instead), never as abandoned.

A `429` is the provider's quota, not its failure: it raises `RateLimited`, which slows
the agent (usecases.throttle) and counts against neither the breaker nor the order.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator, Mapping
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from typing import Any
from urllib.parse import quote

import aiohttp

from shared import jsonbounds
from shared.domain.in_doubt import (
    ABANDONED,
    IN_PROGRESS,
    NEVER_SEEN,
    NOT_APPLIED,
    NOT_SUPPORTED,
    RemoteOutcome,
)
from shared.domain.model import JsonObject
from shared.ports import (
    ABANDONED_CODE,
    IN_PROGRESS_CODE,
    OperationInProgress,
    PermanentRemoteError,
    RateLimited,
    RemoteCall,
    TransientRemoteError,
)
from shared.telemetry.propagation import carrier as trace_headers

_TRANSIENT_STATUSES = {408, 429}
_NOT_FOUND_CODE = "operation-not-found"
_CONTRACT_CODES = {_NOT_FOUND_CODE, IN_PROGRESS_CODE, ABANDONED_CODE}


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
    """Classifies answers the way the Agents' retry needs: 408/429/5xx, `409
    operation-in-progress` and network failures are transient (with the service's
    `Retry-After`; a 429 as `RateLimited`), any other 4xx is permanent, `409
    operation-abandoned` included."""

    def __init__(self, base_url: str, session: aiohttp.ClientSession) -> None:
        self._base_url = base_url.rstrip("/")
        self._session = session

    @property
    def base_url(self) -> str:
        return self._base_url

    async def invoke(self, call: RemoteCall, timeout: float) -> JsonObject:
        url = f"{self._base_url}/{call.operation}"
        body: dict[str, Any] = {
            "orderId": call.order_id,
            "idempotencyKey": call.idempotency_key,
            "payload": dict(call.payload),
        }
        if call.undoes is not None:
            body["undoes"] = call.undoes
        with translated_errors(call.operation):
            async with self._session.post(
                url,
                # As the rule for text and numbers has it: a result stored before the
                # rule, carried by an undo's payload, may hold NaN (issue 41).
                data=jsonbounds.dumps(body),
                headers={
                    "Content-Type": "application/json",
                    "Idempotency-Key": call.idempotency_key,
                    **trace_headers(),
                },
                timeout=aiohttp.ClientTimeout(total=max(timeout, 0.001)),
            ) as response:
                text = await response.text(errors="replace")
                status = response.status
                retry_after = _retry_after(response.headers)
        data = _json(text)
        if status < 300:
            result = data.get("result", data)
            return result if isinstance(result, dict) else {"value": result}
        code = str(data.get("code") or data.get("title") or f"http-{status}")
        message = str(data.get("detail") or text[:200])
        if status == 409 and code == IN_PROGRESS_CODE:
            raise OperationInProgress(message, retry_after=retry_after)
        if status == 429:
            raise RateLimited(code, message, retry_after=retry_after)
        if _transient(status):
            raise TransientRemoteError(code, message, retry_after=retry_after)
        raise PermanentRemoteError(code, message)

    async def outcome(self, key: str, timeout: float) -> RemoteOutcome:
        """`GET {ServiceUrl}/operations/{key}`, the key percent-encoded whole (a key holds
        `:` and may hold `/`). 408/429/5xx and network failures raise for a retry."""
        status, data = await self._ask("outcome query", "GET", key, "", timeout)
        return _outcome(status, data)

    async def abandon(self, key: str, timeout: float) -> RemoteOutcome:
        """`POST {ServiceUrl}/operations/{key}/abandon`: settle the key for good, so "not
        applied" is final now rather than once every request sent with it has expired.
        A plain 404 is a provider without the route (NOT_SUPPORTED): the caller falls
        back to waiting. 408/429/5xx and network failures raise for a retry."""
        status, data = await self._ask("abandon", "POST", key, "/abandon", timeout)
        if status == 404 and data.get("code") not in _CONTRACT_CODES:
            return NOT_SUPPORTED
        if status == 200 and data.get("applied") is False and data.get("abandoned") is True:
            return ABANDONED
        if status == 200 and data.get("applied") is True:
            return _outcome(status, data)
        if status == 409 and data.get("code") == IN_PROGRESS_CODE:
            return IN_PROGRESS
        return _no_answer(status, data)

    async def _ask(
        self, what: str, method: str, key: str, suffix: str, timeout: float
    ) -> tuple[int, dict[str, Any]]:
        """One question about `key`; a transient answer raises (with its Retry-After)."""
        url = f"{self._base_url}/operations/{quote(key, safe='')}{suffix}"
        with translated_errors(what):
            async with self._session.request(
                method,
                url,
                headers=trace_headers(),
                timeout=aiohttp.ClientTimeout(total=max(timeout, 0.001)),
            ) as response:
                status, data = response.status, _json(await response.text(errors="replace"))
                retry_after = _retry_after(response.headers)
        if _transient(status):
            code = str(data.get("code") or f"http-{status}")
            limited = RateLimited if status == 429 else TransientRemoteError
            raise limited(code, what, retry_after=retry_after)
        return status, data

    async def probe(self, timeout: float) -> None:
        with translated_errors("health probe"):
            async with self._session.get(
                f"{self._base_url}/health", timeout=aiohttp.ClientTimeout(total=timeout)
            ) as response:
                status = response.status
                await response.read()
        if status >= 300:
            raise TransientRemoteError(f"http-{status}", "health probe failed")


def _transient(status: int) -> bool:
    return status in _TRANSIENT_STATUSES or status >= 500


def _outcome(status: int, data: dict[str, Any]) -> RemoteOutcome:
    """Only the contract's exact answers count; anything else is no answer. A 404 counts
    as never seen only with the contract's code: a service without the read API also
    says 404, and reading that as "never seen" would send a retry elsewhere to apply the
    key twice."""
    if status == 200 and data.get("applied") is True:
        result = data.get("result")
        return RemoteOutcome.applied(result if isinstance(result, dict) else {})
    if status == 200 and data.get("applied") is False:
        return ABANDONED if data.get("abandoned") is True else NOT_APPLIED
    if status == 404 and data.get("code") == _NOT_FOUND_CODE:
        return NEVER_SEEN
    if status == 409:
        return IN_PROGRESS
    return _no_answer(status, data)


def _no_answer(status: int, data: dict[str, Any]) -> RemoteOutcome:
    return RemoteOutcome.unknown(f"http-{status} {data.get('code') or ''}".strip())


def _retry_after(headers: Mapping[str, str]) -> float | None:
    """`Retry-After` in seconds from now (delta-seconds or an HTTP date); None when
    absent or unreadable, so a malformed hint changes nothing."""
    value = headers.get("Retry-After", "").strip()
    if not value:
        return None
    try:
        seconds = float(value)
    except ValueError:
        try:
            at = parsedate_to_datetime(value)
        except (TypeError, ValueError, IndexError):
            return None
        at = at if at.tzinfo else at.replace(tzinfo=UTC)
        seconds = (at - datetime.now(UTC)).total_seconds()
    return max(seconds, 0.0) if math.isfinite(seconds) else None


def _json(text: str) -> dict[str, Any]:
    """A provider's answer, kept as the rule for text and numbers allows (issue 41): a
    result with `NaN` or a lone surrogate, carried on in the agent's reply, would have
    the Scheduler dead-letter that reply and leave the step to time out. Bytes that are
    not UTF-8 are U+FFFD already (`text(errors="replace")`); they raised before."""
    try:
        value = jsonbounds.loads_answer(text) if text else {}
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}
