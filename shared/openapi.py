"""The HTTP API described as OpenAPI 3.1. The order submission's schema is generated from
the model that validates it (`OrderSubmission`); every other body and response schema is
written here by hand, and kept true by the tests: the routes and auth levels against the
registered functions (tests/functions), the status codes against docs/contract.md
(tests/infra), and the running API against the document (schemathesis,
tests/e2e/test_api_schema.py)."""

from __future__ import annotations

from functools import cache
from typing import Any

from shared.catalogue.schema import NAME_MAX_LENGTH, NAME_PATTERN
from shared.contract import Route
from shared.domain.bulk_request import BulkAction
from shared.domain.event_signature import FORMAT as SIGNATURE_FORMAT
from shared.domain.event_signature import WINDOW_SECONDS
from shared.domain.messages import NO_CONTROL_CHARACTERS, OrderSubmission
from shared.domain.model import ProcessState
from shared.jsonbounds import MAX_DEPTH

_PROBLEM = {"$ref": "#/components/schemas/Problem"}


def _problem(description: str) -> dict[str, Any]:
    return {
        "description": description,
        "content": {"application/problem+json": {"schema": _PROBLEM}},
    }


_UNAUTHORIZED = {"401": _problem("no valid key for this route's auth level")}
_CROSS_ORIGIN = {"403": _problem("local runtime only: a state change from another Origin")}
_UNAVAILABLE = {
    "503": {
        **_problem("the state store is unavailable; retry after Retry-After seconds"),
        "headers": {"Retry-After": {"schema": {"type": "integer"}}},
    }
}


def _json(description: str, schema: dict[str, Any]) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


_ORDER_ID = {
    "name": "orderId",
    "in": "path",
    "required": True,
    "schema": {"type": "string", "pattern": r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$"},
}
_CONTINUATION = {
    "name": "continuation",
    "in": "query",
    "description": "the continuation of the previous page of the same listing, as it came; "
    "anything else (junk, another listing's) is a 400",
    "schema": {"type": "string"},
}
_STATES = [s.value for s in ProcessState]
_STEP = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "status": {"enum": ["NotStarted", "Running", "Completed", "Failed", "Compensated"]},
        "attempts": {"type": "integer"},
        "completeBy": {"type": ["string", "null"], "format": "date-time"},
    },
}
_STATE = {
    "type": "object",
    "properties": {
        "orderId": {"type": "string"},
        "processState": {"enum": _STATES},
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


def _operator_action(
    operation_id: str, summary: str, conflict: str, body: bool = False
) -> dict[str, Any]:
    """An operator's POST on one order: 202 with its state, or a problem."""
    responses: dict[str, Any] = {
        "202": _json("accepted; asked again, the same answer", _STATE),
        "404": _problem("unknown order"),
        "409": _problem(f"{conflict}, or archived (code archived)"),
        **_UNAUTHORIZED,
        **_CROSS_ORIGIN,
        **_UNAVAILABLE,
    }
    operation: dict[str, Any] = {
        "operationId": operation_id,
        "summary": summary,
        "security": [{"adminKey": []}],
        "parameters": [_ORDER_ID],
    }
    if body:
        operation["requestBody"] = {
            "required": False,
            "content": {"application/json": {"schema": _CANCEL_BODY}},
        }
        responses |= {
            "400": _problem("invalid body"),
            "413": _problem("body too large"),
            "415": _problem("a body that is not JSON"),
        }
    return {"post": operation | {"responses": responses}}


_INT = {"type": "integer"}
_TIME = {"type": "string", "format": "date-time"}
_OPT_INT = {"type": ["integer", "null"], "minimum": 1}
_OPT_NUMBER = {"type": ["number", "null"], "exclusiveMinimum": 0}
_OPT_TIME = {"type": ["string", "null"], "format": "date-time"}
_RECONCILE_RUN = {
    "type": "object",
    "required": ["instance", "startedAt", "finishedAt", "orders", "queries", "unknown"],
    "properties": {
        "instance": {"type": "string"},
        "startedAt": _TIME,
        "finishedAt": _TIME,
        "orders": _INT,
        "queries": _INT,
        "unknown": _INT,
        "mismatches": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {
                    "orderId": {"type": "string"},
                    "state": {"enum": ["Processed", "Compensated", "Cancelled"]},
                    "step": {"type": "string"},
                    "agent": {"type": "string"},
                    "key": {"type": "string"},
                    "expected": {"type": "string"},
                    "found": {"type": "string"},
                    "message": {"type": "string"},
                },
            },
        },
    },
}

