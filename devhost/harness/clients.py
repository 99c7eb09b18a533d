"""Typed clients for the app's HTTP API and the simulator's and broker's control APIs.

Every starter and every check talks to the system through these, so a route lives in
`shared.contract` (the app) or here (the emulators' control APIs) and nowhere else.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable, Mapping
from typing import Any
from urllib.parse import quote

import aiohttp

from devhost.harness.process import Child, StartError
from shared.contract import Route
from shared.domain.model import ProcessState

TERMINAL = frozenset(s.value for s in ProcessState if s.is_at_rest)
CONTROL_TIMEOUT = aiohttp.ClientTimeout(total=60)
PROBE_TIMEOUT = aiohttp.ClientTimeout(total=5)
POLL_SECONDS = 0.2


class ControlError(RuntimeError):
    """An API answered other than the call expects; the message has status and body."""


async def _body(response: aiohttp.ClientResponse) -> Any:
    text = await response.text()
    if not text:
        return {}
    try:
        return await response.json(content_type=None)
    except ValueError:
        return {"text": text}


async def _call(
    session: aiohttp.ClientSession,
    method: str,
    url: str,
    *,
    json: Any = None,
    params: Mapping[str, str] | None = None,
) -> Any:
    """One control call that must succeed (2xx); its JSON body, {} when empty."""
    async with session.request(
        method, url, json=json, params=params, timeout=CONTROL_TIMEOUT
    ) as response:
        body = await _body(response)
        if response.status >= 300:
            raise ControlError(f"{method} {url} answered {response.status}: {body}")
        return body


class AppClient:
    """The app's public HTTP API below /api (routes from `shared.contract.Route`)."""

    def __init__(self, session: aiohttp.ClientSession, api_url: str) -> None:
        self.session = session
        self.api_url = api_url.rstrip("/")

    def url(self, route: str, order_id: str | None = None) -> str:
        path = route if order_id is None else route.format(orderId=quote(order_id, safe=""))
        return f"{self.api_url}/{path}"

    async def _ask(self, method: str, url: str, **kwargs: Any) -> tuple[int, dict[str, Any]]:
        async with self.session.request(method, url, **kwargs) as response:
            return response.status, await _body(response)

    async def submit(
        self, body: Mapping[str, Any], *, timeout: float | None = None
    ) -> tuple[int, dict[str, Any]]:
        """POST an order as given (status and answer; no judgement of the status)."""
        limit = None if timeout is None else aiohttp.ClientTimeout(total=timeout)
        return await self._ask("POST", self.url(Route.ORDERS), json=dict(body), timeout=limit)

    async def submit_order(
        self,
        order_id: str,
        skus: Iterable[str] = ("SKU-1",),
        *,
        priority: str | None = None,
        customer_id: str = "c-1",
        unit_price: float = 5.0,
        workflow: str | None = None,
    ) -> dict[str, Any]:
        """Submit an order of one unit per SKU; anything but 202 is a ControlError."""
        body: dict[str, Any] = {
            "orderId": order_id,
            "customerId": customer_id,
            "items": [{"sku": s, "quantity": 1, "unitPrice": unit_price} for s in skus],
        }
        if priority is not None:
            body["priority"] = priority
        if workflow is not None:
            body["workflow"] = workflow
        status, answer = await self.submit(body)
        if status != 202:
            raise ControlError(f"submit {order_id} answered {status}: {answer}")
        return answer

    async def order(self, order_id: str) -> dict[str, Any]:
        status, view = await self._ask("GET", self.url(Route.ORDER, order_id))
        if status != 200:
            raise ControlError(f"GET order {order_id} answered {status}: {view}")
        return view

    async def orders(
        self, state: str | None = None, page_size: int | None = None
    ) -> dict[str, Any]:
        params = {"state": state, "pageSize": None if page_size is None else str(page_size)}
        url = self.url(Route.ORDERS)
        return dict(
            await _call(self.session, "GET", url, params={k: v for k, v in params.items() if v})
        )

    async def resubmit(
        self, order_id: str, headers: Mapping[str, str] | None = None
    ) -> tuple[int, dict[str, Any]]:
        """`headers`: who acts, e.g. a principal (docs/sign-in.md)."""
        return await self._ask(
            "POST", self.url(Route.RESUBMIT, order_id), headers=dict(headers or {})
        )

    async def cancel(self, order_id: str, reason: str | None = None) -> tuple[int, dict[str, Any]]:
        body = {} if reason is None else {"reason": reason}
        return await self._ask("POST", self.url(Route.CANCEL, order_id), json=body)

    async def suspend(self, order_id: str) -> tuple[int, dict[str, Any]]:
        return await self._ask("POST", self.url(Route.SUSPEND, order_id))

    async def resume(self, order_id: str) -> tuple[int, dict[str, Any]]:
        return await self._ask("POST", self.url(Route.RESUME, order_id))

    async def view(
        self, order_id: str, *, timeout: float | None = None
    ) -> tuple[int, dict[str, Any]]:
        """GET the order's view (status and answer; no judgement of the status)."""
        limit = None if timeout is None else aiohttp.ClientTimeout(total=timeout)
        return await self._ask("GET", self.url(Route.ORDER, order_id), timeout=limit)

    async def send_event(
        self,
        order_id: str,
        name: str,
        event_id: str,
        data: Mapping[str, Any] | None = None,
        *,
        timeout: float | None = None,
    ) -> tuple[int, dict[str, Any]]:
        """POST an event to the order (status and answer; no judgement of the status)."""
        path = Route.ORDER_EVENT.format(
            orderId=quote(order_id, safe=""), eventName=quote(name, safe="")
        )
        url = f"{self.api_url}/{path}"
        body: dict[str, Any] = {"eventId": event_id}
        if data is not None:
            body["data"] = dict(data)
        limit = None if timeout is None else aiohttp.ClientTimeout(total=timeout)
        return await self._ask("POST", url, json=body, timeout=limit)

    async def health(self) -> tuple[int, dict[str, Any]]:
        return await self._ask("GET", self.url(Route.HEALTH), timeout=PROBE_TIMEOUT)

    async def wait_healthy(self, timeout: float = 60.0, child: Child | None = None) -> float:
        """Wait for a 200 from /api/health; the seconds it took. A `child` that exits
        meanwhile ends the wait at once with its log tail."""
        started = time.monotonic()
        while time.monotonic() - started < timeout:
            if child is not None:
                child.check()
            try:
                status, _ = await self.health()
            except (aiohttp.ClientError, TimeoutError, OSError):
                status = 0
            if status == 200:
                return time.monotonic() - started
            await asyncio.sleep(POLL_SECONDS)
        raise StartError(f"{self.api_url} not healthy within {timeout:.0f} s")

    async def wait_for(
        self,
        order_id: str,
        states: Iterable[str] = TERMINAL,
        timeout: float = 60.0,
        **fields: Any,
    ) -> dict[str, Any]:
        """Poll the order until its process state is one of `states` and every field in
        `fields` has the given value; its view, or TimeoutError with the last one."""
        wanted = frozenset(states)
        deadline = time.monotonic() + timeout
        view: dict[str, Any] = {}
        while time.monotonic() < deadline:
            view = await self.order(order_id)
            if view.get("processState") in wanted and all(
                view.get(k) == v for k, v in fields.items()
            ):
                return view
            await asyncio.sleep(POLL_SECONDS)
        raise TimeoutError(f"order {order_id} did not reach {sorted(wanted)} {fields}: {view}")


