"""Bulk actions: a preview or a durable, paced job, and its progress."""

from __future__ import annotations

from typing import Any

from shared.contract import Route
from shared.domain.bulk_request import BulkAction
from shared.domain.messages import NO_CONTROL_CHARACTERS
from shared.openapi.parts import (
    CROSS_ORIGIN,
    INT,
    STATES,
    TIME,
    UNAUTHORIZED,
    UNAVAILABLE,
    json_response,
    problem,
)

_BULK_ACTIONS = [a.value for a in BulkAction]
_BULK_FILTER_FIELDS: dict[str, dict[str, Any]] = {
    "state": {"enum": STATES},
    **{
        name: {"type": "string", "minLength": 1, "maxLength": 200, "pattern": NO_CONTROL_CHARACTERS}
        for name in ("step", "errorCode", "customerId")
    },
    "createdFrom": {**TIME, "description": "orders created at or after"},
    "createdTo": {**TIME, "description": "orders created before"},
    "workflow": {
        "type": "string",
        "minLength": 1,
        "maxLength": 200,
        "pattern": NO_CONTROL_CHARACTERS,
    },
    "workflowVersion": {
        "type": "integer",
        "minimum": 1,
        "maximum": 1_000_000,
        "description": "only with workflow",
    },
}
_BULK_FILTER = {
    "type": "object",
    "additionalProperties": False,
    "description": "at least one field that is not null: a bulk action never matches everything",
    "properties": {
        name: {"anyOf": [schema, {"type": "null"}]} for name, schema in _BULK_FILTER_FIELDS.items()
    },
    # One field given and not null, as the server counts them: minProperties would
    # count {"createdTo": null}, which names nothing. An anyOf of plain schemas, not a
    # `not`, which generators (schemathesis) cannot satisfy.
    "anyOf": [
        {"required": [name], "properties": {name: schema}}
        for name, schema in _BULK_FILTER_FIELDS.items()
    ],
}
_BULK_BODY = {
    "type": "object",
    "additionalProperties": False,
    "required": ["action", "filter"],
    "properties": {
        "action": {"enum": _BULK_ACTIONS},
        "filter": _BULK_FILTER,
        "dryRun": {"type": "boolean"},
        "limit": {"type": "integer", "minimum": 1, "maximum": 100_000},
        "toVersion": {
            "type": "integer",
            "minimum": 1,
            "maximum": 1_000_000,
            "description": "migrate only, and required there (with filter.workflow): the "
            "version of the workflow the orders move to",
        },
    },
}
_BULK_PREVIEW = {
    "type": "object",
    "required": ["matched", "sampleOrderIds", "effects"],
    "properties": {
        "matched": INT,
        "sampleOrderIds": {"type": "array", "items": {"type": "string"}, "maxItems": 10},
        "effects": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["operation", "count"],
                "properties": {"operation": {"type": "string"}, "count": INT},
            },
        },
        "refused": {**INT, "description": "migrate only: orders it would refuse"},
        "refusals": {
            "type": "array",
            "maxItems": 10,
            "items": {
                "type": "object",
                "required": ["orderId", "reason"],
                "properties": {"orderId": {"type": "string"}, "reason": {"type": "string"}},
            },
        },
    },
}
_BULK_JOB = {
    "type": "object",
    "required": ["bulkId", "action", "state", "matched", "done", "skipped", "failed"],
    "properties": {
        "bulkId": {"type": "string"},
        "action": {"enum": _BULK_ACTIONS},
        "state": {"enum": ["Running", "Done"]},
        "toVersion": INT,
        "matched": INT,
        "done": INT,
        "skipped": INT,
        "failed": INT,
    },
}


def bulk_paths() -> dict[str, Any]:
    """Bulk actions: a preview (dry run) or a durable, paced job, and its progress."""
    admin: list[dict[str, list[str]]] = [{"adminKey": []}]
    return {
        f"/{Route.BULK}": {
            "post": {
                "operationId": "bulkOrders",
                "summary": "Resubmit, cancel, suspend or resume every order a filter matches",
                "security": admin,
                "requestBody": {
                    "required": True,
                    "content": {"application/json": {"schema": _BULK_BODY}},
                },
                "responses": {
                    "200": json_response(
                        "dryRun: what the action would do; nothing changed", _BULK_PREVIEW
                    ),
                    "202": {
                        **json_response(
                            "the job is stored; the timer works it",
                            {
                                "type": "object",
                                "required": ["bulkId", "matched"],
                                "properties": {"bulkId": {"type": "string"}, "matched": INT},
                            },
                        ),
                        "headers": {"Location": {"schema": {"type": "string"}}},
                    },
                    "400": problem("invalid body: unknown action, empty filter, bad date, limit"),
                    "413": problem("body too large"),
                    "415": problem("a body that is not JSON"),
                    **UNAUTHORIZED,
                    **CROSS_ORIGIN,
                    **UNAVAILABLE,
                },
            }
        },
        f"/{Route.BULK_JOB}": {
            "get": {
                "operationId": "getBulkJob",
                "summary": "A bulk job's progress",
                "security": admin,
                "parameters": [
                    {"name": "bulkId", "in": "path", "required": True, "schema": {"type": "string"}}
                ],
                "responses": {
                    "200": json_response("the job", _BULK_JOB),
                    "404": problem("unknown bulk job"),
                    **UNAUTHORIZED,
                    **UNAVAILABLE,
                },
            }
        },
    }
