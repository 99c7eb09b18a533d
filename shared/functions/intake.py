"""Order intake: HTTP POST /api/orders and the `orders` queue run the same submission."""

from __future__ import annotations

from dataclasses import replace

import azure.functions as func
from pydantic import ValidationError

from shared.contract import Queue, Route, Setting
from shared.domain.messages import InvalidMessage, OrderSubmission, describe
from shared.domain.model import Order
from shared.domain.workflow import Catalogue, Workflow
from shared.functions import composition
from shared.functions.http import base_url, json_response, problem, read_json
from shared.functions.poison import CONFLICT, OVER_QUOTA
from shared.ports import StateStoreError
from shared.telemetry.logsafe import app_logger
from shared.telemetry.propagation import current_traceparent
from shared.telemetry.spans import annotate, consuming, serving
from shared.usecases.flow.deps import ProcessDeps
from shared.usecases.flow.submission import OrderConflict, OverQuota, submit_order
from shared.usecases.limits.budget import HTTP_BUDGET

bp = func.Blueprint()
log = app_logger("orders.intake")
STORE_SLOW = (
    "the state store did not answer in time (busy or unavailable); the order may be stored: "
    "send the same body again after Retry-After"
)


def _check_reply_to(order: OrderSubmission, allowed: frozenset[str]) -> None:
    """InvalidMessage when the order asks for replies on a queue not allowed."""
    if order.reply_to is not None and order.reply_to not in allowed:
        raise InvalidMessage(
            f"replyTo {order.reply_to!r} is not on the allow-list ({Setting.REPLY_TO_ALLOW_LIST})"
        )


def _workflow(known: Catalogue, order: OrderSubmission) -> Workflow:
    """The newest version of the named workflow; InvalidMessage when there is none (a 400,
    or a dead letter: no retry adds it to the catalogue)."""
    name = order.workflow or known.default
    found = known.get(name)
    if found is None:
        names = ", ".join(known.names)
        raise InvalidMessage(f"workflow {name[:40]!r} is not in the catalogue; workflows: {names}")
    return found


def _traced(submission: OrderSubmission, process: ProcessDeps) -> Order:
    """The order with the trace it was accepted in, its root from now on."""
    order = submission.to_order(process.clock.now())
    annotate(order_id=order.order_id)
    return replace(order, trace_parent=current_traceparent())


@bp.route(route=Route.ORDERS, methods=["POST"], auth_level=func.AuthLevel.FUNCTION)
async def submit_order_http(req: func.HttpRequest, context: func.Context) -> func.HttpResponse:
    """The order's trace starts here (or continues the caller's `traceparent`)."""
    with serving(req, context):
        return await _submit_http(req)


async def _submit_http(req: func.HttpRequest) -> func.HttpResponse:
    body, failure = read_json(req)
    if failure is not None:
        return failure
    try:
        submission = OrderSubmission.model_validate(body)
    except ValidationError as exc:
        return problem(400, "Invalid order", describe(exc))
    h = await composition.intake()
    try:
        _check_reply_to(submission, h.reply_to_allow_list)
        workflow = _workflow(h.catalogue, submission)
    except InvalidMessage as exc:
        return problem(400, "Invalid order", str(exc))
    try:
        result = await submit_order(
            h.process, _traced(submission, h.process), workflow=workflow, budget=HTTP_BUDGET
        )
    except OrderConflict as exc:
        return problem(409, "Order exists", str(exc))
    except OverQuota as exc:
        return problem(429, "Too many open orders", str(exc), {"Retry-After": str(exc.retry_after)})
    except StateStoreError as exc:
        log.warning("state store unavailable during intake: %s", type(exc).__name__)
        return problem(503, "Try again", STORE_SLOW, {"Retry-After": "5"})
    order_id = result.order_id
    status_url = f"{base_url(req)}/api/orders/{order_id}"
    return json_response(
        {
            "orderId": order_id,
            "processState": result.process_state.value,
            "statusUrl": status_url,
        },
        status=202,
        headers={"Location": status_url},
    )


@bp.service_bus_queue_trigger(
    arg_name="msg", queue_name=Queue.ORDERS, connection=Setting.SERVICE_BUS
)
async def submit_order_message(msg: func.ServiceBusMessage, context: func.Context) -> None:
    with consuming(msg, context, Queue.ORDERS):
        await _submit_message(msg)


async def _submit_message(msg: func.ServiceBusMessage) -> None:
    h = await composition.intake()
    try:
        submission = OrderSubmission.parse(msg.get_body())
        _check_reply_to(submission, h.reply_to_allow_list)
        workflow = _workflow(h.catalogue, submission)
        if submission.order_id is None:
            # A queue message may be redelivered: without an id it could become two orders.
            raise InvalidMessage("orderId: required for orders sent as messages")
        await submit_order(
            h.process,
            _traced(submission, h.process),
            cause=msg.message_id,
            workflow=workflow,
            tolerate_bus_failure=False,
        )
    except InvalidMessage as exc:
        await h.dead_letters.reject(Queue.ORDERS, msg, str(exc))
    except OrderConflict as exc:
        await h.dead_letters.reject(Queue.ORDERS, msg, str(exc), CONFLICT)
    except OverQuota as exc:
        # Redelivery would meet the same count within seconds and dead-letter it anyway
        # after the queue's delivery count, with no reason given; deferring it would make
        # the queue an unbounded backlog the quota exists to refuse. So at once, saying
        # why: the sender resends it (from the dead letters) once the customer has room.
        await h.dead_letters.reject(Queue.ORDERS, msg, str(exc), OVER_QUOTA)