class SimulatorControl:
    """The simulator's `/_sim` API: faults per service, the effect ledger, counters."""

    def __init__(self, session: aiohttp.ClientSession, url: str) -> None:
        self.session = session
        self.url = url.rstrip("/")

    async def set_faults(self, service: str, **faults: Any) -> dict[str, Any]:
        """Replace the service's fault settings (knobs not given go back to off)."""
        url = f"{self.url}/_sim/faults/{service}"
        return dict(await _call(self.session, "PUT", url, json=faults))

    async def faults(self) -> dict[str, Any]:
        return dict(await _call(self.session, "GET", f"{self.url}/_sim/faults"))

    async def clear_faults(self) -> None:
        await _call(self.session, "DELETE", f"{self.url}/_sim/faults")

    async def effects(
        self, order_id: str | None = None, service: str | None = None
    ) -> list[dict[str, Any]]:
        params = {k: v for k, v in (("orderId", order_id), ("service", service)) if v}
        found = await _call(self.session, "GET", f"{self.url}/_sim/effects", params=params)
        return list(found)

    async def clear_effects(self) -> None:
        await _call(self.session, "DELETE", f"{self.url}/_sim/effects")

    async def forget_effect(self, service: str, key: str) -> None:
        """The service loses its record of one key (it answers "never seen" after)."""
        await _call(self.session, "DELETE", f"{self.url}/_sim/effects/{service}/{key}")

    async def stats(self) -> dict[str, Any]:
        return dict(await _call(self.session, "GET", f"{self.url}/_sim/stats"))

    async def clear_stats(self) -> None:
        await _call(self.session, "DELETE", f"{self.url}/_sim/stats")

    async def health(self) -> dict[str, Any]:
        return dict(await _call(self.session, "GET", f"{self.url}/_sim/health"))


class BrokerControl:
    """The local broker's `/_broker` API: delivery faults and per-queue counters."""

    def __init__(self, session: aiohttp.ClientSession, url: str) -> None:
        self.session = session
        self.url = url.rstrip("/")

    async def set_faults(self, faults: Mapping[str, Any]) -> dict[str, Any]:
        url = f"{self.url}/_broker/faults"
        return dict(await _call(self.session, "PUT", url, json=dict(faults)))

    async def faults(self) -> dict[str, Any]:
        return dict(await _call(self.session, "GET", f"{self.url}/_broker/faults"))

    async def clear_faults(self) -> None:
        await _call(self.session, "DELETE", f"{self.url}/_broker/faults")

    async def stats(self) -> dict[str, Any]:
        return dict(await _call(self.session, "GET", f"{self.url}/_broker/stats"))
