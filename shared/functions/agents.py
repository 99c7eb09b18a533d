"""Agent glue: per agent, a trigger on its queue and one on its high-priority lane.

The lanes are separate functions so high-priority requests never wait behind a normal
backlog: each has its own concurrency locally and scales on its own in Flex
Consumption (per-function scaling), and both share the agent's breaker and health.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import azure.functions as func

from shared import bootstrap
from shared.contract import Setting
from shared.domain.workflow import AGENTS, AgentName
from shared.functions.messages import UNKNOWN_STEP, reject
from shared.usecases.agent import StepRequest, UnknownStep, perform_step
from shared.usecases.agent_health import heartbeat
from shared.wire import AgentRequestIn, InvalidMessage, parse

bp = func.Blueprint()

HEARTBEAT_SCHEDULE = "*/5 * * * * *"
"""Every 5 s: well inside routing's 60 s staleness limit, a write per agent per beat."""


async def _perform(agent: AgentName, queue: str, msg: func.ServiceBusMessage, high: bool) -> None:
    c = await bootstrap.container()
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
                high_priority=high,
            ),
        )
    except InvalidMessage as exc:
        await reject(c, queue, msg, str(exc))
    except UnknownStep as exc:
        await reject(c, queue, msg, str(exc), UNKNOWN_STEP)


def _register(agent: AgentName, high: bool) -> None:
    queue = AGENTS[agent].queue_for(high)
    name = f"{agent.value.replace('-', '_')}_agent{'_high' if high else ''}"

    async def handle(msg: func.ServiceBusMessage) -> None:
        await _perform(agent, queue, msg, high)

    handle.__name__ = handle.__qualname__ = name
    trigger: Callable[[Callable[..., Awaitable[None]]], object] = bp.service_bus_queue_trigger(
        arg_name="msg", queue_name=queue, connection=Setting.SERVICE_BUS
    )
    trigger(bp.function_name(name)(handle))


for _agent in AGENTS:
    for _high in (False, True):
        _register(_agent, _high)


@bp.timer_trigger(arg_name="timer", schedule=HEARTBEAT_SCHEDULE, run_on_startup=False)
async def agent_heartbeat(timer: func.TimerRequest) -> None:
    c = await bootstrap.container()
    await heartbeat([(c.monitor(name), c.remotes[name]) for name in AGENTS], c.health)
