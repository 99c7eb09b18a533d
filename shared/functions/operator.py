"""One order at a time: inspect, list, resubmit, cancel, suspend, resume, health (the
agents are fleet.py, the Error orders by failure failures.py, the operator page and its
snapshot operator_page.py)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import azure.functions as func

from shared.contract import Route
from shared.domain.machine.operator import PastPivot
from shared.domain.machine.transition import InvalidTransition
from shared.domain.model import OrderProcess, ProcessState
from shared.domain.principal import Role
from shared.functions import composition
from shared.functions.archive import archived_view, missing_order
from shared.functions.composition import Orders
from shared.functions.http import (
    ORDER_ID,
    bounded_int,
    json_response,
    order_not_found,
    order_view,
    problem,
    read_json,
    state_view,
)
from shared.functions.signin import route_level
from shared.openapi import document
from shared.ports import StateStoreError
from shared.telemetry.spans import serving
from shared.usecases.flow.deps import ProcessDeps
from shared.usecases.history.archive import archived_order
from shared.usecases.limits.budget import HTTP_BUDGET
from shared.usecases.operations.operator import (
    OrderNotFound,
    cancel_order,
    inspect_order,
    list_orders,
    resubmit_order,
    resume_order,
    suspend_order,
)

bp = func.Blueprint()
_UNAVAILABLE = ("Try again", "the state store is unavailable")
MAX_REASON = 500


@bp.route(route=Route.ORDER, methods=["GET"], auth_level=func.AuthLevel.FUNCTION)
async def get_order(req: func.HttpRequest) -> func.HttpResponse:
    return await _order(await composition.orders(), req)


@bp.route(route=Route.OPS_ORDER, methods=["GET"], auth_level=route_level())
async def ops_order(req: func.HttpRequest) -> func.HttpResponse:
    """The operator page's view of one order: the same answer, to a signed-in reader."""
    h = await composition.orders()
    actor = await h.gate.admit(req, Role.READ)
    if isinstance(actor, func.HttpResponse):
        return actor
    return await _order(h, req)


async def _order(h: Orders, req: func.HttpRequest) -> func.HttpResponse:
    order_id = req.route_params.get("orderId", "")
    if not ORDER_ID.match(order_id):
        return order_not_found(order_id)
    try:
        process = await inspect_order(h.process, order_id)
    except OrderNotFound:
        return await _from_archive(h, order_id)
    except StateStoreError:
        return problem(503, *_UNAVAILABLE, {"Retry-After": "5"})
    return json_response({**order_view(process, h.catalogue), "archived": False})


async def _from_archive(h: Orders, order_id: str) -> func.HttpResponse:
    """Not in the table: archived, or unknown."""
    if h.archive is None or h.archive_blobs is None:
        return order_not_found(order_id)
    try:
        found = await archived_order(h.archive, h.archive_blobs, order_id)
    except StateStoreError:
        return problem(503, *_UNAVAILABLE, {"Retry-After": "5"})
    if found is None:
        return order_not_found(order_id)
    return json_response(archived_view(found, h.catalogue))


@bp.route(route=Route.ORDERS, methods=["GET"], auth_level=route_level())
async def list_orders_http(req: func.HttpRequest) -> func.HttpResponse:
    h = await composition.orders()
    actor = await h.gate.admit(req, Role.READ)
    if isinstance(actor, func.HttpResponse):
        return actor
    raw_state = req.params.get("state")
    state: ProcessState | None = None
    if raw_state:
        try:
            state = ProcessState(raw_state)
        except ValueError:
            allowed = ", ".join(s.value for s in ProcessState)
            return problem(400, "Invalid state", f"state must be one of {allowed}")
    page_size = bounded_int(req, "pageSize", 100, 1, 1000)
    if isinstance(page_size, func.HttpResponse):
        return page_size
    try:
        page = await list_orders(h.process, state, page_size, req.params.get("continuation"))
    except ValueError as exc:
        return problem(400, "Invalid continuation", str(exc))
    except StateStoreError:
        return problem(503, *_UNAVAILABLE, {"Retry-After": "5"})
    return json_response(
        {"items": [state_view(s) for s in page.items], "continuation": page.continuation}
    )


