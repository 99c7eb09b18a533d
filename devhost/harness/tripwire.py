"""An HTTP proxy in front of a service that fires once, on the first request it is told to
look for, before that request reaches the service.

A test points the runtime at the proxy instead of the service (Azurite) and kills the
runtime from `on_trip`: the kill then lands exactly between two of the runtime's
requests, the one the service answered and the one it never sees, with no hook inside
the app. After it fired, the proxy passes everything through.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from urllib.parse import unquote

import aiohttp
from aiohttp import web
from yarl import URL

from devhost.harness.ports import LOOPBACK

HOP_BY_HOP = frozenset(
    {"connection", "keep-alive", "transfer-encoding", "content-length", "host", "upgrade"}
)


@dataclass(frozen=True)
class Seen:
    """A request as the proxy saw it: method and path with the query, percent-decoded."""

    method: str
    target: str


@dataclass
class Tripwire:
    """Forwards to `upstream`; the first request `matches` accepts calls `on_trip` and is
    answered 503 without being forwarded."""

    upstream: str
    matches: Callable[[Seen], bool]
    on_trip: Callable[[Seen], Awaitable[None]]
    tripped: asyncio.Event = field(default_factory=asyncio.Event)
    seen: list[Seen] = field(default_factory=list)
    port: int = 0
    _armed: bool = True
    _runner: web.ServerRunner | None = None
    _session: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> Tripwire:
        self._session = aiohttp.ClientSession(auto_decompress=False)
        server = web.Server(self._handle, access_log=None)
        self._runner = web.ServerRunner(server)
        await self._runner.setup()
        site = web.TCPSite(self._runner, LOOPBACK, 0)
        await site.start()
        self.port = int(self._runner.addresses[0][1])
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
        if self._session is not None:
            await self._session.close()

    async def _handle(self, request: web.BaseRequest) -> web.StreamResponse:
        seen = Seen(request.method, unquote(request.raw_path))
        self.seen.append(seen)
        if self._armed and self.matches(seen):
            self._armed = False
            await self.on_trip(seen)
            self.tripped.set()
            return web.Response(status=503, text="tripped")
        assert self._session is not None
        headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP_BY_HOP}
        async with self._session.request(
            request.method,
            URL(f"{self.upstream}{request.raw_path}", encoded=True),
            headers=headers,
            data=await request.read() or None,
            allow_redirects=False,
            skip_auto_headers=("Content-Type", "Accept-Encoding", "User-Agent"),
        ) as answer:
            body = await answer.read()
            kept = {k: v for k, v in answer.headers.items() if k.lower() not in HOP_BY_HOP}
            return web.Response(status=answer.status, headers=kept, body=body)
