"""RFC 9457 problem responses.

Agents classify failures by status and ``code`` (transient versus permanent), so every
error the simulator emits, including router 404s, uses the same machine-readable shape.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from aiohttp import web
from pydantic import ValidationError

PROBLEM_CONTENT_TYPE = "application/problem+json"
PROBLEM_TYPE_BASE = "https://devhost.local/simulator/problems/"


def problem_body(status: int, code: str, title: str, detail: str) -> dict[str, Any]:
    """Build the body separately so it can be stored and replayed for idempotent repeats."""
    return {
        "type": PROBLEM_TYPE_BASE + code,
        "title": title,
        "status": status,
        "detail": detail,
        "code": code,
    }


def problem_response(
    body: Mapping[str, Any], headers: Mapping[str, str] | None = None
) -> web.Response:
    """Serialise a stored or fresh problem body with the problem+json media type."""
    return web.json_response(
        dict(body),
        status=int(body["status"]),
        content_type=PROBLEM_CONTENT_TYPE,
        headers=headers,
    )


def problem(
    status: int,
    code: str,
    title: str,
    detail: str,
    headers: Mapping[str, str] | None = None,
) -> web.Response:
    """Shortcut for one-off problems that are never stored."""
    return problem_response(problem_body(status, code, title, detail), headers)


def validation_detail(error: ValidationError) -> str:
    """One readable line per invalid field, for the problem ``detail``."""
    return "; ".join(
        f"{'.'.join(str(part) for part in item['loc']) or 'body'}: {item['msg']}"
        for item in error.errors()
    )


async def read_json(request: web.Request) -> Any:
    """The body as JSON, or a ``ValueError`` the caller turns into a 400 problem."""
    text = await request.text()
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"body is not valid JSON: {exc}") from exc


FAULT_HEADER = "X-Simulator-Fault"
RETRY_AFTER_SECONDS = "1"


def transient_problem(status: int, fault: str) -> web.Response:
    """An injected retryable error; ``fault`` names it in the ``X-Simulator-Fault`` header."""
    headers = {FAULT_HEADER: fault}
    if status == 429:
        headers["Retry-After"] = RETRY_AFTER_SECONDS
        return problem(429, "rate-limited", "Too many requests", "slow down", headers)
    if status == 500:
        return problem(500, "internal-error", "Internal error", "injected fault", headers)
    return problem(
        503, "service-unavailable", "Service unavailable", "injected transient fault", headers
    )


def in_progress_problem(service: str, key: str) -> web.Response:
    """409 ``operation-in-progress``: a call with ``key`` is still running at the service.

    Unsettled, never a permanent failure: the caller asks again after ``Retry-After``."""
    return problem(
        409,
        "operation-in-progress",
        "Operation in progress",
        f"a call with key {key!r} is still running at {service}; ask again later",
        {"Retry-After": RETRY_AFTER_SECONDS},
    )


def limited_problem(fault: str, detail: str) -> web.Response:
    """429 past a quota (``fault`` is ``rate-limit`` or ``concurrency-limit``), with the
    ``Retry-After: 1`` the contract fixes (docs/limits.md): nothing about the call was looked at."""
    headers = {FAULT_HEADER: fault, "Retry-After": RETRY_AFTER_SECONDS}
    return problem(429, "rate-limited", "Too many requests", detail, headers)
