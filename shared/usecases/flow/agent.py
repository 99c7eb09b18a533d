"""An Agent: performs one step against its remote service inside the step's complete-by."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum

from shared.domain.messages import AgentRequest, idempotency_key
from shared.domain.model import Action, ErrorInfo, JsonObject, Outcome
from shared.domain.throttle import AdaptiveRate
from shared.domain.workflow import AgentName, Catalogue
from shared.ports import (
    Clock,
    HealthStore,
    MessageBus,
    PermanentRemoteError,
    RemoteCall,
    RemoteService,
)
from shared.resilience import (
    CircuitBreaker,
    DeadlinePassed,
    Gate,
    HeldByThrottle,
    RetryPolicy,
    call_until_deadline,
)
from shared.telemetry.logsafe import app_logger
from shared.usecases.flow.agent_health import HealthMonitor
from shared.usecases.flow.rate_slot import HandBack, HandedBack, SlotGate
from shared.usecases.flow.step_heartbeat import KnownCompleteBy, StepHeartbeats
from shared.usecases.flow.step_hold import HeldCall, StepHolds
from shared.usecases.limits.limiter import AgentLimiter

log = app_logger("orders.agent")


class UnknownStep(ValueError):
    """The request names a step this agent does not perform: no retry can fix it."""


class Performed(StrEnum):
    """What the agent did with one request, for its metrics (a reply's own outcome is
    model.Outcome; a service's answer about a key is in_doubt.RemoteOutcome)."""

    SUCCEEDED = "succeeded"
    FAILED = "failed"
    EXPIRED_ON_ARRIVAL = "expired-on-arrival"
    COMPLETE_BY_PASSED = "deadline-passed"
    HELD_BY_THROTTLE = "held-by-throttle"
    """The service's `429`s held the next call back to the complete-by: no reply."""
    HANDED_BACK = "handed-back"
    """Its rate slot was far: the hold written, the request waits in the broker for it."""


@dataclass(frozen=True)
class AgentDeps:
    agent: AgentName
    bus: MessageBus
    clock: Clock
    remote: RemoteService
    breaker: CircuitBreaker
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    rng: random.Random | None = None
    monitor: HealthMonitor | None = None
    health: HealthStore | None = None
    """Where `monitor` publishes heartbeats; None: health is not published."""
    step_heartbeats: StepHeartbeats | None = None
    """Keeps a long call's step alive; None or StepMaxSeconds unset: the call stops at
    the request's complete-by."""
    throttle: AdaptiveRate | None = None
    """Slows this agent's calls after its service's `429`s; one per agent per process,
    shared by both lanes like the breaker. None: a `429` is retried like a 503, but
    still never counted against the breaker."""
    limiter: AgentLimiter | None = None
    """The agent's fleet-wide `callsPerSecond` and `maxConcurrent`; None: no limit
    declared, and no store call for it."""
    step_holds: StepHolds | None = None
    """Moves a do's or an undo's complete-by when a limit holds its call back, and lets a
    request whose rate slot is far wait for it in the broker; None: a held call keeps
    its complete-by (and past it ends held-by-throttle, no reply)."""
    catalogue: Catalogue = field(kw_only=True)
    """Every kept version's steps, which vouch for what a request may ask this agent."""


def operation_for(catalogue: Catalogue, agent: AgentName, request: AgentRequest) -> str:
    """The remote operation the request asks for. The Scheduler names it, from the
    version the order is pinned to; the catalogue (every kept version) only vouches that
    this agent performs the step and that the operation is the step itself or an undo
    some version declares for it. A request that names none (sent before requests did)
    is answered from the catalogue only when every kept version agrees on the undo."""
    definitions = catalogue.steps_named(request.step)
    if not definitions:
        raise UnknownStep(f"unknown step {request.step!r}")
    mine = [d for d in definitions if agent in d.candidates]
    if not mine:
        raise UnknownStep(f"step {request.step} is not performed by the {agent} agent")
    if request.action is not Action.COMPENSATE:
        if request.operation not in (None, request.step):
            raise UnknownStep(f"step {request.step} is not the operation {request.operation}")
        return request.step
    undos = list(dict.fromkeys(d.compensation for d in mine if d.compensation is not None))
    if request.operation is not None:
        if request.operation not in undos:
            raise UnknownStep(f"{request.operation} is not an undo of step {request.step}")
        return request.operation
    if len(undos) != 1:
        many = "no compensation" if not undos else f"several compensations ({', '.join(undos)})"
        raise UnknownStep(f"step {request.step} has {many}, and the request names none")
    return undos[0]


async def perform_step(deps: AgentDeps, request: AgentRequest, *, high: bool = False) -> Performed:
    """Reply succeeded or failed; past the complete-by reply nothing at all.

    Silence is deliberate: the Supervisor owns recovery once complete-by has passed, and a
    late answer would race with the retry it starts. A request that came on a
    high-priority lane (`high`) is answered on the Scheduler's high lane too.
    """
    operation = operation_for(deps.catalogue, deps.agent, request)
    monitor = deps.monitor
    if monitor is None:
        return await _perform(deps, request, operation, high)
    monitor.started()
    try:
        return await _perform(deps, request, operation, high)
    finally:
        monitor.finished()
        if deps.health is not None:
            await monitor.publish(deps.health)


async def _perform(deps: AgentDeps, request: AgentRequest, operation: str, high: bool) -> Performed:
    if deps.clock.now() >= request.complete_by:
        log.info(
            "order %s %s %s arrived after its complete-by; ignored",
            request.order_id,
            operation,
            f"attempt {request.attempt}",
        )
        return Performed.EXPIRED_ON_ARRIVAL
    call = RemoteCall(
        request.order_id,
        operation,
        request.idempotency_key,
        request.payload,
        undoes=undoes(request),
    )
    known = KnownCompleteBy(request.complete_by)
    beats = deps.step_heartbeats
    if beats is None or not beats.enabled or request.action is not Action.DO:
        beats = None

    async def invoke(timeout: float) -> JsonObject:
        if beats is None:
            return await deps.remote.invoke(call, timeout)
        return await beats.keep_alive(request, known, deps.remote.invoke(call, timeout))

    step_max = beats.policy.step_max if beats is not None else None
    held = deps.step_holds.for_request(request, known) if deps.step_holds is not None else None
    try:
        result = await call_until_deadline(
            invoke,
            deadline=lambda: known.at,
            clock=deps.clock,
            breaker=deps.breaker,
            policy=deps.retry,
            rng=deps.rng,
            observe=_observer(deps),
            call_limit=step_max.total_seconds() if step_max is not None else None,
            throttle=deps.throttle,
            gate=_gate(deps, request, held, high),
            held=held,
        )
    except HandedBack as exc:
        log.info(
            "order %s %s waits in the broker for %s's rate slot at %s (attempt %d), its "
            "hold written",
            request.order_id,
            operation,
            deps.agent,
            exc.start.isoformat(),
            request.attempt,
        )
        return Performed.HANDED_BACK
    except HeldByThrottle as exc:
        log.info(
            "order %s %s held by %s's limits past its complete-by (attempt %d, next "
            "call possible at %s); no reply",
            request.order_id,
            operation,
            deps.agent,
            request.attempt,
            exc.could_start_at.isoformat(),
        )
        return Performed.HELD_BY_THROTTLE
    except DeadlinePassed:
        log.info(
            "order %s %s gave up at its complete-by (attempt %d); no reply",
            request.order_id,
            operation,
            request.attempt,
        )
        return Performed.COMPLETE_BY_PASSED
    except PermanentRemoteError as exc:
        error = ErrorInfo(exc.code, exc.message)
        failed = request.answer(Outcome.FAILED, error=error, agent=deps.agent)
        await deps.bus.send([failed.outgoing(high=high)])
        log.info("order %s %s failed permanently: %s", request.order_id, operation, exc.code)
        return Performed.FAILED
    succeeded = request.answer(Outcome.SUCCEEDED, result=result, agent=deps.agent)
    await deps.bus.send([succeeded.outgoing(high=high)])
    log.info("order %s %s succeeded (attempt %d)", request.order_id, operation, request.attempt)
    return Performed.SUCCEEDED


def _gate(deps: AgentDeps, request: AgentRequest, held: HeldCall | None, high: bool) -> Gate | None:
    """The agent's limits as this request meets them; None without a limit."""
    if deps.limiter is None:
        return None
    hand_back = None
    if held is not None:
        hand_back = HandBack(deps.bus, deps.clock, deps.agent, request, held, high)
    return SlotGate.for_request(deps.limiter, request, deps.clock.now(), hand_back)


def undoes(request: AgentRequest) -> str | None:
    """The do key a compensation undoes. A request from a Scheduler older than the field
    names none: the do's key is then derived (the step's name is its do operation), so
    every undo names its do and a provider can refuse an undo with nothing to undo."""
    if request.action is not Action.COMPENSATE:
        return None
    return request.undoes or idempotency_key(request.order_id, request.step)


def _observer(deps: AgentDeps) -> Callable[[bool, float], None] | None:
    """Record each remote call; a breaker that just changed is published at once, since
    the Scheduler routes on it, without holding up the call's own retries."""
    monitor, store = deps.monitor, deps.health
    if monitor is None:
        return None

    def observe(succeeded: bool, seconds: float) -> None:
        monitor.observe(succeeded, seconds)
        if store is not None and monitor.breaker_changed():
            task = asyncio.create_task(monitor.publish(store))
            _publishing.add(task)
            task.add_done_callback(_publishing.discard)

    return observe


_publishing: set[asyncio.Task[bool]] = set()