_OPS_SNAPSHOT = {
    "type": "object",
    "required": [
        "at",
        "countCap",
        "staleAfterSeconds",
        "unavailable",
        "orders",
        "agents",
        "sweeps",
    ],
    "properties": {
        "at": _TIME,
        "countCap": _INT,
        "staleAfterSeconds": {"type": "number"},
        "unavailable": {
            "type": "array",
            "items": {"enum": ["orders", "agents", "sweeps", "reconciliation"]},
        },
        "reconciliation": {
            "type": "array",
            "description": "the last reconciliation runs, newest first",
            "items": _RECONCILE_RUN,
        },
        "traceQueryUrl": {
            "type": ["string", "null"],
            "description": "where the page reads an order's trace (locally); null in Azure",
        },
        "orders": {
            "type": "object",
            "properties": {
                "counts": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "properties": {
                            "state": {"enum": _STATES},
                            "count": _INT,
                            "capped": {"type": "boolean"},
                            "recent": {"type": "array", "items": {"type": "string"}},
                        },
                    },
                },
                "errors": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "properties": {
                            "orderId": {"type": "string"},
                            "failureCount": _INT,
                            "step": {"type": "string"},
                            "lastError": {"type": ["string", "null"]},
                            "updatedAt": _TIME,
                        },
                    },
                },
            },
        },
        "agents": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {
                    "agent": {"type": "string"},
                    "instance": {"type": "string"},
                    "breaker": {"enum": ["closed", "open", "half-open"]},
                    "successRate": {"type": "number"},
                    "latencyMs": {"type": "number"},
                    "inFlight": _INT,
                    "capacity": _INT,
                    "calls": _INT,
                    "heartbeatAt": _TIME,
                    "openUntil": {"type": ["string", "null"], "format": "date-time"},
                    "maxConcurrent": _OPT_INT,
                    "callsPerSecond": _OPT_NUMBER,
                    "rate": {"type": "number", "description": "calls per second lately"},
                    "throttled": _INT,
                    "last429": _OPT_TIME,
                    "ageSeconds": {"type": "number"},
                    "stale": {"type": "boolean"},
                },
            },
        },
        "sweeps": {"type": "array", "items": {"type": "object"}},
    },
}


_LIMITS = {
    "description": "the agent's fleet-wide limits (null: none) and how it is being held "
    "to them: calls per second over the fresh instances, 429s seen, the last one",
    "type": "object",
    "required": ["maxConcurrent", "callsPerSecond", "rate", "throttled", "last429"],
    "properties": {
        "maxConcurrent": _OPT_INT,
        "callsPerSecond": _OPT_NUMBER,
        "rate": {"type": "number", "minimum": 0},
        "throttled": _INT,
        "last429": _OPT_TIME,
    },
}
_AGENT = {
    "type": "object",
    "required": ["agent", "queue", "highPriorityQueue", "drained", "health", "limits"],
    "properties": {
        "agent": {"type": "string"},
        "queue": {"type": "string"},
        "highPriorityQueue": {"type": "string"},
        "drained": {"type": "boolean"},
        "reason": {"type": ["string", "null"]},
        "since": {"type": ["string", "null"], "format": "date-time"},
        "by": {"type": ["string", "null"]},
        "health": {
            "description": "null until the agent has published a heartbeat",
            "type": ["object", "null"],
            "properties": {
                "status": {"enum": ["healthy", "unknown", "probe", "full", "unavailable"]},
                "detail": {"type": "string"},
                "breaker": {"enum": ["closed", "open", "half-open"]},
                "successRate": {"type": "number"},
                "latencyMs": {"type": ["number", "null"]},
                "inFlight": _INT,
                "capacity": _INT,
                "lastHeartbeat": _TIME,
                "instances": _INT,
            },
        },
        "limits": _LIMITS,
    },
}
_AGENT_NAME = {"name": "agent", "in": "path", "required": True, "schema": {"type": "string"}}
_DRAIN_BODY = {
    "type": "object",
    "additionalProperties": False,
    "required": ["drained"],
    "properties": {
        "drained": {"type": "boolean"},
        "reason": {"type": ["string", "null"], "maxLength": 500},
    },
}
_FAILURES = {
    "type": "object",
    "required": ["groups", "scanned", "scanCap", "truncated"],
    "properties": {
        "groups": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {
                    "step": {"type": "string"},
                    "errorCode": {"type": "string"},
                    "count": _INT,
                    "firstAt": _TIME,
                    "lastAt": _TIME,
                    "sampleOrderIds": {"type": "array", "items": {"type": "string"}},
                },
            },
        },
        "scanned": _INT,
        "scanCap": _INT,
        "truncated": {"type": "boolean", "description": "more Error orders than scanCap"},
    },
}


