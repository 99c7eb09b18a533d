"""The HTTP front door: aiohttp in front of the app's ``httpTrigger`` functions.

Behaves like Core Tools rather than like production: function keys are checked only
with ``DevhostEnforceKeys=true`` (see ``guard``), and any exception escaping a function
becomes a short problem+json 500 so one broken handler never takes the runtime down.
Unlike Core Tools it answers only to loopback host names and refuses state-changing
requests from another origin: a web page open in the developer's browser must not be
able to drive it.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Mapping, Sequence
from typing import Any

import azure.functions as func
from aiohttp import web
from multidict import CIMultiDict
from opentelemetry.trace import SpanKind

from devhost import loopback
from devhost.host import guard
from devhost.host.invoke import invoke, new_invocation_id
from devhost.host.loader import HTTP_TRIGGER, FunctionSpec, HostConfig
from devhost.host.routing import Matched, MethodNotAllowed, Router
from devhost.host.tracing import header_carrier, invocation_span
from devhost.malformed import ProblemAppRunner, RateLimitedLog
from devhost.problem import problem
from shared.adapters import host_keys

log = logging.getLogger("devhost.http")

MAX_BODY_BYTES = 1024 * 1024
HOST_STATUS_PATH = host_keys.STATUS_PATH
# aiohttp computes these itself; copying the function's values would corrupt framing.
_HOP_BY_HOP = frozenset({"content-length", "transfer-encoding", "connection"})


class HttpStartError(Exception):
    """The listener could not be opened (usually: the port is taken)."""


def build_router(
    triggers: Sequence[tuple[FunctionSpec, Mapping[str, Any]]],
) -> Router[FunctionSpec]:
    """``triggers`` pairs each function with its %Setting%-resolved trigger binding."""
    router: Router[FunctionSpec] = Router()
    for spec, trigger in triggers:
        if trigger.get("type") != HTTP_TRIGGER:
            continue
        router.add(str(trigger.get("route") or spec.name), trigger.get("methods"), spec)
    return router


def _single_valued(pairs: Any) -> dict[str, str]:
    """Collapse repeated headers into one comma-joined value, as the host does."""
    merged: dict[str, str] = {}
    for key, value in pairs:
        merged[key] = f"{merged[key]}, {value}" if key in merged else value
    return merged


def to_aiohttp(result: Any) -> web.Response:
    """Map what the function returned onto an aiohttp response."""
    if result is None:
        return web.Response(status=204)
    if isinstance(result, str):
        return web.Response(text=result, content_type="text/plain")
    if not isinstance(result, func.HttpResponse):
        raise TypeError(f"HTTP function returned {type(result).__name__}, not HttpResponse")
    headers: CIMultiDict[str] = CIMultiDict()
    for name, value in result.headers.items():
        if name.lower() not in _HOP_BY_HOP:
            headers.add(name, value)
    if "Content-Type" not in headers:
        mimetype, charset = result.mimetype, result.charset
        headers["Content-Type"] = (
            f"{mimetype}; charset={charset}" if mimetype.startswith("text/") else mimetype
        )
    return web.Response(status=result.status_code, body=result.get_body(), headers=headers)


class HttpFrontend:
    """Serves ``/<routePrefix>/<route>`` for every HTTP-triggered function."""

    def __init__(
        self,
        triggers: Sequence[tuple[FunctionSpec, Mapping[str, Any]]],
        config: HostConfig,
        *,
        host: str = "127.0.0.1",
        port: int = 7071,
        max_body_bytes: int = MAX_BODY_BYTES,
        shutdown_timeout: float = 30.0,
        keys: guard.Keys | None = None,
        pass_principal: bool = False,
    ) -> None:
        self._router = build_router(triggers)
        self._levels = {
            spec.name: guard.AuthLevel.of(trigger.get("authLevel"))
            for spec, trigger in triggers
            if trigger.get("type") == HTTP_TRIGGER
        }
        self._keys = keys
        self._pass_principal = pass_principal
        self._also_hosts = loopback.bound_names(host)
        self._prefix = f"/{config.route_prefix}" if config.route_prefix else ""
        self._host = host
        self._port = port
        self._max_body = max_body_bytes
        self._shutdown_timeout = shutdown_timeout
        self._runner: web.AppRunner | None = None
        self._refusals = RateLimitedLog(log)
        self.url = ""

    async def start(self) -> None:
        app = web.Application(client_max_size=self._max_body)
        # Any path at all, a decoded %0A included: `.` alone stops at a newline, and what
        # no route takes gets aiohttp's text/plain 404 instead of the runtime's problem.
        app.router.add_route("*", "/{tail:(?s:.*)}", self._handle)
        runner = ProblemAppRunner(
            app,
            refusals=self._refusals,
            access_log=None,
            handle_signals=False,
            shutdown_timeout=self._shutdown_timeout,
        )
        await runner.setup()
        site = web.TCPSite(runner, self._host, self._port)
        try:
            await site.start()
        except OSError as exc:
            await runner.cleanup()
            raise HttpStartError(
                f"cannot listen on {self._host}:{self._port} ({exc.strerror}); "
                "is another host running? pass --port"
            ) from exc
        self._runner = runner
        address = runner.addresses[0]
        self.url = f"http://{address[0]}:{address[1]}"

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    def _relative(self, raw_path: str) -> str | None:
        if not self._prefix:
            return raw_path
        if raw_path == self._prefix or raw_path.startswith(self._prefix + "/"):
            return raw_path[len(self._prefix) :]
        return None

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        started = time.perf_counter()
        response, name = await self._dispatch(request)
        elapsed = (time.perf_counter() - started) * 1000
        log.info(
            "%s %s -> %d %s(%.0f ms)",
            request.method,
            request.rel_url.path,
            response.status,
            f"{name} " if name else "",
            elapsed,
        )
        return response

    def _refusal(self, request: web.Request) -> web.Response | None:
        """Host and Origin checks, before any routing."""
        return loopback.refused(request, self._also_hosts, "this runtime")

    def _unauthorized(self, request: web.Request, spec: FunctionSpec) -> web.Response | None:
        if self._keys is None:
            return None
        level = self._levels.get(spec.name, guard.AuthLevel.FUNCTION)
        presented = request.headers.get(guard.KEY_HEADER) or request.query.get(guard.KEY_QUERY)
        if self._keys.admits(level, presented):
            return None
        needed = "the master key" if level is guard.AuthLevel.ADMIN else "a function key"
        return problem(
            401,
            "Unauthorized",
            f"{needed} is required, as {guard.KEY_HEADER} header or ?{guard.KEY_QUERY}=",
        )

    def _host_status(self, request: web.Request) -> web.Response:
        """The one admin API route an app asks: `200` for the master key only, as the
        Functions host answers it, so the app can tell the master key (break-glass)
        when its operator routes are anonymous (shared/adapters/host_keys.py)."""
        presented = request.headers.get(guard.KEY_HEADER) or request.query.get(guard.KEY_QUERY)
        if self._keys is not None and self._keys.admits(guard.AuthLevel.ADMIN, presented):
            return web.json_response({"state": "Running"})
        return problem(401, "Unauthorized", "the admin API needs the master key")

    async def _dispatch(self, request: web.Request) -> tuple[web.StreamResponse, str | None]:
        refused = self._refusal(request) or _undecodable_header(request)
        if refused is not None:
            return refused, None
        if request.rel_url.path == HOST_STATUS_PATH:
            return self._host_status(request), None
        relative = self._relative(request.rel_url.raw_path)
        found = self._router.match(request.method, relative) if relative is not None else None
        if isinstance(found, MethodNotAllowed):
            response = problem(
                405, "Method Not Allowed", f"{request.method} is not allowed on this route"
            )
            if found.allowed:
                response.headers["Allow"] = ", ".join(found.allowed)
            return response, None
        if not isinstance(found, Matched):
            return problem(404, "Not Found", f"no function serves {request.rel_url.path}"), None
        spec = found.target
        unauthorized = self._unauthorized(request, spec)
        if unauthorized is not None:
            return unauthorized, spec.name
        try:
            body = await request.read()
        except web.HTTPRequestEntityTooLarge:
            return problem(
                413, "Payload Too Large", f"request bodies are limited to {self._max_body} bytes"
            ), spec.name
        headers = _single_valued(request.headers.items())
        if not guard.keeps_principal(self._pass_principal, request.remote):
            headers = guard.without_principal(headers)
        http_request = func.HttpRequest(
            request.method,
            str(request.url),
            headers=headers,
            params=_first_values(request.query.items()),
            route_params=found.params,
            body=body,
        )
        invocation_id = new_invocation_id()
        attributes = {"faas.trigger": "http", "faas.invocation_id": invocation_id}
        carrier = header_carrier(request.headers)
        try:
            with invocation_span(spec.name, SpanKind.SERVER, carrier, attributes) as trace:
                result = await invoke(spec, http_request, invocation_id, trace)
            return to_aiohttp(result), spec.name
        except Exception:
            log.exception("function %s failed (invocation %s)", spec.name, invocation_id)
            return problem(
                500,
                "Internal Server Error",
                f"function {spec.name} raised; the traceback is in the devhost log",
                invocationId=invocation_id,
            ), spec.name


def _undecodable_header(request: web.Request) -> web.Response | None:
    """aiohttp reads a header value as UTF-8 with surrogateescape, so bytes that are not
    UTF-8 (`\\xff`, or a surrogate's CESU-8 bytes) come out as lone surrogates. The
    Functions host never passes a function one (its headers travel as protobuf strings,
    UTF-8 by definition), and a function that stored one (`x-operator` goes into the
    order's history) would break the archive and every client after it (issue 41)."""
    for name, value in request.headers.items():
        if not value.isascii() and _SURROGATES.search(value):
            return problem(
                400, "Invalid header", f"the value of header {name[:64]!r} is not UTF-8 text"
            )
    return None


_SURROGATES = re.compile("[\ud800-\udfff]")


def _first_values(pairs: Any) -> Mapping[str, str]:
    values: dict[str, str] = {}
    for key, value in pairs:
        values.setdefault(key, value)
    return values
