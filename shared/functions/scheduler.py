"""Scheduler glue: work nudges on `scheduler`, agent answers on `agent-replies`, and the
same two for high-priority orders on their own lanes (`scheduler-high`,
`agent-replies-high`), so their claims and replies never wait behind a normal backlog."""

from __future__ import annotations

import azure.functions as func

from shared.contract import Queue, Setting
from shared.domain.messages import AgentReply, InvalidMessage, Nudge
from shared.functions import composition
from shared.functions.poison import UNKNOWN_ORDER, UNKNOWN_STEP
from shared.telemetry.spans import annotate, consuming
from shared.usecases.flow import scheduler

bp = func.Blueprint()


async def _nudge(queue: str, msg: func.ServiceBusMessage) -> None:
    h = await composition.scheduling()
    try:
        nudge = Nudge.parse(msg.get_body())
    except InvalidMessage as exc:
        await h.dead_letters.reject(queue, msg, str(exc))
        return
    annotate(order_id=nudge.order_id)
    handled = await scheduler.on_nudge(h.process, nudge.order_id, msg.message_id)
    if handled is scheduler.Handled.UNKNOWN_ORDER:
        await h.dead_letters.reject(queue, msg, f"no order {nudge.order_id!r}", UNKNOWN_ORDER)


async def _reply(queue: str, msg: func.ServiceBusMessage) -> None:
    h = await composition.scheduling()
    try:
        reply = AgentReply.parse(msg.get_body())
    except InvalidMessage as exc:
        await h.dead_letters.reject(queue, msg, str(exc))
        return
    annotate(order_id=reply.order_id, step=reply.step, attempt=reply.attempt)
    handled = await scheduler.on_reply(h.process, reply, msg.message_id)
    if handled is scheduler.Handled.UNKNOWN_ORDER:
        await h.dead_letters.reject(queue, msg, f"no order {reply.order_id!r}", UNKNOWN_ORDER)
    elif handled is scheduler.Handled.UNKNOWN_STEP:
        detail = f"order {reply.order_id!r} has no step {reply.step!r}"
        await h.dead_letters.reject(queue, msg, detail, UNKNOWN_STEP)


@bp.service_bus_queue_trigger(
    arg_name="msg", queue_name=Queue.SCHEDULER, connection=Setting.SERVICE_BUS
)
async def scheduler_nudge(msg: func.ServiceBusMessage, context: func.Context) -> None:
    with consuming(msg, context, Queue.SCHEDULER):
        await _nudge(Queue.SCHEDULER, msg)


@bp.service_bus_queue_trigger(
    arg_name="msg", queue_name=Queue.SCHEDULER_HIGH, connection=Setting.SERVICE_BUS
)
async def scheduler_nudge_high(msg: func.ServiceBusMessage, context: func.Context) -> None:
    with consuming(msg, context, Queue.SCHEDULER_HIGH):
        await _nudge(Queue.SCHEDULER_HIGH, msg)


@bp.service_bus_queue_trigger(
    arg_name="msg", queue_name=Queue.AGENT_REPLIES, connection=Setting.SERVICE_BUS
)
async def scheduler_reply(msg: func.ServiceBusMessage, context: func.Context) -> None:
    with consuming(msg, context, Queue.AGENT_REPLIES):
        await _reply(Queue.AGENT_REPLIES, msg)


@bp.service_bus_queue_trigger(
    arg_name="msg", queue_name=Queue.AGENT_REPLIES_HIGH, connection=Setting.SERVICE_BUS
)
async def scheduler_reply_high(msg: func.ServiceBusMessage, context: func.Context) -> None:
    with consuming(msg, context, Queue.AGENT_REPLIES_HIGH):
        await _reply(Queue.AGENT_REPLIES_HIGH, msg)