_WORKFLOW = {
    "type": "object",
    "required": ["name", "version", "default", "steps"],
    "properties": {
        "name": {"type": "string"},
        "version": {"type": "integer", "minimum": 1},
        "default": {"type": "boolean", "description": "new orders without a workflow run it"},
        "steps": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["name", "agent", "kind", "undo", "inputs"],
                "properties": {
                    "name": {"type": "string", "description": "also the remote operation"},
                    "agent": {"type": ["string", "null"], "description": "null for waits"},
                    "kind": {"enum": ["compensatable", "pivot", "retriable", "event", "timer"]},
                    "event": {"type": "string", "description": "what an event step waits for"},
                    "approval": {"type": "boolean"},
                    "onDeadline": {"enum": ["compensate", "hold", "alert"]},
                    "until": {"type": "string", "description": "a timer's order field"},
                    "undo": {"type": ["string", "null"]},
                    "inputs": {"type": "array", "items": {"type": "string"}},
                },
            },
        },
    },
}


_APPROVAL_BODY = {
    "type": "object",
    "required": ["eventId", "approved"],
    "additionalProperties": False,
    "properties": {
        "eventId": {"type": "string", "pattern": "^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$"},
        "approved": {"type": "boolean"},
        "comment": {"type": "string", "maxLength": 500},
        "event": {
            "type": "string",
            "pattern": NAME_PATTERN,
            "maxLength": NAME_MAX_LENGTH,
            "description": "the approval to answer; default: the one the order is at",
        },
    },
}


