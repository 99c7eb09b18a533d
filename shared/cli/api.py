"""A small client of the operator HTTP API (docs/contract.md#2-http-api) on aiohttp.

Every HTTP or network failure becomes a CliError here, so the commands only deal with
answers; the key travels in a session header and never appears in a message.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import aiohttp

from shared.cli.config import API_KEY_ENV, TOKEN_ENV, ApiConfig
from shared.cli.errors import CliError, Conflict, NotFound, Refused, Unreachable
from shared.contract import Route
from shared.domain import event_signature
from shared.domain.principal import PRINCIPAL_HEADER, encode_client_principal

KEY_HEADER = "x-functions-key"
OPERATOR_HEADER = "x-operator"
_UNAVAILABLE = {502, 503, 504}

View = dict[str, Any]


@dataclass(frozen=True)
class Page:
    items: list[View]
    continuation: str | None


class OperatorApi:
    def __init__(self, config: ApiConfig, session: aiohttp.ClientSession) -> None:
        self.config = config
        self._session = session

    @classmethod
    @asynccontextmanager
    async def open(cls, config: ApiConfig) -> AsyncIterator[OperatorApi]:
        headers = {KEY_HEADER: config.key} if config.key else {}
        if config.token:
            headers["Authorization"] = f"Bearer {config.token}"
        if config.principal:
            headers[PRINCIPAL_HEADER] = encode_client_principal(config.principal, config.roles)
        timeout = aiohttp.ClientTimeout(total=config.timeout)
        async with aiohttp.ClientSession(headers=headers, timeout=timeout) as session:
            yield cls(config, session)

    async def page(
        self, state: str | None, page_size: int, continuation: str | None = None
    ) -> Page:
        params = {"pageSize": str(page_size)}
        if state:
            params["state"] = state
        if continuation:
            params["continuation"] = continuation
        body = await self._call("GET", Route.ORDERS, params=params)
        items = body.get("items") if isinstance(body, dict) else None
        if not isinstance(items, list):
            raise CliError(f"unexpected answer from {self.config.api}/{Route.ORDERS}: no items")
        token = body.get("continuation")
        return Page(items, token if isinstance(token, str) and token else None)

    async def pages(
        self, state: str | None, page_size: int, continuation: str | None = None
    ) -> AsyncIterator[Page]:
        """Follow continuation tokens to the end; a token seen twice ends the walk."""
        seen: set[str] = set()
        while True:
            page = await self.page(state, page_size, continuation)
            yield page
            continuation = page.continuation
            if continuation is None or continuation in seen:
                return
            seen.add(continuation)

    async def order(self, order_id: str) -> View:
        # GET ORDER is the submitting application's (a function key); a signed-in
        # operator reads the same answer from the operator route (docs/sign-in.md).
        signed_in = self.config.token or self.config.principal
        route = Route.OPS_ORDER if signed_in else Route.ORDER
        body = await self._call("GET", _order_route(route, order_id), order_id=order_id)
        return _object(body, order_id)

    async def resubmit(self, order_id: str) -> View:
        return await self._act(Route.RESUBMIT, order_id)

    async def cancel(self, order_id: str, reason: str | None = None) -> View:
        return await self._act(Route.CANCEL, order_id, {"reason": reason} if reason else None)

    async def suspend(self, order_id: str) -> View:
        return await self._act(Route.SUSPEND, order_id)

    async def resume(self, order_id: str) -> View:
        return await self._act(Route.RESUME, order_id)

    async def send_event(
        self, order_id: str, name: str, body: Mapping[str, Any], secret: str | None = None
    ) -> View:
        """An event for the order's waiting step; signed with `secret` when given, for
        this order and event, now (docs/events.md#signing)."""
        raw = json.dumps(dict(body), separators=(",", ":")).encode()
        headers = {OPERATOR_HEADER: self.config.operator}
        if secret:
            headers[event_signature.SIGNATURE_HEADER] = event_signature.header(
                secret, int(time.time()), order_id, name, raw
            )
        route = _order_route(Route.ORDER_EVENT, order_id).replace(
            "{eventName}", quote(name, safe="")
        )
        answer = await self._call(
            "POST",
            route,
            headers=headers,
            raw=raw,
            order_id=order_id,
            missing=f"order {order_id!r}",
        )
        return _object(answer, order_id)

    async def answer_approval(
        self,
        order_id: str,
        approved: bool,
        event_id: str,
        comment: str | None = None,
        event: str | None = None,
    ) -> View:
        """Approve or reject as the operator (the operator route: the admin key, no
        signing secret); `event`: the approval to answer, else the one the order is at."""
        body: dict[str, Any] = {"eventId": event_id, "approved": approved}
        if comment:
            body["comment"] = comment
        if event:
            body["event"] = event
        answer = await self._call(
            "POST",
            _order_route(Route.ORDER_APPROVAL, order_id),
            headers={OPERATOR_HEADER: self.config.operator},
            body=body,
            order_id=order_id,
            missing=f"order {order_id!r}",
        )
        return _object(answer, order_id)

    async def agents(self) -> list[View]:
        body = await self._call("GET", Route.AGENTS)
        agents = body.get("agents") if isinstance(body, dict) else None
        if not isinstance(agents, list):
            raise CliError(f"unexpected answer from {self.config.api}/{Route.AGENTS}: no agents")
        return agents

    async def drain(self, agent: str, drained: bool, reason: str | None = None) -> View:
        """Drain or undrain one agent, recorded under the operator's name."""
        route = Route.AGENT_DRAIN.replace("{agent}", quote(agent, safe=""))
        answer = await self._call(
            "PUT",
            route,
            headers={OPERATOR_HEADER: self.config.operator},
            body={"drained": drained, **({"reason": reason} if reason else {})},
            missing=f"agent {agent!r}",
        )
        if not isinstance(answer, dict):
            raise CliError(f"unexpected answer for agent {agent!r}: not a JSON object")
        return answer

    async def failures(self) -> View:
        body = await self._call("GET", Route.FAILURES)
        if not isinstance(body, dict) or not isinstance(body.get("groups"), list):
            raise CliError(f"unexpected answer from {self.config.api}/{Route.FAILURES}: no groups")
        return body

    async def bulk(self, body: Mapping[str, Any]) -> View:
        """A bulk action or its dry run, recorded under the operator's name."""
        answer = await self._call(
            "POST", Route.BULK, headers={OPERATOR_HEADER: self.config.operator}, body=dict(body)
        )
        if not isinstance(answer, dict):
            raise CliError(f"unexpected answer from {self.config.api}/{Route.BULK}")
        return answer

    async def archived_on(self, day: str, continuation: str | None = None) -> View:
        """One call's worth of a day's archived orders, and where the next goes on."""
        route = Route.ARCHIVE_DAY.replace("{day}", quote(day, safe=""))
        params = {"continuation": continuation} if continuation else None
        answer = await self._call("GET", route, params=params)
        if not isinstance(answer, dict) or not isinstance(answer.get("items"), list):
            raise CliError(f"unexpected answer from {self.config.api}/{route}: no items")
        return answer

    async def bulk_job(self, bulk_id: str) -> View:
        route = Route.BULK_JOB.replace("{bulkId}", quote(bulk_id, safe=""))
        answer = await self._call("GET", route, missing=f"bulk job {bulk_id!r}")
        if not isinstance(answer, dict):
            raise CliError(f"unexpected answer for bulk job {bulk_id!r}: not a JSON object")
        return answer

    async def _act(self, route: str, order_id: str, body: Any = None) -> View:
        """An operator's POST on one order, recorded under the operator's name."""
        answer = await self._call(
            "POST",
            _order_route(route, order_id),
            order_id=order_id,
            headers={OPERATOR_HEADER: self.config.operator},
            body=body,
        )
        return _object(answer, order_id)

    async def _call(
        self,
        method: str,
        route: str,
        *,
        params: Mapping[str, str] | None = None,
        headers: Mapping[str, str] | None = None,
        order_id: str | None = None,
        body: Any = None,
        missing: str | None = None,
        raw: bytes | None = None,
    ) -> Any:
        """`raw`: a JSON body sent byte for byte (a signed one), instead of `body`."""
        url = f"{self.config.api}/{route}"
        sending: dict[str, Any] = {"json": body}
        if raw is not None:
            sending = {"data": raw}
            headers = {**(headers or {}), "content-type": "application/json"}
        try:
            async with self._session.request(
                method, url, params=params, headers=headers, **sending
            ) as response:
                text = await response.text()
                status = response.status
                kind = response.content_type
        except TimeoutError:
            raise Unreachable(
                f"the API at {self.config.url} did not answer within {self.config.timeout:g}s"
            ) from None
        except aiohttp.ClientConnectorError as exc:
            raise Unreachable(
                f"cannot reach the API at {self.config.url}: {exc.os_error.strerror or exc}"
            ) from None
        except aiohttp.ClientError as exc:
            raise Unreachable(
                f"the API at {self.config.url} failed: {type(exc).__name__}"
            ) from None
        body = _json(text, kind)
        if status < 400:
            return body
        if status == 404 and missing is not None:
            detail = _detail(body)
            raise NotFound(f"{missing} not found" + (f" ({detail})" if detail else ""))
        raise self._error(status, body, order_id)

    def _refusal(self, detail: str) -> str:
        """A signed-in principal's 401 or 403 names what is missing: the server's words;
        a key's or no credential's: what to pass."""
        config = self.config
        if config.token or config.principal:
            return detail or "refused"
        if config.key:
            return "the key was refused (use the admin key)"
        return (
            f"a key is required: pass --key or set {API_KEY_ENV}; or sign in with --token "
            f"(or {TOKEN_ENV}), or locally with --principal"
        )

    def _error(self, status: int, body: Any, order_id: str | None) -> CliError:
        detail = _detail(body)
        if status in {401, 403}:
            return Refused(f"HTTP {status} from {self.config.url}: {self._refusal(detail)}")
        if status == 404 and order_id is not None:
            return NotFound(f"order {order_id!r} not found" + (f" ({detail})" if detail else ""))
        if status == 409:
            return Conflict(detail or "conflict")
        if status in _UNAVAILABLE:
            return Unreachable(
                f"the API at {self.config.url} is unavailable (HTTP {status})"
                + (f": {detail}" if detail else "")
            )
        title = body.get("title") if isinstance(body, dict) else None
        return CliError(
            f"HTTP {status}"
            + (f" {title}" if title else "")
            + (f": {detail}" if detail else f" from {self.config.url}")
        )


def _order_route(route: str, order_id: str) -> str:
    return route.replace("{orderId}", quote(order_id, safe=""))


def _json(text: str, content_type: str) -> Any:
    if "json" not in content_type:
        return None
    try:
        return json.loads(text)
    except ValueError:
        return None


def _detail(body: Any) -> str:
    if isinstance(body, dict):
        detail = body.get("detail")
        if isinstance(detail, str):
            return detail
    return ""


def _object(body: Any, order_id: str) -> View:
    if not isinstance(body, dict):
        raise CliError(f"unexpected answer for order {order_id!r}: not a JSON object")
    return body
