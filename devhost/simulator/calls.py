"""Service calls, as the agents make them.

A call goes: validate, pass the service's quotas (``rateLimitPerSecond``,
``maxConcurrent``: past them ``429`` at once, see ``limits.py``), count the call against
its key, decide faults, maybe hang, then finish (latency, transient-before, ``slowMs`` of
work, settle the effect, transient-after), and with apply-then-hang, hang after settling
so the reply is lost.
A key still running (an earlier call registered and not settled) answers 409
``operation-in-progress`` at once: a provider neither waits nor applies twice. An
abandoned key answers 409 ``operation-abandoned`` for good. A compensation applies only
against its do applied (see ``undo.py``).
The finishing part is shielded from client disconnects: a real server that got the
request keeps going when the caller times out, and that is exactly the case that makes
idempotency keys necessary. Only hangs before the effect end early, because such a hung
call never got going. From registration until settled the key counts as in progress,
which is what outcome queries answer with 409 meanwhile.
"""

from __future__ import annotations

import asyncio
import logging
import random
from dataclasses import dataclass, replace

from aiohttp import web
from pydantic import ValidationError

from devhost.simulator.effects import KeyConflict, Outcome, OutcomeKind
from devhost.simulator.faults import (
    FaultDecision,
    FaultSettings,
    TransientPhase,
    decide,
    held_on_the_network,
)
from devhost.simulator.limits import Refusal
from devhost.simulator.problems import (
    in_progress_problem,
    limited_problem,
    problem,
    problem_body,
    problem_response,
    read_json,
    transient_problem,
    validation_detail,
)
from devhost.simulator.services import (
    REJECTED,
    CallRequest,
    Compensation,
    CompensationPayload,
    DoOperation,
    DoPayload,
    Operation,
    Service,
)
from devhost.simulator.state import STATE, SimulatorState
from devhost.simulator.undo import undo_outcome

log = logging.getLogger("devhost.simulator")

HANG_POLL_SECONDS = 0.2
"""How often a hung call looks for a vanished client when the runner does not cancel it."""
REPLAYED_HEADER = "Idempotent-Replayed"


@dataclass(frozen=True)
class Call:
    service: Service
    operation: Operation
    order_id: str
    key: str
    payload: DoPayload | CompensationPayload
    undoes: str | None = None
    """For a compensation, the do key it undoes (named by the client, else inferred)."""
    late: bool = False
    """Held on the network before the service saw it (`lateRate`)."""


async def _parse_call(request: web.Request, service: Service) -> Call | web.Response:
    operation = service.operations.get(request.match_info["operation"])
    if operation is None:
        known = ", ".join(service.operations)
        return problem(
            404,
            "unknown-operation",
            "Unknown operation",
            f"{service.name} has no operation {request.match_info['operation']!r} ({known})",
        )
    try:
        raw = await read_json(request)
    except ValueError as exc:
        return problem(400, "invalid-json", "Invalid JSON", str(exc))
    try:
        envelope = CallRequest.model_validate(raw)
    except ValidationError as exc:
        return problem(400, "invalid-request", "Invalid request", validation_detail(exc))
    key = envelope.idempotency_key or request.headers.get("Idempotency-Key")
    if not key:
        return problem(
            400,
            "missing-idempotency-key",
            "Missing idempotency key",
            "send idempotencyKey in the body or an Idempotency-Key header",
        )
    payload: DoPayload | CompensationPayload
    try:
        if isinstance(operation, DoOperation):
            payload = operation.parse(envelope.payload)
        else:
            payload = CompensationPayload.model_validate(envelope.payload)
    except ValidationError as exc:
        return problem(400, "invalid-payload", "Invalid payload", validation_detail(exc))
    undoes = None
    if isinstance(operation, Compensation):
        undoes = service.undone_key(envelope.order_id, operation, envelope.undoes)
    return Call(service, operation, envelope.order_id, key, payload, undoes)


def _outcome_for(state: SimulatorState, call: Call, settings: FaultSettings) -> Outcome | None:
    """What the service does with a fresh key: reject a listed operation or a blocked
    SKU, else apply; for a compensation, undo its do or find nothing to undo (None: the
    do is still running)."""
    if call.operation.name in settings.permanent_failure_operations:
        code, title = REJECTED
        detail = f"{call.service.name} rejects every {call.operation.name}"
        return Outcome(OutcomeKind.REJECTED, problem_body(422, code, title, detail))
    if isinstance(call.operation, Compensation):
        assert isinstance(call.payload, CompensationPayload) and call.undoes is not None
        return undo_outcome(
            state, call.service.name, call.undoes, call.operation.build_result(call.payload)
        )
    assert not isinstance(call.payload, CompensationPayload)
    blocked = [sku for sku in call.payload.skus if sku in settings.permanent_failure_skus]
    if blocked:
        body = problem_body(
            422,
            call.service.rejection_code,
            call.service.rejection_title,
            f"{call.operation.name} rejected for SKU {', '.join(blocked)}",
        )
        return Outcome(OutcomeKind.REJECTED, body)
    return Outcome(OutcomeKind.APPLIED, call.operation.build_result(call.key, call.payload))