def _fleet_paths() -> dict[str, Any]:
    """Operating the fleet: agents (drain) and the Error orders grouped by failure."""
    admin: list[dict[str, list[str]]] = [{"adminKey": []}]
    return {
        f"/{Route.AGENTS}": {
            "get": {
                "operationId": "listAgents",
                "summary": "Each agent with its queue, health and drain flag",
                "security": admin,
                "responses": {
                    "200": _json(
                        "the agents",
                        {
                            "type": "object",
                            "properties": {"agents": {"type": "array", "items": _AGENT}},
                        },
                    ),
                    **_UNAUTHORIZED,
                    **_UNAVAILABLE,
                },
            }
        },
        f"/{Route.AGENT_DRAIN}": {
            "put": {
                "operationId": "drainAgent",
                "summary": "Drain (no new dispatch) or undrain an agent",
                "security": admin,
                "parameters": [_AGENT_NAME],
                "requestBody": {
                    "required": True,
                    "content": {"application/json": {"schema": _DRAIN_BODY}},
                },
                "responses": {
                    "200": _json("the agent as stored now", _AGENT),
                    "400": _problem("invalid body"),
                    "404": _problem("unknown agent"),
                    "413": _problem("body too large"),
                    "415": _problem("a body that is not JSON"),
                    **_UNAUTHORIZED,
                    **_CROSS_ORIGIN,
                    **_UNAVAILABLE,
                },
            }
        },
        f"/{Route.ORDER_EVENT}": {
            "post": {
                "operationId": "sendEvent",
                "summary": "An event for the order's waiting step: kept until its step takes it",
                "security": [{"functionKey": []}],
                "parameters": [
                    _ORDER_ID,
                    {
                        "name": "eventName",
                        "in": "path",
                        "required": True,
                        "schema": {"type": "string", "pattern": NAME_PATTERN},
                    },
                    {
                        "name": "x-signature",
                        "in": "header",
                        "required": False,
                        "description": "required when EventSigningSecret is set: "
                        f"{SIGNATURE_FORMAT}, signed within {WINDOW_SECONDS} s "
                        "(docs/events.md#signing)",
                        "schema": {"type": "string"},
                    },
                ],
                "requestBody": {
                    "required": True,
                    "content": {
                        "application/json": {
                            "schema": {
                                "type": "object",
                                "required": ["eventId"],
                                "additionalProperties": False,
                                "properties": {
                                    "eventId": {
                                        "type": "string",
                                        "pattern": "^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$",
                                    },
                                    "data": {
                                        "type": "object",
                                        "description": 'an approval: {"approved": bool, '
                                        '"by"?: string, "comment"?: string}; at most 8192 '
                                        "bytes as compact JSON in UTF-8 (413 past it)",
                                    },
                                },
                            }
                        }
                    },
                },
                "responses": {
                    "202": _json(
                        "stored (or a repeat of this eventId: nothing more happens)",
                        {
                            "type": "object",
                            "properties": {
                                "orderId": {"type": "string"},
                                "event": {"type": "string"},
                                "eventId": {"type": "string"},
                            },
                        },
                    ),
                    "400": _problem(
                        "invalid body, or an event the order's workflow never waits for"
                    ),
                    "401": _problem(
                        "no valid key, or a signature missing, not for this order, event "
                        "and body, or outside its window"
                    ),
                    "404": _problem("unknown order"),
                    "409": _problem("the order is final (archived too: code archived)"),
                    "413": _problem("body or data too large"),
                    "415": _problem("a body that is not JSON"),
                    **_CROSS_ORIGIN,
                    **_UNAVAILABLE,
                },
            }
        },
        f"/{Route.ORDER_APPROVAL}": {
            "post": {
                "operationId": "answerApproval",
                "summary": "An operator answers the order's approval, recorded by x-operator",
                "security": admin,
                "parameters": [_ORDER_ID],
                "requestBody": {
                    "required": True,
                    "content": {"application/json": {"schema": _APPROVAL_BODY}},
                },
                "responses": {
                    "202": _json(
                        "kept as the approval event (or a repeat of this eventId: the first)",
                        {
                            "type": "object",
                            "properties": {
                                "orderId": {"type": "string"},
                                "event": {"type": "string"},
                                "eventId": {"type": "string"},
                                "approved": {"type": "boolean"},
                                "by": {"type": "string"},
                            },
                        },
                    ),
                    "400": _problem("invalid body, or an event no approval step waits for"),
                    "404": _problem("unknown order"),
                    "409": _problem(
                        "the order is final, keeps 50 events, or (no event named) is not "
                        "at an approval"
                    ),
                    "413": _problem("body too large"),
                    "415": _problem("a body that is not JSON"),
                    **_UNAUTHORIZED,
                    **_CROSS_ORIGIN,
                    **_UNAVAILABLE,
                },
            }
        },
        f"/{Route.WORKFLOWS}": {
            "get": {
                "operationId": "listWorkflows",
                "summary": "The catalogue's workflows, every kept version, with their steps",
                "security": admin,
                "responses": {
                    "200": _json(
                        "the workflows",
                        {
                            "type": "object",
                            "required": ["workflows"],
                            "properties": {"workflows": {"type": "array", "items": _WORKFLOW}},
                        },
                    ),
                    **_UNAUTHORIZED,
                },
            }
        },
        f"/{Route.RECONCILE}": {
            "post": {
                "operationId": "reconcile",
                "summary": "Check a sample of finished orders against the services now",
                "security": admin,
                "responses": {
                    "200": _json("the run, with its mismatches", _RECONCILE_RUN),
                    **_UNAUTHORIZED,
                    **_CROSS_ORIGIN,
                    **_UNAVAILABLE,
                },
            }
        },
        f"/{Route.FAILURES}": {
            "get": {
                "operationId": "listFailures",
                "summary": "The Error orders grouped by step and error code, largest first",
                "security": admin,
                "responses": {
                    "200": _json("the groups", _FAILURES),
                    **_UNAUTHORIZED,
                    **_UNAVAILABLE,
                },
            }
        },
    }


