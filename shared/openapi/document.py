"""The document: every route group, the schemas, the security schemes, and the
operators' sign-in on every master-key route."""

from __future__ import annotations

from functools import cache
from typing import Any

from shared.contract import Route
from shared.domain.messages import OrderSubmission
from shared.jsonbounds import MAX_DEPTH
from shared.openapi.archive import archive_paths
from shared.openapi.bulk import bulk_paths
from shared.openapi.fleet import fleet_paths
from shared.openapi.orders import order_paths
from shared.openapi.pages import page_paths
from shared.openapi.parts import json_response, problem

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
            responses["403"] = problem(f"{known}; or {_NO_ROLE}" if known else _NO_ROLE)


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
            **order_paths(),
            **page_paths(),
            **fleet_paths(),
            **bulk_paths(),
            **archive_paths(),
            f"/{Route.OPENAPI}": {
                "get": {
                    "operationId": "openapi",
                    "responses": {"200": json_response("this document", {"type": "object"})},
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
