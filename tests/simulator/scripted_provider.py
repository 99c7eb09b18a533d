"""A provider on a free local port that answers from a script: the answers a real
provider gives (a key still in progress, an abandoned key, no abandon route) that the
simulator does not make on demand."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote

from aiohttp import web
from aiohttp.test_utils import TestServer


@dataclass(frozen=True)
class Answer:
    status: int
    body: dict[str, Any] | None = None
    headers: dict[str, str] = field(default_factory=dict)
    raw: bytes | None = None
    """Sent as it is, as application/json: what no JSON writer of ours would write."""


def in_progress(retry_after: str | None = None) -> Answer:
    """A provider's `409` for a key an earlier call is still running with."""
    headers = {} if retry_after is None else {"Retry-After": retry_after}
    return Answer(409, {"code": "operation-in-progress", "detail": "still running"}, headers)


Segments = tuple[str, ...]


def segments(raw_path: str) -> Segments:
    """A path's segments, each decoded: a client may send `:` as itself or as `%3A`, and
    either way it is the same key; an encoded `/` stays inside its segment."""
    return tuple(unquote(part) for part in raw_path.split("/"))


@dataclass(frozen=True)
class Seen:
    method: str
    raw_path: str
    headers: dict[str, str]
    body: Any


class ScriptedProvider:
    """Each (method, raw path) answers its script in order, the last answer for good;
    a route with no script is aiohttp's own plain `404`, like a provider without it."""

    def __init__(self) -> None:
        self._scripts: dict[tuple[str, Segments], list[Answer]] = {}
        self.seen: list[Seen] = []
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._answer)
        self._server = TestServer(app, host="127.0.0.1")

    @property
    def url(self) -> str:
        return str(self._server.make_url("")).rstrip("/")

    def on(self, method: str, raw_path: str, *answers: Answer) -> None:
        self._scripts[(method, segments(raw_path))] = list(answers)

    def calls(self, method: str, raw_path: str) -> list[Seen]:
        wanted = (method, segments(raw_path))
        return [s for s in self.seen if (s.method, segments(s.raw_path)) == wanted]

    async def _answer(self, request: web.Request) -> web.Response:
        text = await request.text()
        body = await request.json() if text else None
        self.seen.append(Seen(request.method, request.raw_path, dict(request.headers), body))
        script = self._scripts.get((request.method, segments(request.raw_path)))
        if not script:
            raise web.HTTPNotFound()
        answer = script.pop(0) if len(script) > 1 else script[0]
        if answer.raw is not None:
            return web.Response(
                status=answer.status,
                body=answer.raw,
                headers={**answer.headers, "Content-Type": "application/json"},
            )
        if answer.body is None:
            return web.Response(status=answer.status, headers=answer.headers)
        return web.json_response(answer.body, status=answer.status, headers=answer.headers)

    async def start(self) -> None:
        await self._server.start_server()

    async def close(self) -> None:
        await self._server.close()