_BULK_ACTIONS = [a.value for a in BulkAction]
_BULK_FILTER_FIELDS: dict[str, dict[str, Any]] = {
    "state": {"enum": _STATES},
    **{
        name: {"type": "string", "minLength": 1, "maxLength": 200, "pattern": NO_CONTROL_CHARACTERS}
        for name in ("step", "errorCode", "customerId")
    },
    "createdFrom": {**_TIME, "description": "orders created at or after"},
    "createdTo": {**_TIME, "description": "orders created before"},
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
        "matched": _INT,
        "sampleOrderIds": {"type": "array", "items": {"type": "string"}, "maxItems": 10},
        "effects": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["operation", "count"],
                "properties": {"operation": {"type": "string"}, "count": _INT},
            },
        },
        "refused": {**_INT, "description": "migrate only: orders it would refuse"},
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
        "toVersion": _INT,
        "matched": _INT,
        "done": _INT,
        "skipped": _INT,
        "failed": _INT,
    },
}


_ARCHIVE_RUN = {
    "type": "object",
    "required": ["instance", "startedAt", "finishedAt", "archived", "pages", "kept", "skipped"],
    "properties": {
        "instance": {"type": "string"},
        "startedAt": _TIME,
        "finishedAt": _TIME,
        "archived": {**_INT, "description": "orders copied to the archive and deleted"},
        "pages": _INT,
        "kept": {**_INT, "description": "orders left: changed, or no longer due"},
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
                    "finishedAt": _TIME,
                    "archivedAt": _TIME,
                    "blob": {"type": "string"},
                },
            },
        },
        "continuation": {"type": ["string", "null"]},
    },
}


def _archive_paths() -> dict[str, Any]:
    """Retention: run the archiver now, and list what one day holds."""
    admin: list[dict[str, list[str]]] = [{"adminKey": []}]
    return {
        f"/{Route.ARCHIVE}": {
            "post": {
                "operationId": "archive",
                "summary": "Archive finished orders past their retention now, as the timer does",
                "security": admin,
                "responses": {
                    "200": _json("the run", _ARCHIVE_RUN),
                    "409": _problem("no archive configured here (no blob service)"),
                    **_UNAUTHORIZED,
                    **_CROSS_ORIGIN,
                    **_UNAVAILABLE,
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
                    _CONTINUATION,
                ],
                "responses": {
                    "200": _json("the day's orders, a few pages at a time", _ARCHIVE_DAY),
                    "400": _problem("bad day, pages or continuation"),
                    **_UNAUTHORIZED,
                    **_UNAVAILABLE,
                },
            }
        },
    }


def _bulk_paths() -> dict[str, Any]:
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
                    "200": _json(
                        "dryRun: what the action would do; nothing changed", _BULK_PREVIEW
                    ),
                    "202": {
                        **_json(
                            "the job is stored; the timer works it",
                            {
                                "type": "object",
                                "required": ["bulkId", "matched"],
                                "properties": {"bulkId": {"type": "string"}, "matched": _INT},
                            },
                        ),
                        "headers": {"Location": {"schema": {"type": "string"}}},
                    },
                    "400": _problem("invalid body: unknown action, empty filter, bad date, limit"),
                    "413": _problem("body too large"),
                    "415": _problem("a body that is not JSON"),
                    **_UNAUTHORIZED,
                    **_CROSS_ORIGIN,
                    **_UNAVAILABLE,
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
                    "200": _json("the job", _BULK_JOB),
                    "404": _problem("unknown bulk job"),
                    **_UNAUTHORIZED,
                    **_UNAVAILABLE,
                },
            }
        },
    }


_SIGNED_IN: list[dict[str, list[str]]] = [{"operatorPrincipal": []}, {"operatorBearer": []}]
_NO_ROLE = "a signed-in principal without the route's app role (docs/contract.md#15-who-acts)"


def _operators_sign_in(paths: dict[str, Any]) -> None:
    """Every operator route (the master key's) also takes a signed-in principal, and
    answers 403 to one without the role; declared here once rather than per route."""
    for operations in paths.values():
        for operation in operations.values():
            if operation.get("security") != [{"adminKey": []}]:
                continue
            operation["security"] = [{"adminKey": []}, *_SIGNED_IN]
            responses = operation["responses"]
            known = responses.get("403", {}).get("description")
            responses["403"] = _problem(f"{known}; or {_NO_ROLE}" if known else _NO_ROLE)


@cache
def document() -> dict[str, Any]:
    built = _document()
    _operators_sign_in(built["paths"])
    return built


