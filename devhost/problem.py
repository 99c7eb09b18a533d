"""The RFC 9457 answer of the local stack's HTTP servers, wherever the request was refused."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

PROBLEM_JSON = "application/problem+json"


def problem(status: int, title: str, detail: str, **extra: Any) -> web.Response:
    """Answer in the same RFC 9457 shape the app uses, so clients parse one format."""
    body = {"type": "about:blank", "title": title, "status": status, "detail": detail, **extra}
    return web.json_response(body, status=status, content_type=PROBLEM_JSON)


@web.middleware
async def http_errors_as_problems(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    """aiohttp's own refusals (no route, wrong method, a body over the limit) are
    text/plain; a client of a server that answers problem+json should get one format."""
    try:
        return await handler(request)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        refused = problem(exc.status, exc.reason, _detail(request, exc))
        if "Allow" in exc.headers:
            refused.headers["Allow"] = exc.headers["Allow"]
        return refused


def _detail(request: web.Request, exc: web.HTTPException) -> str:
    if exc.status == 404:
        return "nothing is served at this path"
    if "Allow" in exc.headers:
        return f"{request.method} is not served at this path; Allow: {exc.headers['Allow']}"
    # aiohttp's own text ("Maximum request body size ... exceeded.") unless it is only
    # the status line again.
    text = exc.text or ""
    return exc.reason if not text or text.startswith(f"{exc.status}:") else text
