"""What an operator reads: the health check, the status page and its data."""

from __future__ import annotations

from typing import Any

from shared.contract import Route
from shared.openapi.fleet import OPS_SNAPSHOT
from shared.openapi.parts import ORDER_ID, UNAUTHORIZED, UNAVAILABLE, json_response, problem


def page_paths() -> dict[str, Any]:
    """What an operator reads: the health check, the status page and its data."""
    return {
        f"/{Route.HEALTH}": {
            "get": {
                "operationId": "health",
                "responses": {
                    "200": json_response("the state store and the bus answer", {"type": "object"}),
                    "503": json_response("a dependency does not answer", {"type": "object"}),
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
                    **UNAUTHORIZED,
                },
            }
        },
        f"/{Route.OPS_ORDER}": {
            "get": {
                "operationId": "opsOrder",
                "summary": "One order as getOrder answers it, for the operator page",
                "security": [{"adminKey": []}],
                "parameters": [ORDER_ID],
                "responses": {
                    "200": json_response("as getOrder", {"type": "object"}),
                    "404": problem("unknown order"),
                    **UNAUTHORIZED,
                    **UNAVAILABLE,
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
                    "200": json_response("the snapshot", OPS_SNAPSHOT),
                    "400": problem("bad countCap"),
                    **UNAUTHORIZED,
                },
            }
        },
    }
