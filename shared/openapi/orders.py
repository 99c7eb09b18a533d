"""The order's own routes: submit, read, resubmit, cancel, suspend, resume."""

from __future__ import annotations

from typing import Any

from shared.contract import Route
from shared.openapi.parts import (
    CONTINUATION,
    CROSS_ORIGIN,
    ORDER_ID,
    STATE,
    STATES,
    STEP,
    TIME,
    UNAUTHORIZED,
    UNAVAILABLE,
    json_response,
    operator_action,
    problem,
)


def order_paths() -> dict[str, Any]:
    """The order's own routes: submit, read, and the operator's actions on one order."""
    accepted = {
        "type": "object",
        "properties": {
            "orderId": {"type": "string"},
            "processState": {"enum": STATES},
            "statusUrl": {"type": "string", "format": "uri"},
        },
    }
    return {
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
                    "202": json_response(
                        "accepted; the same body again gives the same answer", accepted
                    ),
                    "400": problem("invalid order"),
                    "409": problem(
                        "the order id is taken by another body (an archived order's too)"
                    ),
                    "413": problem("body too large"),
                    "415": problem("not JSON"),
                    "429": {
                        **problem(
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
                    **UNAUTHORIZED,
                    **CROSS_ORIGIN,
                    **UNAVAILABLE,
                },
            },
            "get": {
                "operationId": "listOrders",
                "security": [{"adminKey": []}],
                "parameters": [
                    {"name": "state", "in": "query", "schema": {"enum": STATES}},
                    {
                        "name": "pageSize",
                        "in": "query",
                        "schema": {"type": "integer", "minimum": 1, "maximum": 1000},
                    },
                    CONTINUATION,
                ],
                "responses": {
                    "200": json_response(
                        "a page of orders",
                        {
                            "type": "object",
                            "properties": {
                                "items": {"type": "array", "items": STATE},
                                "continuation": {"type": ["string", "null"]},
                            },
                        },
                    ),
                    "400": problem("bad state, pageSize or continuation"),
                    **UNAUTHORIZED,
                    **UNAVAILABLE,
                },
            },
        },
        f"/{Route.ORDER}": {
            "get": {
                "operationId": "getOrder",
                "security": [{"functionKey": []}],
                "parameters": [ORDER_ID],
                "responses": {
                    "200": json_response(
                        "state, steps and history",
                        {
                            "allOf": [
                                STATE,
                                {
                                    "type": "object",
                                    "properties": {
                                        "steps": {"type": "array", "items": STEP},
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
                                            **TIME,
                                            "description": "only when archived",
                                        },
                                    },
                                },
                            ]
                        },
                    ),
                    "404": problem("unknown order"),
                    **UNAUTHORIZED,
                    **UNAVAILABLE,
                },
            }
        },
        f"/{Route.RESUBMIT}": {
            "post": {
                "operationId": "resubmitOrder",
                "security": [{"adminKey": []}],
                "parameters": [ORDER_ID],
                "responses": {
                    "202": json_response("back to Pending at the failed step", STATE),
                    "404": problem("unknown order"),
                    "409": problem("the order is not in Error, or archived (code archived)"),
                    **UNAUTHORIZED,
                    **CROSS_ORIGIN,
                    **UNAVAILABLE,
                },
            }
        },
        f"/{Route.CANCEL}": operator_action(
            "cancelOrder",
            "Stop the order, undo every step that may have taken effect, end Cancelled",
            "the order is Processed, Compensated or Cancelled",
            body=True,
        ),
        f"/{Route.SUSPEND}": operator_action(
            "suspendOrder",
            "Dispatch nothing further and stop the deadlines",
            "the order is Processed, Compensated, Cancelled or Error",
        ),
        f"/{Route.RESUME}": operator_action(
            "resumeOrder",
            "Continue a Suspended order where it stopped, with fresh deadlines",
            "the order is not Suspended",
        ),
    }