def _outcome_response(outcome: Outcome, replayed: bool) -> web.Response:
    headers = {REPLAYED_HEADER: "true"} if replayed else None
    if outcome.kind is OutcomeKind.REJECTED:
        return problem_response(outcome.body, headers)
    if outcome.undone is False:  # the contract's nothing-to-undo answer is the body itself
        return web.json_response(outcome.body, headers=headers)
    return web.json_response({"result": outcome.body}, headers=headers)


def _abandoned(service: str, key: str) -> web.Response:
    return problem(
        409,
        "operation-abandoned",
        "Operation abandoned",
        f"key {key!r} was abandoned at {service}: it never applies",
    )


async def _hang(request: web.Request, state: SimulatorState, seconds: float) -> bool:
    """Sleep out a hang; False if the client left or the server is stopping first.

    Runners built here cancel the handler on disconnect; polling covers other runners.
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + seconds
    while True:
        transport = request.transport
        if state.closing.is_set() or transport is None or transport.is_closing():
            return False
        remaining = deadline - loop.time()
        if remaining <= 0:
            return True
        await asyncio.sleep(min(remaining, HANG_POLL_SECONDS))


def _log_fault(call: Call, what: str) -> None:
    """One line per injected fault, so a user watching the log sees what healing is for."""
    log.info(
        "%s %s order=%s key=%s: %s",
        call.service.name,
        call.operation.name,
        call.order_id,
        call.key,
        what,
    )


async def _finish(
    state: SimulatorState, call: Call, settings: FaultSettings, decision: FaultDecision
) -> web.Response:
    name = call.service.name
    stats = state.stats[name]
    if decision.delay_seconds > 0:
        await asyncio.sleep(decision.delay_seconds)
    fault = decision.transient
    if fault is not None and fault.phase is TransientPhase.BEFORE_APPLY:
        stats.transient_errors += 1
        _log_fault(call, f"{fault.phase.value} {fault.status}")
        return transient_problem(fault.status, fault.phase.value)
    if decision.slow_seconds > 0:
        stats.slow_calls += 1
        await asyncio.sleep(decision.slow_seconds)
    decided = _outcome_for(state, call, settings)
    if decided is None:
        stats.in_progress_rejections += 1
        assert call.undoes is not None
        return in_progress_problem(name, call.undoes)
    outcome, fresh = state.ledger.settle(
        name, call.key, call.operation.name, call.order_id, decided, late=call.late
    )
    if fresh and call.late and outcome.kind is OutcomeKind.APPLIED:
        stats.late_applied += 1
        _log_fault(call, "applied after arriving late")
    if not fresh:
        stats.idempotent_repeats += 1
    elif outcome.undone is False:
        stats.nothing_to_undo += 1
    elif outcome.kind is OutcomeKind.APPLIED:
        stats.applied += 1
    else:
        stats.permanent_failures += 1
        _log_fault(call, f"permanent failure {outcome.body['code']}")
    if fault is not None:
        stats.transient_errors += 1
        stats.transient_errors_after_apply += 1
        _log_fault(call, f"{fault.phase.value} {fault.status}")
        return transient_problem(fault.status, fault.phase.value)
    return _outcome_response(outcome, replayed=not fresh)


async def handle_call(request: web.Request) -> web.Response:
    state = request.app[STATE]
    parsed = await _parse_call(request, state.services[request.match_info["service"]])
    if isinstance(parsed, web.Response):
        return parsed
    call = parsed
    name = call.service.name
    late = held_on_the_network(
        state.faults.get(name), state.seed, name, call.key, state.sent_numbers.next(name, call.key)
    )
    if late is not None:
        return await _held(request, state, call, late)
    return await _arrived(request, state, call)


async def _held(
    request: web.Request, state: SimulatorState, call: Call, seconds: float
) -> web.Response:
    """A call held on the network: the service sees it only `seconds` later, and it goes
    on then whether its caller is still there or not (the caller's timeout does not
    reach a request already on its way). Until it arrives its key is never seen."""
    stats = state.stats[call.service.name]
    stats.late_arrivals += 1
    stats.held_now += 1
    _log_fault(call, f"held on the network {seconds:g}s")

    async def arrive() -> web.Response:
        try:
            await asyncio.wait_for(state.closing.wait(), seconds)
        except TimeoutError:
            pass
        else:
            return problem(503, "stopping", "Service stopping", "the simulator stopped")
        finally:
            stats.held_now -= 1
        return await _arrived(request, state, replace(call, late=True))

    task = asyncio.create_task(arrive())
    state.finishing.add(task)
    task.add_done_callback(state.finishing.discard)
    return await asyncio.shield(task)


async def _arrived(request: web.Request, state: SimulatorState, call: Call) -> web.Response:
    """The call as the service sees it: quotas, then its key."""
    name = call.service.name
    stats = state.stats[name]
    stats.calls += 1
    admission = state.load.begin(name, state.faults.get(name))
    stats.note_load(admission.calls_in_window, admission.concurrent)
    if admission.refusal is not None:
        return _refused(state, call, admission.refusal)
    slot = _Slot(state, name)
    try:
        return await _admitted(request, state, call, slot)
    finally:
        if not slot.handed_over:
            slot.end()


class _Slot:
    """An admitted call's place under ``maxConcurrent``: the handler holds it until the
    call's finishing work takes it over, since that work goes on after a client leaves."""

    def __init__(self, state: SimulatorState, service: str) -> None:
        self._state = state
        self._service = service
        self.handed_over = False

    def hand_to(self, task: asyncio.Task[web.Response]) -> None:
        self.handed_over = True
        task.add_done_callback(lambda _: self.end())

    def end(self) -> None:
        self._state.load.end(self._service)


