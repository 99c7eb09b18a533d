"""Scheduler glue: work nudges on `scheduler`, agent answers on `agent-replies`."""

from __future__ import annotations

import azure.functions as func

from shared import bootstrap
from shared.contract import Queue, Setting
from shared.functions.messages import UNKNOWN_ORDER, UNKNOWN_STEP, reject
from shared.usecases import scheduler
from shared.wire import AgentReplyIn, InvalidMessage, NudgeIn, parse

bp = func.Blueprint()


@bp.service_bus_queue_trigger(
    arg_name="msg", queue_name=Queue.SCHEDULER, connection=Setting.SERVICE_BUS
)
async def scheduler_nudge(msg: func.ServiceBusMessage) -> None:
    c = await bootstrap.container()
    try:
        nudge = parse(NudgeIn, msg.get_body())
    except InvalidMessage as exc:
        await reject(c, Queue.SCHEDULER, msg, str(exc))
        return
    handled = await scheduler.on_nudge(c.process, nudge.order_id, msg.message_id)
    if handled is scheduler.Handled.UNKNOWN_ORDER:
        await reject(c, Queue.SCHEDULER, msg, f"no order {nudge.order_id!r}", UNKNOWN_ORDER)


@bp.service_bus_queue_trigger(
    arg_name="msg", queue_name=Queue.AGENT_REPLIES, connection=Setting.SERVICE_BUS
)
async def scheduler_reply(msg: func.ServiceBusMessage) -> None:
    c = await bootstrap.container()
    try:
        reply = parse(AgentReplyIn, msg.get_body())
    except InvalidMessage as exc:
        await reject(c, Queue.AGENT_REPLIES, msg, str(exc))
        return
    handled = await scheduler.on_reply(c.process, reply.to_reply(), msg.message_id)
    if handled is scheduler.Handled.UNKNOWN_ORDER:
        await reject(c, Queue.AGENT_REPLIES, msg, f"no order {reply.order_id!r}", UNKNOWN_ORDER)
    elif handled is scheduler.Handled.UNKNOWN_STEP:
        detail = f"order {reply.order_id!r} has no step {reply.step!r}"
        await reject(c, Queue.AGENT_REPLIES, msg, detail, UNKNOWN_STEP)
