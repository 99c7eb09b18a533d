"""The Supervisor: finds orders whose complete-by has passed and recovers each exactly once."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from shared.contract import QUEUE_PROPERTIES
from shared.domain import in_doubt
from shared.domain.fairness import Admission
from shared.domain.health import SweepRecord
from shared.domain.in_doubt import RemoteOutcome, RemoteOutcomeKind
from shared.domain.machine.line import held_until, in_line, released
from shared.domain.machine.recovery import (
    exhaustion_undoes,
    next_check,
    next_complete_by,
    recover,
    version_gone,
)
from shared.domain.machine.transition import Transition
from shared.domain.model import OrderProcess, ProcessState
from shared.domain.routing import PRIMARY_ONLY
from shared.ports import (
    BusUnavailable,
    ConcurrencyConflict,
    HealthStore,
    StoreUnavailable,
    WatchEntry,
)
from shared.telemetry.logsafe import app_logger
from shared.usecases.flow.deps import ProcessDeps
from shared.usecases.flow.outage import Outage, exchange
from shared.usecases.flow.outcomes import OutcomeQueries

log = app_logger("orders.supervisor")

INFRASTRUCTURE_ERRORS = (BusUnavailable, StoreUnavailable, TimeoutError)
"""What says the system itself is unreachable, not that an order went wrong."""

OUTAGE_AFTER = 3
"""Infrastructure failures in a row, with no check succeeding, that stop a sweep: one is a
blip, several in a row are an outage that would fail every remaining check the same way."""

DEFAULT_BUDGET = timedelta(seconds=15)
MOVE_GRACE = timedelta(minutes=1)
"""How long an order at rest watched for a later version than it has is left alone: an
operator's resubmit, resume or cancel watches it before its save, and saves within its
few seconds of budget or never."""
CHECK_TIMEOUT_SECONDS = 5.0
"""Wall-clock limit of one check: a call that hangs on a dead connection counts as an
infrastructure failure instead of holding the sweep (and the next timer ticks) up."""


@dataclass
class SweepReport:
    due: int = 0
    requeued: int = 0
    errored: int = 0
    compensating: int = 0
    rescheduled: int = 0
    finished: int = 0
    lost_races: int = 0
    failed: int = 0
    deferred: int = 0
    """Due checks not started (the budget ran out or an outage stopped the sweep): they
    stay due, so the next sweep takes them."""
    outage: BaseException | None = None
    """The failure that stopped the sweep when its dependencies could not be reached."""
    troubled: BaseException | None = None
    """The last bus or store failure of a check, whether or not it stopped the sweep."""
    recovered_orders: list[str] = field(default_factory=list)
    in_doubt_applied: int = 0
    """In-doubt steps their service said were applied: recorded done, not called again."""
    in_doubt_not_applied: int = 0
    """Not applied or never seen: retried, away from the agent that timed out if it can."""
    in_doubt_unanswered: int = 0
    """Still in progress, or no answer: retried where the key lives, as without asking."""

    @property
    def in_doubt(self) -> int:
        return self.in_doubt_applied + self.in_doubt_not_applied + self.in_doubt_unanswered

    @property
    def recovered(self) -> int:
        return self.requeued + self.errored + self.compensating


def sweep_budget(schedule: str | None) -> timedelta:
    """Half the period of an NCRONTAB schedule whose seconds field is `*/N` (the form the
    settings use), so one sweep ends before the next is due; otherwise DEFAULT_BUDGET."""
    match = re.fullmatch(r"\*/(\d+)", (schedule or "").split(" ")[0])
    if match is None or int(match.group(1)) == 0:
        return DEFAULT_BUDGET
    return timedelta(seconds=int(match.group(1)) / 2)


async def sweep(
    deps: ProcessDeps,
    limit: int = 500,
    concurrency: int = 16,
    budget: timedelta = DEFAULT_BUDGET,
    check_timeout: float = CHECK_TIMEOUT_SECONDS,
    in_outage: Callable[[datetime], bool] = lambda complete_by: False,
    queries: OutcomeQueries | None = None,
) -> SweepReport:
    """Reads only the watch entries that are due, so a sweep costs what is in flight.

    Every change is conditional on the ETag read: two Supervisors racing on one order
    recover it once, and the loser moves on silently. No check starts once `budget` has
    passed or the bus or store look down; what is left stays due for the next sweep. A
    complete-by that passed `in_outage` (the broker or store was down) is not counted. With
    `queries`, an in-doubt step's service is asked what it did before it is retried
    (shared/usecases/flow/outcomes.py).
    """
    started = deps.clock.now()
    entries = await deps.store.due(started, limit)
    report = SweepReport(due=len(entries))
    gate = asyncio.Semaphore(concurrency)
    in_a_row = succeeded = 0
    last: BaseException | None = None

    async def check(entry: WatchEntry) -> None:
        nonlocal in_a_row, succeeded, last
        async with gate:
            if report.outage is not None or deps.clock.now() - started >= budget:
                report.deferred += 1
                return
            try:
                async with asyncio.timeout(check_timeout):
                    await _check(deps, entry, report, in_outage, queries)
                in_a_row = 0
                succeeded += 1
            except INFRASTRUCTURE_ERRORS as exc:
                report.failed += 1
                in_a_row += 1
                last = exc
                if in_a_row >= OUTAGE_AFTER and report.outage is None:
                    report.outage = exc
                log.debug("order %s supervisor check: %s: %s", entry.order_id, type(exc), exc)
            except Exception as exc:  # one order's failure must not stop the sweep
                report.failed += 1
                log.warning(
                    "order %s supervisor check failed (%s: %s); it stays due for the next sweep",
                    entry.order_id,
                    type(exc).__name__,
                    exc,
                )

    await asyncio.gather(*(check(e) for e in entries))
    report.troubled = last
    if report.outage is None and last is not None and not succeeded:
        report.outage = last  # every check it tried failed: down, however few there were
    if report.recovered or report.lost_races:
        log.info(
            "supervisor sweep: %d due, %d requeued, %d to Error, %d compensating, %d lost races",
            report.due,
            report.requeued,
            report.errored,
            report.compensating,
            report.lost_races,
        )
    if report.deferred and report.outage is None:
        log.info(
            "supervisor sweep stopped at its %g s budget: %d of %d due checks left for the next",
            budget.total_seconds(),
            report.deferred,
            report.due,
        )
    return report


async def supervise(
    deps: ProcessDeps,
    health: HealthStore,
    budget: timedelta = DEFAULT_BUDGET,
    *,
    outage: Outage,
    queries: OutcomeQueries | None = None,
) -> SweepReport:
    """One sweep, then a SweepRecord so operators can see the Supervisor is alive.

    `outage` is this instance's (the container's, shared with the bus it watches):
    sweeps run one per timer tick, in one process.

    While the bus or the store is down the sweeps back off (see Outage); nothing is
    counted against the orders meanwhile, and their checks stay due. The record is best
    effort: failing to write it is logged and the sweep's work stands, because
    recovering orders matters more than reporting on it.
    """
    started_at = deps.clock.now()
    if outage.waiting(started_at):
        return SweepReport()
    policy = deps.policy
    # After an outage, a step dispatched as it ended gets its whole complete-by, and an
    # order it left Pending its Pending timeout, before anything counts again.
    after = policy.step_timeout + policy.pending_timeout

    def in_outage(complete_by: datetime) -> bool:
        return outage.covers(complete_by, before=policy.step_timeout, after=after)

    await exchange(outage, health, deps.instance_id, started_at, CHECK_TIMEOUT_SECONDS)
    try:
        report = await sweep(deps, budget=budget, in_outage=in_outage, queries=queries)
    except INFRASTRUCTURE_ERRORS as exc:
        outage.failed(started_at, exc)
        return SweepReport(outage=exc)
    if report.outage is not None:
        outage.failed(started_at, report.outage)
        return report
    if report.troubled is not None:
        outage.glimpsed(started_at)
    outage.swept(started_at, report.due, bool(report.recovered or report.finished))
    record = SweepRecord(
        instance=deps.instance_id,
        started_at=started_at,
        finished_at=deps.clock.now(),
        due=report.due,
        requeued=report.requeued,
        errored=report.errored,
        compensating=report.compensating,
        rescheduled=report.rescheduled,
        finished=report.finished,
        lost_races=report.lost_races,
        failed=report.failed,
    )
    try:
        await health.record_sweep(record)
    except Exception as exc:  # any failure: the sweep itself has succeeded
        log.warning("supervisor sweep not recorded (%s: %s)", type(exc).__name__, exc)
    return report


async def _check(
    deps: ProcessDeps,
    entry: WatchEntry,
    report: SweepReport,
    in_outage: Callable[[datetime], bool],
    queries: OutcomeQueries | None = None,
) -> None:
    process = await deps.store.load(entry.order_id)
    if process is None:
        # The submission died between the watch entry and the order rows. Only the entry
        # as read goes: a retry whose create lands after this load re-watches the order
        # once it exists (shared/usecases/flow/submission.py), which makes this delete miss.
        # The customer's count goes first: once the entry is gone nothing would find it.
        if deps.customers is not None and entry.customer:
            await deps.customers.never_created(
                entry.customer, entry.order_id, deps.store, deps.bus, deps.clock.now()
            )
        await deps.store.unwatch_entry(entry)
        return
    if process.state.process_state.is_at_rest:
        ahead = entry.version > process.state.version
        if ahead and deps.clock.now() < entry.check_at + MOVE_GRACE:
            # An operator's move off this rest may be between its watch and its save.
            return
        # The Scheduler stopped before it unwatched: resend the last outbox, then forget it.
        await deps.work.finish_rest(process)
        if ahead:
            # That move never saved: its entry, kept for a version that never came, would
            # bring the order back at every sweep.
            await deps.store.unwatch_entry(entry)
        report.finished += 1
        return
    now = deps.clock.now()
    workflow = deps.find_workflow(process)
    if workflow is None:
        await _hold_version_gone(deps, process, report, now)
        return
    if _as_stored_by_intake(process, now):
        # The intake may have died between its insert and its sends: they go again
        # (the broker drops what already went), before anything is decided.
        log.info("order %s still as the intake claimed it: its outbox sent again", entry.order_id)
        await deps.work.resend_outbox(process)
    if deps.customers is not None and in_line(process):
        standing = await deps.customers.standing(process)
        if standing is Admission.WAIT:
            # Its turn has not come: a nudge would run it ahead of its customer's line.
            await deps.store.reschedule(entry, held_until(process, now))
            report.rescheduled += 1
            return
        if standing is Admission.RUN:
            process = released(process, now)  # promoted, its nudge never came
    complete_by = next_complete_by(process, deps.policy)
    counted = complete_by is None or not in_outage(complete_by)
    outcome = None
    doubt = None
    due = complete_by is not None and complete_by <= now
    # Only a due order's recovery may dispatch (a wait's deadline): a first look reads nothing.
    routing = await deps.current_routing() if due else PRIMARY_ONLY
    if queries is not None and counted and due:
        exhausting = exhaustion_undoes(process, workflow, deps.policy)
        doubt = in_doubt.question(process, workflow, routing, exhausting=exhausting)
    if doubt is not None:
        if now < doubt.ask_at:
            # Asked before the service registered a late request, "never seen" is a guess.
            await deps.store.reschedule(entry, doubt.ask_at)
            report.rescheduled += 1
            return
        assert queries is not None
        outcome = await _settle(queries, doubt)
    transition = recover(
        process, workflow, deps.policy, now, count=counted, outcome=outcome, routing=routing
    )
    if transition is None:
        check_at = next_check(process, workflow, deps.policy, now)
        if check_at is not None:
            await deps.store.reschedule(entry, check_at)
            report.rescheduled += 1
            _say_if_beaten(process, check_at)
        return
    try:
        recovered = await _commit_counted(deps, process, transition)
    except ConcurrencyConflict:
        report.lost_races += 1
        return
    report.recovered_orders.append(entry.order_id)
    _count_outcome(report, outcome)
    state = recovered.state.process_state
    if state is ProcessState.ERROR:
        report.errored += 1
    elif recovered.state.phase is not process.state.phase:
        report.compensating += 1
    else:
        report.requeued += 1
    check_at = next_check(recovered, workflow, deps.policy, now)
    if check_at is not None:
        await deps.store.reschedule(entry, check_at)


def _as_stored_by_intake(process: OrderProcess, now: datetime) -> bool:
    """Claimed at intake and not changed since (shared/usecases/flow/submission.py
    `first_look`): its outbox, the first step's request and the client's notifications,
    may never have been sent. Any later change replaces the outbox, and sends its own.
    Only while the queues still drop a repeated message id: later, a resend of what did
    go out would reach the client twice, and a lost request is left to the step's
    timeout, as after any crash."""
    state = process.state
    window = timedelta(seconds=QUEUE_PROPERTIES.duplicate_detection_window_seconds)
    return state.version == 1 and state.attempt == 1 and now < state.updated_at + window


async def _hold_version_gone(
    deps: ProcessDeps,
    process: OrderProcess,
    report: SweepReport,
    now: datetime,
) -> None:
    log.error(
        "order %s runs on %s v%d, which the catalogue no longer keeps: held for an operator",
        process.order_id,
        process.state.workflow,
        process.state.workflow_version,
    )
    try:
        await deps.work.commit(version_gone(process, now))
    except ConcurrencyConflict:
        report.lost_races += 1
        return
    report.errored += 1


def _say_if_beaten(process: OrderProcess, check_at: datetime) -> None:
    """Step heartbeats do not move the watch entry (a write per beat saved): the sweep
    that finds the order at the old time moves the check to the beaten complete-by."""
    index = process.state.current_step
    step = process.steps[index] if index < len(process.steps) else None
    if step is not None and step.step_heartbeats:
        log.info(
            "order %s %s: complete-by moved by %d step heartbeat(s); check rescheduled to %s",
            process.order_id,
            step.name,
            step.step_heartbeats,
            check_at.isoformat(),
        )


def _count_outcome(report: SweepReport, outcome: RemoteOutcome | None) -> None:
    if outcome is None:
        return
    if outcome.kind is RemoteOutcomeKind.APPLIED:
        report.in_doubt_applied += 1
    elif outcome.safe_to_move or outcome.kind is RemoteOutcomeKind.ABANDONED:
        report.in_doubt_not_applied += 1
    else:
        report.in_doubt_unanswered += 1


async def _commit_counted(
    deps: ProcessDeps,
    before: OrderProcess,
    transition: Transition,
) -> OrderProcess:
    """Save, then send, like every commit: a recovery that loses its race sends nothing.
    A counted timeout first checks the bus answers, so that an outage is noticed before
    anything is counted against the order (a bus that goes down between the check and
    the send leaves the messages in the outbox, resent by the next sweep or nudge)."""
    if transition.process.state.failure_count > before.state.failure_count:
        await deps.bus.ping()
    return await deps.work.commit(transition)


async def _settle(queries: OutcomeQueries, doubt: in_doubt.Question) -> RemoteOutcome:
    """Abandon the key where the order is about to leave it (undo, or another provider),
    so that "not applied" is final even for a request still on the wire; a service
    without abandon is asked instead, and time makes its answer final (settle.py)."""
    if doubt.abandon:
        answer = await queries.abandon(doubt.agent, doubt.key)
        if answer.kind is not RemoteOutcomeKind.NOT_SUPPORTED:
            return answer
    answer = await queries.ask(doubt.agent, doubt.key)
    if doubt.movable and answer.safe_to_move:
        settled = await queries.abandon(doubt.agent, doubt.key)
        if settled.kind is not RemoteOutcomeKind.NOT_SUPPORTED:
            return settled
    return answer