def _document() -> dict[str, Any]:
    submission = OrderSubmission.model_json_schema(
        by_alias=True, ref_template="#/components/schemas/{model}"
    )
    definitions = submission.pop("$defs", {})
    accepted = {
        "type": "object",
        "properties": {
            "orderId": {"type": "string"},
            "processState": {"enum": _STATES},
            "statusUrl": {"type": "string", "format": "uri"},
        },
    }
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "Order processing (Scheduler-Agent-Supervisor)",
            "version": "1.0.0",
            "description": (
                "Errors are application/problem+json; no input produces a 5xx (503 means a "
                f"dependency is down: retry). JSON bodies nest at most {MAX_DEPTH} levels deep."
            ),
        },
        "servers": [{"url": "/api"}],
        "paths": {
            f"/{Route.ORDERS}": {
                "post": {
                    "operationId": "submitOrder",
                    "security": [{"functionKey": []}],
                    "requestBody": {
                        "required": True,
                        "content": {
                            "application/json": {
                                "schema": {"$ref": "#/components/schemas/OrderSubmission"}
                            }
                        },
                    },
                    "responses": {
                        "202": _json(
                            "accepted; the same body again gives the same answer", accepted
                        ),
                        "400": _problem("invalid order"),
                        "409": _problem(
                            "the order id is taken by another body (an archived order's too)"
                        ),
                        "413": _problem("body too large"),
                        "415": _problem("not JSON"),
                        "429": {
                            **_problem(
                                "the customer already has IntakeMaxPendingPerCustomer orders "
                                "not finished; nothing was stored, retry after Retry-After "
                                "seconds"
                            ),
                            "headers": {
                                "Retry-After": {
                                    "description": "seconds between two of this customer's "
                                    "orders ending, lately (a slot frees at each end); 5 "
                                    "until one has ended",
                                    "schema": {"type": "integer", "minimum": 1, "maximum": 60},
                                }
                            },
                        },
                        **_UNAUTHORIZED,
                        **_CROSS_ORIGIN,
                        **_UNAVAILABLE,
                    },
                },
                "get": {
                    "operationId": "listOrders",
                    "security": [{"adminKey": []}],
                    "parameters": [
                        {"name": "state", "in": "query", "schema": {"enum": _STATES}},
                        {
                            "name": "pageSize",
                            "in": "query",
                            "schema": {"type": "integer", "minimum": 1, "maximum": 1000},
                        },
                        _CONTINUATION,
                    ],
                    "responses": {
                        "200": _json(
                            "a page of orders",
                            {
                                "type": "object",
                                "properties": {
                                    "items": {"type": "array", "items": _STATE},
                                    "continuation": {"type": ["string", "null"]},
                                },
                            },
                        ),
                        "400": _problem("bad state, pageSize or continuation"),
                        **_UNAUTHORIZED,
                        **_UNAVAILABLE,
                    },
                },
            },
            f"/{Route.ORDER}": {
                "get": {
                    "operationId": "getOrder",
                    "security": [{"functionKey": []}],
                    "parameters": [_ORDER_ID],
                    "responses": {
                        "200": _json(
                            "state, steps and history",
                            {
                                "allOf": [
                                    _STATE,
                                    {
                                        "type": "object",
                                        "properties": {
                                            "steps": {"type": "array", "items": _STEP},
                                            "history": {
                                                "type": "array",
                                                "items": {"type": "object"},
                                            },
                                            "traceId": {
                                                "type": ["string", "null"],
                                                "pattern": "^[0-9a-f]{32}$",
                                            },
                                            "archived": {
                                                "type": "boolean",
                                                "description": "true: the order left the "
                                                "state table after its retention and this "
                                                "is its archive copy, as it was then; "
                                                "nothing can change it any more",
                                            },
                                            "archivedAt": {
                                                **_TIME,
                                                "description": "only when archived",
                                            },
                                        },
                                    },
                                ]
                            },
                        ),
                        "404": _problem("unknown order"),
                        **_UNAUTHORIZED,
                        **_UNAVAILABLE,
                    },
                }
            },
            f"/{Route.RESUBMIT}": {
                "post": {
                    "operationId": "resubmitOrder",
                    "security": [{"adminKey": []}],
                    "parameters": [_ORDER_ID],
                    "responses": {
                        "202": _json("back to Pending at the failed step", _STATE),
                        "404": _problem("unknown order"),
                        "409": _problem("the order is not in Error, or archived (code archived)"),
                        **_UNAUTHORIZED,
                        **_CROSS_ORIGIN,
                        **_UNAVAILABLE,
                    },
                }
            },
            f"/{Route.CANCEL}": _operator_action(
                "cancelOrder",
                "Stop the order, undo every step that may have taken effect, end Cancelled",
                "the order is Processed, Compensated or Cancelled",
                body=True,
            ),
            f"/{Route.SUSPEND}": _operator_action(
                "suspendOrder",
                "Dispatch nothing further and stop the deadlines",
                "the order is Processed, Compensated, Cancelled or Error",
            ),
            f"/{Route.RESUME}": _operator_action(
                "resumeOrder",
                "Continue a Suspended order where it stopped, with fresh deadlines",
                "the order is not Suspended",
            ),
            f"/{Route.HEALTH}": {
                "get": {
                    "operationId": "health",
                    "responses": {
                        "200": _json("the state store and the bus answer", {"type": "object"}),
                        "503": _json("a dependency does not answer", {"type": "object"}),
                    },
                }
            },
            f"/{Route.OPS_PAGE}": {
                "get": {
                    "operationId": "opsPage",
                    "summary": "The operator's status page; it polls /ops/data",
                    "security": [{"adminKey": []}],
                    "responses": {
                        "200": {
                            "description": "an HTML page (open it with ?code=ADMIN_KEY)",
                            "content": {"text/html": {"schema": {"type": "string"}}},
                        },
                        **_UNAUTHORIZED,
                    },
                }
            },
            f"/{Route.OPS_ORDER}": {
                "get": {
                    "operationId": "opsOrder",
                    "summary": "One order as getOrder answers it, for the operator page",
                    "security": [{"adminKey": []}],
                    "parameters": [_ORDER_ID],
                    "responses": {
                        "200": _json("as getOrder", {"type": "object"}),
                        "404": _problem("unknown order"),
                        **_UNAUTHORIZED,
                        **_UNAVAILABLE,
                    },
                }
            },
            f"/{Route.OPS_DATA}": {
                "get": {
                    "operationId": "opsData",
                    "summary": "A bounded snapshot: orders by state, Error orders, agents, sweeps",
                    "security": [{"adminKey": []}],
                    "parameters": [
                        {
                            "name": "countCap",
                            "in": "query",
                            "description": "count at most this many orders per state",
                            "schema": {"type": "integer", "minimum": 1, "maximum": 1000},
                        }
                    ],
                    "responses": {
                        "200": _json("the snapshot", _OPS_SNAPSHOT),
                        "400": _problem("bad countCap"),
                        **_UNAUTHORIZED,
                    },
                }
            },
            **_fleet_paths(),
            **_bulk_paths(),
            **_archive_paths(),
            f"/{Route.OPENAPI}": {
                "get": {
                    "operationId": "openapi",
                    "responses": {"200": _json("this document", {"type": "object"})},
                }
            },
        },
        "components": {
            "schemas": {
                "OrderSubmission": submission,
                **definitions,
                "Problem": {
                    "type": "object",
                    "required": ["title", "status", "detail"],
                    "properties": {
                        "type": {"type": "string"},
                        "title": {"type": "string"},
                        "status": {"type": "integer"},
                        "detail": {"type": "string"},
                    },
                },
            },
            "securitySchemes": {
                "functionKey": {"type": "apiKey", "in": "header", "name": "x-functions-key"},
                "adminKey": {"type": "apiKey", "in": "header", "name": "x-functions-key"},
                "operatorPrincipal": {
                    "type": "apiKey",
                    "in": "header",
                    "name": "X-MS-CLIENT-PRINCIPAL",
                    "description": "OperatorAuth platform or dev-header: the principal as "
                    "App Service authentication passes it, with the app role Orders.Read "
                    "(reads) or Orders.Operate (actions)",
                },
                "operatorBearer": {
                    "type": "http",
                    "scheme": "bearer",
                    "bearerFormat": "JWT",
                    "description": "OperatorAuth token: an Entra access token for the app "
                    "registration, with the same roles claim",
                },
            },
        },
    }
