"""Agent glue: per agent, a trigger on its queue and one on its high-priority lane.

The lanes are separate functions so high-priority requests never wait behind a normal
backlog: each has its own concurrency locally and scales on its own in Flex
Consumption (per-function scaling), and both share the agent's breaker and health.
"""

from __future__ import annotations

import time

import azure.functions as func

from shared.contract import Setting, agent_queue
from shared.domain.messages import AgentRequest, InvalidMessage
from shared.domain.workflow import AgentName
from shared.functions import composition
from shared.functions.poison import UNKNOWN_STEP
from shared.telemetry.metrics import step_done
from shared.telemetry.spans import annotate, consuming
from shared.usecases.flow.agent import UnknownStep, perform_step
from shared.usecases.flow.agent_health import heartbeat

bp = func.Blueprint()


async def _perform(
    agent: AgentName, msg: func.ServiceBusMessage, context: func.Context, high: bool = False
) -> None:
    """One step for `agent`; a request it can never perform is dead-lettered from the
    lane the Scheduler sends it on, which is the lane the calling trigger listens to."""
    queue = agent_queue(agent, high)
    with consuming(msg, context, queue):
        await _perform_step(agent, msg, queue, high)


async def _perform_step(
    agent: AgentName, msg: func.ServiceBusMessage, queue: str, high: bool
) -> None:
    h = await composition.agent_work()
    try:
        request = AgentRequest.parse(msg.get_body())
        annotate(order_id=request.order_id, step=request.step, attempt=request.attempt)
        started = time.monotonic()
        outcome = await perform_step(h.deps(agent), request, high=high)
        step_done(agent, request.step, outcome.value, time.monotonic() - started)
    except InvalidMessage as exc:
        await h.dead_letters.reject(queue, msg, str(exc))
    except UnknownStep as exc:
        await h.dead_letters.reject(queue, msg, str(exc), UNKNOWN_STEP)


def function_name(agent: AgentName, high: bool = False) -> str:
    """`payment-secondary` → `payment_secondary_agent`, and `..._agent_high` for its lane."""
    return f"{agent.replace('-', '_')}_agent{'_high' if high else ''}"


def _register(agent: AgentName, high: bool) -> None:
    """One trigger per agent and lane, named explicitly: the catalogue decides how many."""

    async def trigger(msg: func.ServiceBusMessage, context: func.Context) -> None:
        await _perform(agent, msg, context, high=high)

    name = function_name(agent, high)
    trigger.__name__ = trigger.__qualname__ = name
    bp.function_name(name=name)(
        bp.service_bus_queue_trigger(
            arg_name="msg", queue_name=agent_queue(agent, high), connection=Setting.SERVICE_BUS
        )(trigger)
    )


for _agent in composition.agents():
    for _high in (False, True):
        _register(_agent, _high)


@bp.timer_trigger(
    arg_name="timer", schedule=f"%{Setting.AGENT_HEARTBEAT_SCHEDULE}%", run_on_startup=False
)
async def agent_heartbeat(timer: func.TimerRequest) -> None:
    h = await composition.agent_work()
    await heartbeat(h.watched(), h.health)
