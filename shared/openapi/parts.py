"""What every route group shares: problems, JSON bodies, an order's id and state."""

from __future__ import annotations

from typing import Any

from shared.domain.model import ProcessState

_PROBLEM = {"$ref": "#/components/schemas/Problem"}


def problem(description: str) -> dict[str, Any]:
    return {
        "description": description,
        "content": {"application/problem+json": {"schema": _PROBLEM}},
    }


UNAUTHORIZED = {"401": problem("no valid key for this route's auth level")}
CROSS_ORIGIN = {"403": problem("local runtime only: a state change from another Origin")}
UNAVAILABLE = {
    "503": {
        **problem("the state store is unavailable; retry after Retry-After seconds"),
        "headers": {"Retry-After": {"schema": {"type": "integer"}}},
    }
}


def json_response(description: str, schema: dict[str, Any]) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


ORDER_ID = {
    "name": "orderId",
    "in": "path",
    "required": True,
    "schema": {"type": "string", "pattern": r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$"},
}
CONTINUATION = {
    "name": "continuation",
    "in": "query",
    "description": "the continuation of the previous page of the same listing, as it came; "
    "anything else (junk, another listing's) is a 400",
    "schema": {"type": "string"},
}
STATES = [s.value for s in ProcessState]
STEP = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "status": {"enum": ["NotStarted", "Running", "Completed", "Failed", "Compensated"]},
        "attempts": {"type": "integer"},
        "completeBy": {"type": ["string", "null"], "format": "date-time"},
    },
}
STATE = {
    "type": "object",
    "properties": {
        "orderId": {"type": "string"},
        "processState": {"enum": STATES},
        "lockedBy": {"type": ["string", "null"]},
        "completeBy": {"type": ["string", "null"], "format": "date-time"},
        "failureCount": {"type": "integer"},
    },
}

_CANCEL_BODY = {
    "type": "object",
    "additionalProperties": False,
    "properties": {"reason": {"type": "string", "maxLength": 500}},
}


def operator_action(
    operation_id: str, summary: str, conflict: str, body: bool = False
) -> dict[str, Any]:
    """An operator's POST on one order: 202 with its state, or a problem."""
    responses: dict[str, Any] = {
        "202": json_response("accepted; asked again, the same answer", STATE),
        "404": problem("unknown order"),
        "409": problem(f"{conflict}, or archived (code archived)"),
        **UNAUTHORIZED,
        **CROSS_ORIGIN,
        **UNAVAILABLE,
    }
    operation: dict[str, Any] = {
        "operationId": operation_id,
        "summary": summary,
        "security": [{"adminKey": []}],
        "parameters": [ORDER_ID],
    }
    if body:
        operation["requestBody"] = {
            "required": False,
            "content": {"application/json": {"schema": _CANCEL_BODY}},
        }
        responses |= {
            "400": problem("invalid body"),
            "413": problem("body too large"),
            "415": problem("a body that is not JSON"),
        }
    return {"post": operation | {"responses": responses}}


INT = {"type": "integer"}
TIME = {"type": "string", "format": "date-time"}
OPT_INT = {"type": ["integer", "null"], "minimum": 1}
OPT_NUMBER = {"type": ["number", "null"], "exclusiveMinimum": 0}
OPT_TIME = {"type": ["string", "null"], "format": "date-time"}