def _refused(state: SimulatorState, call: Call, refusal: Refusal) -> web.Response:
    stats = state.stats[call.service.name]
    settings = state.faults.get(call.service.name)
    if refusal is Refusal.RATE:
        stats.rate_limited += 1
        detail = f"more than {settings.rate_limit_per_second} calls in one second"
    else:
        stats.concurrency_limited += 1
        detail = f"more than {settings.max_concurrent} calls at once"
    _log_fault(call, f"429 {refusal.value}")
    return limited_problem(refusal.value, f"{call.service.name}: {detail}")


async def _admitted(
    request: web.Request, state: SimulatorState, call: Call, slot: _Slot
) -> web.Response:
    """The call once the quotas let it in."""
    name = call.service.name
    stats = state.stats[name]
    registered = state.ledger.register_call(
        name,
        call.key,
        call.operation.name,
        call.order_id,
        request.headers.get("traceparent"),
        call.undoes,
    )
    if isinstance(registered, KeyConflict):
        stats.key_reuse_rejections += 1
        first = registered.existing
        return problem(
            422,
            "idempotency-key-reused",
            "Idempotency key reused",
            f"key {call.key!r} was first used for {first.operation} of order {first.order_id}",
        )
    if registered.abandoned:
        stats.abandoned_rejections += 1
        return _abandoned(name, call.key)
    if registered.outcome is None and state.in_progress.running(name, call.key):
        stats.in_progress_rejections += 1
        return in_progress_problem(name, call.key)
    settings = state.faults.get(name)
    decision = decide(settings, state.seed, name, call.key, registered.calls)
    state.in_progress.begin(name, call.key)
    handed_over = False
    try:
        if decision.hang_seconds is not None:
            stats.hangs += 1
            _log_fault(call, f"hanging {decision.hang_seconds:g}s")
            if not await _hang(request, state, decision.hang_seconds):
                return problem(503, "hung", "Service hung", "the call hung and was abandoned")
        task = asyncio.create_task(_finish(state, call, settings, decision))
        state.finishing.add(task)
        task.add_done_callback(state.finishing.discard)
        task.add_done_callback(lambda _: state.in_progress.end(name, call.key))
        slot.hand_to(task)
        handed_over = True
    finally:
        if not handed_over:
            state.in_progress.end(name, call.key)
    response = await asyncio.shield(task)
    if decision.apply_then_hang_seconds is not None:
        stats.apply_then_hangs += 1
        _log_fault(call, f"settled, then hanging {decision.apply_then_hang_seconds:g}s")
        if not await _hang(request, state, decision.apply_then_hang_seconds):
            return problem(503, "hung", "Service hung", "the reply hung and was abandoned")
    return response


_probe_rng = random.Random()


async def handle_probe(request: web.Request) -> web.Response:
    """`GET /{service}/health`: the cheap call an Agent makes to see whether a tripped
    circuit may close. It draws the same transient and hang faults as a real call."""
    state = request.app[STATE]
    name = request.match_info["service"]
    settings = state.faults.get(name)
    if _probe_rng.random() < settings.hang_rate:
        await _hang(request, state, settings.hang_seconds)
        return problem(503, "hung", "Service hung", "the health probe hung")
    if _probe_rng.random() < settings.transient_error_rate:
        return problem(503, "service-unavailable", "Service unavailable", "injected fault")
    return web.json_response({"status": "ok", "service": name})
