"""The Error orders grouped by failure (step and error code), for an operator deciding
what to resubmit: GET /failures. The agents are fleet.py."""

from __future__ import annotations

from typing import Any

import azure.functions as func

from shared.contract import Route
from shared.domain.messages import iso
from shared.domain.principal import Role
from shared.functions import composition
from shared.functions.http import json_response, problem
from shared.functions.signin import route_level
from shared.ports import StateStoreError
from shared.usecases.operations.failures import SCAN_CAP, FailureReport, group_failures

bp = func.Blueprint()
_UNAVAILABLE = ("Try again", "the state store is unavailable")
_RETRY = {"Retry-After": "5"}


@bp.route(route=Route.FAILURES, methods=["GET"], auth_level=route_level())
async def failures_http(req: func.HttpRequest) -> func.HttpResponse:
    h = await composition.failures()
    actor = await h.gate.admit(req, Role.READ)
    if isinstance(actor, func.HttpResponse):
        return actor
    try:
        report = await group_failures(h.store)
    except StateStoreError:
        return problem(503, *_UNAVAILABLE, _RETRY)
    return json_response(failures_view(report))


def failures_view(report: FailureReport) -> dict[str, Any]:
    return {
        "groups": [
            {
                "step": g.step,
                "errorCode": g.error_code,
                "count": g.count,
                "firstAt": iso(g.first_at),
                "lastAt": iso(g.last_at),
                "sampleOrderIds": list(g.sample_order_ids),
            }
            for g in report.groups
        ],
        "scanned": report.scanned,
        "scanCap": SCAN_CAP,
        "truncated": report.truncated,
    }
