"""Agent glue: one queue trigger per remote service, each calling the same use case."""

from __future__ import annotations

import azure.functions as func

from shared import bootstrap
from shared.contract import Setting
from shared.domain.workflow import AGENTS, AgentName
from shared.functions.messages import reject
from shared.usecases.agent import StepRequest, UnknownStep, perform_step
from shared.wire import AgentRequestIn, InvalidMessage, parse

bp = func.Blueprint()


async def _perform(agent: AgentName, msg: func.ServiceBusMessage) -> None:
    c = await bootstrap.container()
    queue = AGENTS[agent].queue
    try:
        request = parse(AgentRequestIn, msg.get_body())
        await perform_step(
            c.agent(agent),
            StepRequest(
                order_id=request.order_id,
                step=request.step,
                action=request.action,
                attempt=request.attempt,
                complete_by=request.deadline(),
                idempotency_key=request.idempotency_key,
                payload=request.payload,
            ),
        )
    except (InvalidMessage, UnknownStep) as exc:
        await reject(c, queue, msg, str(exc))


@bp.service_bus_queue_trigger(
    arg_name="msg", queue_name=AGENTS[AgentName.INVENTORY].queue, connection=Setting.SERVICE_BUS
)
async def inventory_agent(msg: func.ServiceBusMessage) -> None:
    await _perform(AgentName.INVENTORY, msg)


@bp.service_bus_queue_trigger(
    arg_name="msg", queue_name=AGENTS[AgentName.PAYMENT].queue, connection=Setting.SERVICE_BUS
)
async def payment_agent(msg: func.ServiceBusMessage) -> None:
    await _perform(AgentName.PAYMENT, msg)


@bp.service_bus_queue_trigger(
    arg_name="msg", queue_name=AGENTS[AgentName.SHIPPING].queue, connection=Setting.SERVICE_BUS
)
async def shipping_agent(msg: func.ServiceBusMessage) -> None:
    await _perform(AgentName.SHIPPING, msg)
