"""Reconciliation glue: a timer on the app setting ReconcileSchedule (NCRONTAB), and
`POST /api/reconcile` (admin) to run it now, so an operator need not wait for the timer.

Both run the same bounded check (shared/usecases/operations/reconcile.py). A run that overlaps
another (the endpoint during a timer run, two local runtimes) checks its own random
sample; an order and key found by both is alerted once (the alert's message id), so
neither needs a lock.
"""

from __future__ import annotations

from typing import Any

import azure.functions as func

from shared.contract import Route, Setting
from shared.domain.messages import iso
from shared.domain.principal import Role
from shared.domain.reconcile import ReconcileRun
from shared.functions import composition
from shared.functions.http import json_response, problem
from shared.functions.signin import route_level
from shared.ports import StateStoreError
from shared.telemetry.spans import serving, timed

bp = func.Blueprint()


@bp.timer_trigger(
    arg_name="timer", schedule=f"%{Setting.RECONCILE_SCHEDULE}%", run_on_startup=False
)
async def reconcile(timer: func.TimerRequest, context: func.Context) -> None:
    with timed(context):
        found = (await composition.reconciling()).reconciler
        if found is not None:
            await found.run()


@bp.route(route=Route.RECONCILE, methods=["POST"], auth_level=route_level())
async def reconcile_http(req: func.HttpRequest, context: func.Context) -> func.HttpResponse:
    h = await composition.reconciling()
    actor = await h.gate.admit(req, Role.OPERATE)
    if isinstance(actor, func.HttpResponse):
        return actor
    with serving(req, context):
        found = h.reconciler
        if found is None:
            return problem(503, "Try again", "reconciliation needs the state store")
        try:
            run = await found.run()
        except StateStoreError:
            return problem(503, "Try again", "the state store is unavailable", {"Retry-After": "5"})
        return json_response(run_view(run))


def run_view(run: ReconcileRun) -> dict[str, Any]:
    """A run as the operator page and `POST /api/reconcile` show it."""
    return {
        "instance": run.instance,
        "startedAt": iso(run.started_at),
        "finishedAt": iso(run.finished_at),
        "orders": run.orders,
        "queries": run.queries,
        "unknown": run.unknown,
        "mismatches": [
            {
                "orderId": m.order_id,
                "state": m.state.value,
                "step": m.step,
                "agent": m.agent,
                "key": m.key,
                "expected": m.expected,
                "found": m.found,
                "reason": m.reason,
                "message": m.message,
            }
            for m in run.mismatches
        ],
    }
