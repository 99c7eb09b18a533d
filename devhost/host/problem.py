"""The RFC 9457 answer of the local runtime, wherever in it the request was refused."""

from __future__ import annotations

from typing import Any

from aiohttp import web

PROBLEM_JSON = "application/problem+json"


def problem(status: int, title: str, detail: str, **extra: Any) -> web.Response:
    """Answer in the same RFC 9457 shape the app uses, so clients parse one format."""
    body = {"type": "about:blank", "title": title, "status": status, "detail": detail, **extra}
    return web.json_response(body, status=status, content_type=PROBLEM_JSON)
