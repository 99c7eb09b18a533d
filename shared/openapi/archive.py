"""Retention: the archiver's runs and what one day holds."""

from __future__ import annotations

from typing import Any

from shared.contract import Route
from shared.openapi.parts import (
    CONTINUATION,
    CROSS_ORIGIN,
    INT,
    TIME,
    UNAUTHORIZED,
    UNAVAILABLE,
    json_response,
    problem,
)

_ARCHIVE_RUN = {
    "type": "object",
    "required": ["instance", "startedAt", "finishedAt", "archived", "pages", "kept", "skipped"],
    "properties": {
        "instance": {"type": "string"},
        "startedAt": TIME,
        "finishedAt": TIME,
        "archived": {**INT, "description": "orders copied to the archive and deleted"},
        "pages": INT,
        "kept": {**INT, "description": "orders left: changed, or no longer due"},
        "resumed": {"type": "boolean", "description": "finished a killed run's page first"},
        "skipped": {"type": "boolean", "description": "another run held the archiver"},
    },
}
_ARCHIVE_DAY = {
    "type": "object",
    "required": ["day", "items", "continuation"],
    "properties": {
        "day": {"type": "string", "format": "date"},
        "items": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["orderId", "processState", "finishedAt", "archivedAt", "blob"],
                "properties": {
                    "orderId": {"type": "string"},
                    "processState": {"enum": ["Processed", "Compensated", "Cancelled"]},
                    "finishedAt": TIME,
                    "archivedAt": TIME,
                    "blob": {"type": "string"},
                },
            },
        },
        "continuation": {"type": ["string", "null"]},
    },
}


def archive_paths() -> dict[str, Any]:
    """Retention: run the archiver now, and list what one day holds."""
    admin: list[dict[str, list[str]]] = [{"adminKey": []}]
    return {
        f"/{Route.ARCHIVE}": {
            "post": {
                "operationId": "archive",
                "summary": "Archive finished orders past their retention now, as the timer does",
                "security": admin,
                "responses": {
                    "200": json_response("the run", _ARCHIVE_RUN),
                    "409": problem("no archive configured here (no blob service)"),
                    **UNAUTHORIZED,
                    **CROSS_ORIGIN,
                    **UNAVAILABLE,
                },
            }
        },
        f"/{Route.ARCHIVE_DAY}": {
            "get": {
                "operationId": "archivedOn",
                "summary": "The orders archived under one day (the UTC day each finished)",
                "security": admin,
                "parameters": [
                    {
                        "name": "day",
                        "in": "path",
                        "required": True,
                        "schema": {"type": "string", "pattern": "^\\d{4}-\\d{2}-\\d{2}$"},
                    },
                    {
                        "name": "pages",
                        "in": "query",
                        "description": "archive pages (blobs) to read, each up to 100 orders",
                        "schema": {"type": "integer", "minimum": 1, "maximum": 100},
                    },
                    CONTINUATION,
                ],
                "responses": {
                    "200": json_response("the day's orders, a few pages at a time", _ARCHIVE_DAY),
                    "400": problem("bad day, pages or continuation"),
                    **UNAUTHORIZED,
                    **UNAVAILABLE,
                },
            }
        },
    }