@bp.route(route=Route.RESUBMIT, methods=["POST"], auth_level=route_level())
async def resubmit_order_http(req: func.HttpRequest, context: func.Context) -> func.HttpResponse:
    return await _operator_action(
        req, context, "Not in Error", lambda d, o, op: resubmit_order(d, o, op, budget=HTTP_BUDGET)
    )


@bp.route(route=Route.CANCEL, methods=["POST"], auth_level=route_level())
async def cancel_order_http(req: func.HttpRequest, context: func.Context) -> func.HttpResponse:
    reason = _cancel_reason(req)
    if isinstance(reason, func.HttpResponse):
        return reason
    return await _operator_action(
        req,
        context,
        "Already final",
        lambda deps, order_id, operator: cancel_order(
            deps, order_id, operator, reason, budget=HTTP_BUDGET
        ),
    )


@bp.route(route=Route.SUSPEND, methods=["POST"], auth_level=route_level())
async def suspend_order_http(req: func.HttpRequest, context: func.Context) -> func.HttpResponse:
    return await _operator_action(
        req, context, "Cannot suspend", lambda d, o, op: suspend_order(d, o, op, budget=HTTP_BUDGET)
    )


@bp.route(route=Route.RESUME, methods=["POST"], auth_level=route_level())
async def resume_order_http(req: func.HttpRequest, context: func.Context) -> func.HttpResponse:
    return await _operator_action(
        req, context, "Not Suspended", lambda d, o, op: resume_order(d, o, op, budget=HTTP_BUDGET)
    )


def _cancel_reason(req: func.HttpRequest) -> str | func.HttpResponse | None:
    """The optional body `{"reason"?: str}`; no body at all is a cancel without a reason."""
    if not (req.get_body() or b"").strip():
        return None
    data, error = read_json(req)
    if error is not None:
        return error
    if not isinstance(data, dict) or set(data) - {"reason"}:
        return problem(400, "Invalid body", 'the body is {"reason"?: string}, nothing else')
    reason: Any = data.get("reason")
    if reason is not None and (not isinstance(reason, str) or len(reason) > MAX_REASON):
        return problem(400, "Invalid reason", f"reason is a string of at most {MAX_REASON}")
    return reason or None


async def _operator_action(
    req: func.HttpRequest,
    context: func.Context,
    refusal: str,
    act: Callable[[ProcessDeps, str, str], Awaitable[OrderProcess]],
) -> func.HttpResponse:
    """The answer every operator action shares: 202 with the state, 404, 409, 503. The
    request is a trace of its own; the messages it sends rejoin the order's."""
    with serving(req, context):
        return await _act(req, refusal, act)


async def _act(
    req: func.HttpRequest,
    refusal: str,
    act: Callable[[ProcessDeps, str, str], Awaitable[OrderProcess]],
) -> func.HttpResponse:
    h = await composition.orders()
    actor = await h.gate.admit(req, Role.OPERATE)
    if isinstance(actor, func.HttpResponse):
        return actor
    order_id = req.route_params.get("orderId", "")
    if not ORDER_ID.match(order_id):
        return order_not_found(order_id)
    try:
        process = await act(h.process, order_id, actor.recorded)
    except OrderNotFound:
        return await missing_order(h.archive, order_id)
    except PastPivot as exc:
        return problem(409, "Past the pivot", str(exc), code=PastPivot.code)
    except InvalidTransition as exc:
        return problem(409, refusal, str(exc), code=exc.code)
    except StateStoreError:
        return problem(503, *_UNAVAILABLE, {"Retry-After": "5"})
    return json_response(state_view(process.state), status=202)


@bp.route(route=Route.HEALTH, methods=["GET"], auth_level=func.AuthLevel.ANONYMOUS)
async def health(req: func.HttpRequest) -> func.HttpResponse:
    checks = await (await composition.health()).report()
    healthy = all(v == "ok" for v in checks.values())
    return json_response(
        {"status": "ok" if healthy else "degraded", "checks": checks},
        status=200 if healthy else 503,
    )


@bp.route(route=Route.OPENAPI, methods=["GET"], auth_level=func.AuthLevel.ANONYMOUS)
async def openapi(req: func.HttpRequest) -> func.HttpResponse:
    return json_response(document())
