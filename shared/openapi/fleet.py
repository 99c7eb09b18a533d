"""Operating the fleet: agents, failures, workflows, limits, reconciliation."""

from __future__ import annotations

from typing import Any

from shared.catalogue.schema import NAME_MAX_LENGTH, NAME_PATTERN
from shared.contract import Route
from shared.domain.event_signature import FORMAT as SIGNATURE_FORMAT
from shared.domain.event_signature import WINDOW_SECONDS
from shared.openapi.parts import (
    CROSS_ORIGIN,
    INT,
    OPT_INT,
    OPT_NUMBER,
    OPT_TIME,
    ORDER_ID,
    STATES,
    TIME,
    UNAUTHORIZED,
    UNAVAILABLE,
    json_response,
    problem,
)

_RECONCILE_RUN = {
    "type": "object",
    "required": ["instance", "startedAt", "finishedAt", "orders", "queries", "unknown"],
    "properties": {
        "instance": {"type": "string"},
        "startedAt": TIME,
        "finishedAt": TIME,
        "orders": INT,
        "queries": INT,
        "unknown": INT,
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

OPS_SNAPSHOT = {
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
        "at": TIME,
        "countCap": INT,
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
                            "state": {"enum": STATES},
                            "count": INT,
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
                            "failureCount": INT,
                            "step": {"type": "string"},
                            "lastError": {"type": ["string", "null"]},
                            "updatedAt": TIME,
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
                    "inFlight": INT,
                    "capacity": INT,
                    "calls": INT,
                    "heartbeatAt": TIME,
                    "openUntil": {"type": ["string", "null"], "format": "date-time"},
                    "maxConcurrent": OPT_INT,
                    "callsPerSecond": OPT_NUMBER,
                    "rate": {"type": "number", "description": "calls per second lately"},
                    "throttled": INT,
                    "last429": OPT_TIME,
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
        "maxConcurrent": OPT_INT,
        "callsPerSecond": OPT_NUMBER,
        "rate": {"type": "number", "minimum": 0},
        "throttled": INT,
        "last429": OPT_TIME,
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
                "inFlight": INT,
                "capacity": INT,
                "lastHeartbeat": TIME,
                "instances": INT,
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
                    "count": INT,
                    "firstAt": TIME,
                    "lastAt": TIME,
                    "sampleOrderIds": {"type": "array", "items": {"type": "string"}},
                },
            },
        },
        "scanned": INT,
        "scanCap": INT,
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


def fleet_paths() -> dict[str, Any]:
    """Operating the fleet: agents (drain) and the Error orders grouped by failure."""
    admin: list[dict[str, list[str]]] = [{"adminKey": []}]
    return {
        f"/{Route.AGENTS}": {
            "get": {
                "operationId": "listAgents",
                "summary": "Each agent with its queue, health and drain flag",
                "security": admin,
                "responses": {
                    "200": json_response(
                        "the agents",
                        {
                            "type": "object",
                            "properties": {"agents": {"type": "array", "items": _AGENT}},
                        },
                    ),
                    **UNAUTHORIZED,
                    **UNAVAILABLE,
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
                    "200": json_response("the agent as stored now", _AGENT),
                    "400": problem("invalid body"),
                    "404": problem("unknown agent"),
                    "413": problem("body too large"),
                    "415": problem("a body that is not JSON"),
                    **UNAUTHORIZED,
                    **CROSS_ORIGIN,
                    **UNAVAILABLE,
                },
            }
        },
        f"/{Route.ORDER_EVENT}": {
            "post": {
                "operationId": "sendEvent",
                "summary": "An event for the order's waiting step: kept until its step takes it",
                "security": [{"functionKey": []}],
                "parameters": [
                    ORDER_ID,
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
                    "202": json_response(
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
                    "400": problem(
                        "invalid body, or an event the order's workflow never waits for"
                    ),
                    "401": problem(
                        "no valid key, or a signature missing, not for this order, event "
                        "and body, or outside its window"
                    ),
                    "404": problem("unknown order"),
                    "409": problem("the order is final (archived too: code archived)"),
                    "413": problem("body or data too large"),
                    "415": problem("a body that is not JSON"),
                    **CROSS_ORIGIN,
                    **UNAVAILABLE,
                },
            }
        },
        f"/{Route.ORDER_APPROVAL}": {
            "post": {
                "operationId": "answerApproval",
                "summary": "An operator answers the order's approval, recorded by x-operator",
                "security": admin,
                "parameters": [ORDER_ID],
                "requestBody": {
                    "required": True,
                    "content": {"application/json": {"schema": _APPROVAL_BODY}},
                },
                "responses": {
                    "202": json_response(
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
                    "400": problem("invalid body, or an event no approval step waits for"),
                    "404": problem("unknown order"),
                    "409": problem(
                        "the order is final, keeps 50 events, or (no event named) is not "
                        "at an approval"
                    ),
                    "413": problem("body too large"),
                    "415": problem("a body that is not JSON"),
                    **UNAUTHORIZED,
                    **CROSS_ORIGIN,
                    **UNAVAILABLE,
                },
            }
        },
        f"/{Route.WORKFLOWS}": {
            "get": {
                "operationId": "listWorkflows",
                "summary": "The catalogue's workflows, every kept version, with their steps",
                "security": admin,
                "responses": {
                    "200": json_response(
                        "the workflows",
                        {
                            "type": "object",
                            "required": ["workflows"],
                            "properties": {"workflows": {"type": "array", "items": _WORKFLOW}},
                        },
                    ),
                    **UNAUTHORIZED,
                },
            }
        },
        f"/{Route.RECONCILE}": {
            "post": {
                "operationId": "reconcile",
                "summary": "Check a sample of finished and held orders against the services now",
                "security": admin,
                "responses": {
                    "200": json_response("the run, with its mismatches", _RECONCILE_RUN),
                    **UNAUTHORIZED,
                    **CROSS_ORIGIN,
                    **UNAVAILABLE,
                },
            }
        },
        f"/{Route.FAILURES}": {
            "get": {
                "operationId": "listFailures",
                "summary": "The Error orders grouped by step and error code, largest first",
                "security": admin,
                "responses": {
                    "200": json_response("the groups", _FAILURES),
                    **UNAUTHORIZED,
                    **UNAVAILABLE,
                },
            }
        },
    }
