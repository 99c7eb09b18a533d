"""Agent glue: per agent, a trigger on its queue and one on its high-priority lane.

The lanes are separate functions so high-priority requests never wait behind a normal
backlog: each has its own concurrency locally and scales on its own in Flex
Consumption (per-function scaling), and both share the agent's breaker and health.
"""

from __future__ import annotations

import time

import azure.functions as func

from shared import bootstrap
from shared.contract import Queue, Setting, high_priority
from shared.domain.messages import AgentRequest, InvalidMessage
from shared.domain.workflow import AGENTS, AgentName
from shared.functions.poison import UNKNOWN_STEP, reject
from shared.telemetry.metrics import step_done
from shared.telemetry.spans import annotate, consuming
from shared.usecases.agent import UnknownStep, perform_step
from shared.usecases.agent_health import heartbeat

bp = func.Blueprint()

HEARTBEAT_SCHEDULE = "*/5 * * * * *"
"""Every 5 s: well inside routing's 60 s staleness limit, a write per agent per beat."""


async def _perform(
    agent: AgentName, msg: func.ServiceBusMessage, context: func.Context, high: bool = False
) -> None:
    """One step for `agent`; a request it can never perform is dead-lettered from the
    lane the Scheduler sends it on, which is the lane the calling trigger listens to."""
    queue = AGENTS[agent].queue_for(high)
    with consuming(msg, context, queue):
        await _perform_step(agent, msg, queue, high)


async def _perform_step(
    agent: AgentName, msg: func.ServiceBusMessage, queue: str, high: bool
) -> None:
    c = await bootstrap.container()
    try:
        request = AgentRequest.parse(msg.get_body())
        annotate(order_id=request.order_id, step=request.step, attempt=request.attempt)
        started = time.monotonic()
        outcome = await perform_step(c.agent(agent), request, high=high)
        step_done(agent.value, request.step, outcome.value, time.monotonic() - started)
    except InvalidMessage as exc:
        await reject(c, queue, msg, str(exc))
    except UnknownStep as exc:
        await reject(c, queue, msg, str(exc), UNKNOWN_STEP)


@bp.service_bus_queue_trigger(
    arg_name="msg", queue_name=Queue.AGENT_INVENTORY, connection=Setting.SERVICE_BUS
)
async def inventory_agent(msg: func.ServiceBusMessage, context: func.Context) -> None:
    await _perform(AgentName.INVENTORY, msg, context)


@bp.service_bus_queue_trigger(
    arg_name="msg", queue_name=high_priority(Queue.AGENT_INVENTORY), connection=Setting.SERVICE_BUS
)
async def inventory_agent_high(msg: func.ServiceBusMessage, context: func.Context) -> None:
    await _perform(AgentName.INVENTORY, msg, context, high=True)


@bp.service_bus_queue_trigger(
    arg_name="msg", queue_name=Queue.AGENT_PAYMENT, connection=Setting.SERVICE_BUS
)
async def payment_agent(msg: func.ServiceBusMessage, context: func.Context) -> None:
    await _perform(AgentName.PAYMENT, msg, context)


@bp.service_bus_queue_trigger(
    arg_name="msg", queue_name=high_priority(Queue.AGENT_PAYMENT), connection=Setting.SERVICE_BUS
)
async def payment_agent_high(msg: func.ServiceBusMessage, context: func.Context) -> None:
    await _perform(AgentName.PAYMENT, msg, context, high=True)


@bp.service_bus_queue_trigger(
    arg_name="msg", queue_name=Queue.AGENT_PAYMENT_SECONDARY, connection=Setting.SERVICE_BUS
)
async def payment_secondary_agent(msg: func.ServiceBusMessage, context: func.Context) -> None:
    await _perform(AgentName.PAYMENT_SECONDARY, msg, context)


@bp.service_bus_queue_trigger(
    arg_name="msg",
    queue_name=high_priority(Queue.AGENT_PAYMENT_SECONDARY),
    connection=Setting.SERVICE_BUS,
)
async def payment_secondary_agent_high(msg: func.ServiceBusMessage, context: func.Context) -> None:
    await _perform(AgentName.PAYMENT_SECONDARY, msg, context, high=True)


@bp.service_bus_queue_trigger(
    arg_name="msg", queue_name=Queue.AGENT_SHIPPING, connection=Setting.SERVICE_BUS
)
async def shipping_agent(msg: func.ServiceBusMessage, context: func.Context) -> None:
    await _perform(AgentName.SHIPPING, msg, context)


@bp.service_bus_queue_trigger(
    arg_name="msg", queue_name=high_priority(Queue.AGENT_SHIPPING), connection=Setting.SERVICE_BUS
)
async def shipping_agent_high(msg: func.ServiceBusMessage, context: func.Context) -> None:
    await _perform(AgentName.SHIPPING, msg, context, high=True)


@bp.timer_trigger(arg_name="timer", schedule=HEARTBEAT_SCHEDULE, run_on_startup=False)
async def agent_heartbeat(timer: func.TimerRequest) -> None:
    c = await bootstrap.container()
    await heartbeat([(c.monitor(name), c.remotes[name]) for name in AGENTS], c.health)
