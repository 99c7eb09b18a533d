"""One chaos run: start, load under faults and kills, converge, collect, check.

Phases: the system comes up; faults go on; orders are submitted over both runtimes
(at most `submit_rate` a second and `max_in_flight` unfinished at once) while runtimes
are killed with SIGKILL and restarted, the broker is killed and restarted (a runtime
killed while it is down), Azurite is killed and restarted, and an operator cancels a
random share of the orders; faults go off; every accepted order must be stored (none
lost) and terminal within the stated bound; the Supervisor's watch list must empty (every outbox
sent); then the invariants are checked. Optionally an operator resubmits the Error
orders and everything is checked again.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
import uuid
from collections import Counter
from collections.abc import Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import aiohttp

from chaos import collect, control
from chaos.collect import StoreReader
from chaos.config import ChaosConfig
from chaos.figures import count_log_lines, figures
from chaos.invariants import check_all
from chaos.load import plan_orders, submit_all
from chaos.model import (
    Accepted,
    Alert,
    Check,
    Convergence,
    Figures,
    Heard,
    LateEvent,
    Observations,
    PlannedOrder,
    SentEvent,
)
from chaos.monitor import Monitor
from chaos.system import RUNTIMES, ChaosStack, KillEvent, Outage, chaos_stack
from shared.catalogue import catalogue_file, load
from shared.contract import Route
from shared.domain.machine.operator import PastPivot
from shared.domain.model import ProcessState
from shared.domain.reconcile import HELD, SETTLED_REASON

ORDER_FULFILMENT = load(catalogue_file()).default_workflow()
PAST_PIVOT = PastPivot.code

Progress = Callable[[str], None]
TERMINAL_GRACE_SECONDS = 60.0
"""How long past the bound the run keeps waiting, so a late convergence gets a number."""
RESTART_PAUSE_SECONDS = 1.0
TICK_SECONDS = 5.0
SUPERVISOR_BACKOFF_CAP_SECONDS = 15.0
"""The longest a Supervisor waits between sweeps while its dependencies are down."""
FINAL_STATES = frozenset(s.value for s in ProcessState if s.is_final or s is ProcessState.ERROR)
"""Where an order will not reach a later step by itself (a Suspended one resumes)."""
OPERATOR_PATIENCE_SECONDS = 300.0
OUTAGES = ("broker", "azurite")
"""How long an operator keeps asking: longer than the longest broker outage of a preset."""


@dataclass
class RunResult:
    config: ChaosConfig
    run_id: str
    workdir: Path
    table: str
    load_seconds: float = 0.0
    kills: list[KillEvent] = field(default_factory=list)
    outages: list[Outage] = field(default_factory=list)
    """Broker and Azurite outages, in the order they happened."""
    cancels: Counter[str] = field(default_factory=Counter)
    """Operator cancels by answer: 202, 409 (already finished), 409 past-pivot (refused:
    the order's pivot may have applied), or failed (no answer)."""
    cancel_answers: dict[str, list[str]] = field(default_factory=dict)
    """The same, per order."""
    suspends: Counter[str] = field(default_factory=Counter)
    """Operator suspends and resumes by answer ("suspend 202", "resume 409", ...)."""
    events: list[SentEvent] = field(default_factory=list)
    """Events the chaos reviewer got a 202 for (each eventId once)."""
    late_events: list[LateEvent] = field(default_factory=list)
    """Events sent after their order was final (each must be refused)."""
    event_answers: Counter[str] = field(default_factory=Counter)
    """The reviewer's sends by how they ended ("202", "409", "failed"...) and its
    retries ("retried 503", "retried no answer")."""
    resubmitted: int = 0
    checks: list[Check] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    """Steps of the run that could not be carried out (not invariant violations)."""
    elapsed: float = 0.0

    @property
    def bound_seconds(self) -> float:
        return bound_seconds(self.config)

    @property
    def passed(self) -> bool:
        return bool(self.checks) and not self.problems and all(c.passed for c in self.checks)


@dataclass
class _Run:
    """What the phases share."""

    config: ChaosConfig
    system: ChaosStack
    session: aiohttp.ClientSession
    reader: StoreReader
    monitor: Monitor
    planned: dict[str, PlannedOrder]
    progress: Progress
    result: RunResult
    accepted: dict[str, Accepted] = field(default_factory=dict)
    alerts: list[Alert] = field(default_factory=list)
    heard: list[Heard] = field(default_factory=list)
    """Status notifications drained so far (each check drains the queue)."""
    more_accepted: asyncio.Event = field(default_factory=asyncio.Event)
    disruption: asyncio.Lock = field(default_factory=asyncio.Lock)
    """Held while a runtime, the broker or Azurite is down, so two disruptions never overlap
    (a runtime restarted while the broker is down cannot report healthy)."""
    faults_on: bool = False
    cancel_plan: dict[str, tuple[float, bool]] = field(default_factory=dict)
    suspend_plan: dict[str, tuple[float, float]] = field(default_factory=dict)
    review_plan: dict[str, ReviewPlan] = field(default_factory=dict)
    down: set[str] = field(default_factory=set)
    """What is down right now: "broker", "azurite"."""
    is_down: dict[str, asyncio.Event] = field(
        default_factory=lambda: {what: asyncio.Event() for what in OUTAGES}
    )
    """Per outage kind, set while it is down."""

    def going_down(self, what: str) -> None:
        self.down.add(what)
        self.is_down[what].set()

    def back_up(self, what: str) -> None:
        self.down.discard(what)
        self.is_down[what].clear()

    cancelling: set[asyncio.Task[None]] = field(default_factory=set)

    @property
    def started(self) -> float:
        return self.monitor.started

    def now(self) -> float:
        return self.monitor.now()

    def targets(self) -> list[tuple[str, str]]:
        return [(name, self.system.api(name)) for name in self.system.runtimes]

    def on_accepted(self, accepted: Accepted) -> None:
        first = accepted.order_id not in self.accepted
        self.accepted[accepted.order_id] = accepted
        self.more_accepted.set()
        if not first:
            return
        plan = self.cancel_plan.get(accepted.order_id)
        if plan is not None:
            self._operate(_cancel_later(self, accepted.order_id, *plan))
        hold = self.suspend_plan.get(accepted.order_id)
        if hold is not None:
            self._operate(_suspend_later(self, accepted.order_id, *hold))
        review = self.review_plan.get(accepted.order_id)
        if review is not None:
            self._operate(_review(self, accepted.order_id, review))

    def _operate(self, action: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(action)
        self.cancelling.add(task)
        task.add_done_callback(self.cancelling.discard)


class Window:
    """Admits a submission only while fewer than `size` orders are unfinished, so the
    load stays one the two runtimes can carry on a small machine."""

    def __init__(self, run: _Run, size: int) -> None:
        self._run = run
        self._size = size
        self._lock = asyncio.Lock()
        self._submitting = 0

    async def admit(self) -> None:
        async with self._lock:
            monitor = self._run.monitor
            while monitor.in_flight(self._run.accepted) + self._submitting >= self._size:
                await monitor.next_scan()
            self._submitting += 1

    def release(self) -> None:
        self._submitting -= 1


async def run_chaos(
    config: ChaosConfig, workdir: Path, progress: Progress | None = None
) -> RunResult:
    say = progress or (lambda line: None)
    begun = time.monotonic()
    run_id = f"c{config.seed}-{uuid.uuid4().hex[:4]}"
    planned = {p.order_id: p for p in plan_orders(config, run_id)}
    say(f"starting Azurite, broker, simulator and two runtimes (logs in {workdir})")
    system = chaos_stack(config, workdir)
    with system:
        result = RunResult(config, run_id, workdir, system.table_name)
        connector = aiohttp.TCPConnector(limit=128)
        async with aiohttp.ClientSession(connector=connector) as session:
            reader = StoreReader(system.storage_connection_string, system.table_name)
            monitor = Monitor(reader, config.monitor_seconds)
            ticker: asyncio.Task[None] | None = None
            try:
                await system.start_runtimes(session)
                simulator, broker = system.simulator(session), system.broker(session)
                await control.switch_on(simulator, broker, config)
                monitor.start()
                run = _Run(config, system, session, reader, monitor, planned, say, result)
                run.faults_on = True
                run.cancel_plan = plan_cancels(config, list(planned))
                run.suspend_plan = plan_suspends(config, list(planned))
                run.review_plan = plan_reviews(config, list(planned.values()))
                ticker = asyncio.create_task(_tick(run))
                await _load(run)
                async with run.disruption:
                    run.faults_on = False
                    await control.switch_off(simulator, broker, config)
                if run.cancelling:
                    await asyncio.gather(*run.cancelling)
                say(f"operator cancels: {dict(sorted(result.cancels.items()))}")
                say(f"operator suspends: {dict(sorted(result.suspends.items()))}")
                say(f"reviewer's events: {dict(sorted(result.event_answers.items()))}")
                say("load done; faults off (injected crashes stay on); waiting for convergence")
                result.checks.append(await _converge_and_check(run, "after the load"))
                if config.resubmit_errors:
                    await _resubmit_errors(run)
            finally:
                if ticker is not None:
                    ticker.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await ticker
                await monitor.stop()
                await reader.close()
    result.elapsed = time.monotonic() - begun
    return result


async def _load(run: _Run) -> None:
    config = run.config
    run.progress(
        f"submitting {config.orders} orders over both runtimes (at most "
        f"{config.submit_rate:g}/s and {config.max_in_flight} unfinished); "
        f"{config.kills} kill -9 on the way"
    )
    async with asyncio.TaskGroup() as group:
        group.create_task(
            submit_all(
                run.session,
                run.targets(),
                list(run.planned.values()),
                config.submit_rate,
                config.submit_concurrency,
                run.started,
                run.on_accepted,
                Window(run, config.max_in_flight),
            )
        )
        group.create_task(_kill_on_schedule(run))
        group.create_task(_broker_outages(run))
        group.create_task(_azurite_outages(run))
        group.create_task(_slow_phase(run))
    run.result.load_seconds = max(a.at for a in run.accepted.values())


async def _tick(run: _Run) -> None:
    """A progress line every few seconds while something is moving."""
    last = ""
    while True:
        await asyncio.sleep(TICK_SECONDS)
        counts = run.monitor.counts()
        shown = ", ".join(f"{state} {n}" for state, n in sorted(counts.items())) or "none"
        line = (
            f"accepted {len(run.accepted)}/{run.config.orders}, "
            f"unfinished {run.monitor.in_flight(run.accepted)} ({shown}), "
            f"kills {len(run.result.kills)}"
        )
        if line != last:
            run.progress(f"[{run.now():6.1f} s] {line}")
            last = line


async def _kill_on_schedule(run: _Run) -> None:
    """Kill -9 a runtime each time another share of the orders has been accepted,
    alternating runtimes, and start it again right after."""
    config = run.config
    for k in range(config.kills):
        threshold = config.orders * (k + 1) / (config.kills + 1)
        while len(run.accepted) < threshold:
            run.more_accepted.clear()
            await run.more_accepted.wait()
        name = RUNTIMES[k % len(RUNTIMES)]
        async with run.disruption:
            at = run.now()
            instance, pid = run.system.kill_runtime(name)
            unfinished = run.monitor.in_flight(run.accepted)
            run.progress(f"[{at:6.1f} s] kill -9 {instance} (pid {pid}), {unfinished} unfinished")
            await asyncio.sleep(RESTART_PAUSE_SECONDS)
            run.system.start_runtime(name)
            await run.system.wait_healthy(run.session, name)
            back = run.now() - at
            run.result.kills.append(KillEvent(name, instance, pid, at, back))
            run.progress(f"[{run.now():6.1f} s] {run.system.instance_id(name)} up again")


async def _accepted(run: _Run, share: float) -> None:
    """Until that share of the orders has been accepted."""
    while len(run.accepted) < run.config.orders * share:
        run.more_accepted.clear()
        await run.more_accepted.wait()


async def _slow_phase(run: _Run) -> None:
    """One provider slower than the step timeout while a share of the orders comes in."""
    phase = run.config.slow
    if phase.slow_ms <= 0:
        return
    simulator = run.system.simulator(run.session)
    await _accepted(run, phase.from_share)
    await control.slow_down(simulator, run.config, slow=True)
    began = run.now()
    run.progress(f"[{began:6.1f} s] {phase.service} slow: {phase.slow_ms} ms per call")
    await _accepted(run, phase.to_share)
    await asyncio.sleep(max(0.0, began + phase.min_seconds - run.now()))
    await control.slow_down(simulator, run.config, slow=False)
    run.progress(f"[{run.now():6.1f} s] {phase.service} no longer slow")


async def _broker_outages(run: _Run) -> None:
    """Kill -9 the broker each time another share of the orders has been accepted (in
    between the runtime kills) and start it again on its ports and SQLite file after the
    outage's length; in the longest outage a runtime is killed and started meanwhile."""
    infra = run.config.infra
    outages = infra.broker_outages
    longest = max(range(len(outages)), key=outages.__getitem__) if outages else -1
    for k, seconds in enumerate(outages):
        threshold = run.config.orders * (2 * k + 1) / (2 * len(outages) + 1)
        while len(run.accepted) < threshold:
            run.more_accepted.clear()
            await run.more_accepted.wait()
        async with run.disruption:
            victim = RUNTIMES[-1] if infra.kill_runtime_in_outage and k == longest else None
            await _broker_outage(run, seconds, victim)


async def _broker_outage(run: _Run, seconds: float, victim: str | None) -> None:
    system = run.system
    at, started_at = run.now(), datetime.now(UTC)
    pid = system.kill_broker()
    run.going_down("broker")
    unfinished = run.monitor.in_flight(run.accepted)
    run.progress(
        f"[{at:6.1f} s] kill -9 the broker (pid {pid}) for {seconds:g} s, {unfinished} unfinished"
    )
    killed = None
    if victim is not None:
        await asyncio.sleep(seconds / 2)
        killed, victim_pid = system.kill_runtime(victim)
        run.progress(
            f"[{run.now():6.1f} s] kill -9 {killed} (pid {victim_pid}) while the "
            "broker is down; started again at once"
        )
        await asyncio.sleep(RESTART_PAUSE_SECONDS)
        system.start_runtime(victim)
        await asyncio.sleep(max(seconds / 2 - RESTART_PAUSE_SECONDS, 0))
    else:
        await asyncio.sleep(seconds)
    await asyncio.to_thread(system.restart_broker)
    run.back_up("broker")
    ended_at = datetime.now(UTC)
    down = run.now() - at
    if run.faults_on:
        await system.broker(run.session).set_faults(run.config.broker.to_json(run.config.seed))
    run.result.outages.append(Outage("broker", pid, at, down, started_at, ended_at, killed))
    run.progress(f"[{run.now():6.1f} s] broker up again after {down:.1f} s")
    if victim is not None:
        await system.wait_healthy(run.session, victim)
        run.progress(f"[{run.now():6.1f} s] {system.instance_id(victim)} healthy")


async def _azurite_outages(run: _Run) -> None:
    """Kill -9 Azurite each time another share of the orders has been accepted (offset
    from the broker outages and the runtime kills) and start it again on its port and
    data after the outage's length: every write it acknowledged must still be there."""
    outages = run.config.infra.azurite_outages
    for k, seconds in enumerate(outages):
        threshold = run.config.orders * (k + 1.5) / (len(outages) + 1.5)
        while len(run.accepted) < threshold:
            run.more_accepted.clear()
            await run.more_accepted.wait()
        async with run.disruption:
            await _azurite_outage(run, seconds)


async def _azurite_outage(run: _Run, seconds: float) -> None:
    system = run.system
    at, started_at = run.now(), datetime.now(UTC)
    pid = system.kill_azurite()
    run.going_down("azurite")
    unfinished = run.monitor.in_flight(run.accepted)
    run.progress(
        f"[{at:6.1f} s] kill -9 Azurite (pid {pid}) for {seconds:g} s, {unfinished} unfinished"
    )
    await asyncio.sleep(seconds)
    await asyncio.to_thread(system.start_azurite)
    run.back_up("azurite")
    ended_at = datetime.now(UTC)
    down = run.now() - at
    run.result.outages.append(Outage("azurite", pid, at, down, started_at, ended_at))
    run.progress(f"[{run.now():6.1f} s] Azurite up again after {down:.1f} s")


def plan_cancels(config: ChaosConfig, order_ids: Sequence[str]) -> dict[str, tuple[float, bool]]:
    """Which orders an operator cancels, how long after their 202, and whether twice at
    once (seeded)."""
    cancels = config.cancels
    rng = random.Random(config.seed * 7919 + 1)
    plan: dict[str, tuple[float, bool]] = {}
    for order_id in order_ids:
        if rng.random() < cancels.share:
            delay = rng.uniform(0, cancels.within_seconds)
            plan[order_id] = (delay, rng.random() < cancels.twice_share)
    return plan


def plan_suspends(config: ChaosConfig, order_ids: Sequence[str]) -> dict[str, tuple[float, float]]:
    """Which orders an operator suspends, how long after their 202, and for how long."""
    suspends = config.suspends
    rng = random.Random(config.seed * 7919 + 2)
    return {
        order_id: (rng.uniform(0, suspends.within_seconds), rng.uniform(0, suspends.hold_seconds))
        for order_id in order_ids
        if rng.random() < suspends.share
    }


async def _suspend_later(run: _Run, order_id: str, delay: float, hold: float) -> None:
    await asyncio.sleep(delay)
    names = list(RUNTIMES)
    answer = await _operator(run, order_id, names, "suspend")
    run.result.suspends[f"suspend {answer}"] += 1
    # Resume whatever the answer: a 503 may come after the suspend was stored, and a
    # retry of it may then be refused (409); resuming an order not Suspended is a 409.
    await asyncio.sleep(hold)
    answer = await _operator(run, order_id, names[::-1], "resume")
    run.result.suspends[f"resume {answer}"] += 1


async def _cancel_later(run: _Run, order_id: str, delay: float, twice: bool) -> None:
    await asyncio.sleep(delay)
    names = list(RUNTIMES)
    first = random.Random(order_id).randrange(len(names))
    names = names[first:] + names[:first]
    asks = [
        _operator(run, order_id, names[i:] + names[:i], "cancel") for i in range(2 if twice else 1)
    ]
    for answer in await asyncio.gather(*asks):
        run.result.cancels[answer] += 1
        run.result.cancel_answers.setdefault(order_id, []).append(answer)


@dataclass(frozen=True)
class ReviewPlan:
    """How the chaos reviewer answers one order's approval step."""

    event: str
    early: bool
    """Right after the submission's 202; else once the order is seen waiting."""
    approved: bool
    second: bool
    """Then a second eventId with the opposite answer, which must never be consumed."""
    in_outage: str | None
    """Once waiting, held back until this ("broker", "azurite") is down (for a while at
    most); None: not held back."""
    delay: float
    """How long after the order was seen waiting (not early)."""
    late: bool = False
    """Then, once the order is final, a third eventId: too late, it must be refused."""


def plan_reviews(config: ChaosConfig, planned: Sequence[PlannedOrder]) -> dict[str, ReviewPlan]:
    """Which orders the reviewer answers and how: every order whose workflow has an
    approval step (seeded)."""
    reviews = config.reviews
    rng = random.Random(config.seed * 7919 + 4)
    late_rng = random.Random(config.seed * 7919 + 5)  # its own: the other draws stay
    approvals = {w.name: s.event for w in config.mix for s in w.steps if s.approval and s.event}
    plan: dict[str, ReviewPlan] = {}
    for p in planned:
        event = approvals.get(p.workflow or "")
        if event is not None:
            plan[p.order_id] = ReviewPlan(
                event,
                early=rng.random() < reviews.early_share,
                approved=rng.random() >= reviews.reject_share,
                second=rng.random() < reviews.second_id_share,
                in_outage=rng.choice(OUTAGES) if rng.random() < reviews.in_outage_share else None,
                delay=rng.uniform(0, reviews.within_seconds),
                late=late_rng.random() < reviews.late_share,
            )
    return plan


async def _review(run: _Run, order_id: str, plan: ReviewPlan) -> None:
    """Answer the order's approval: early, or once it waits (or is final: then the
    answer is late and must be refused); the answer twice at once with one eventId
    (through both runtimes), then maybe a second eventId with the opposite answer."""
    early = plan.early
    if not early:
        await _until_waiting(run, order_id, plan.event)
        await asyncio.sleep(plan.delay)
        if plan.in_outage is not None:
            await _until_down(run, plan.in_outage, run.config.reviews.outage_patience_seconds)
    first = f"{order_id}.review-1"
    await asyncio.gather(
        *(_send_event(run, order_id, plan, first, plan.approved, early, k) for k in range(2))
    )
    if plan.second:
        second = f"{order_id}.review-2"
        await _send_event(run, order_id, plan, second, not plan.approved, early, 0)
    if plan.late:
        await _answer_late(run, order_id, plan)


async def _answer_late(run: _Run, order_id: str, plan: ReviewPlan) -> None:
    """Once the order is final (Processed, Compensated, Cancelled), answer its approval
    again with a new eventId: the contract refuses it (409), and the order never keeps it.
    An order held in Error is left alone (it is not final: an operator may resubmit it)."""
    state = await _until_final(run, order_id)
    if state is None or state == ProcessState.ERROR.value:
        return
    event_id = f"{order_id}.review-late"
    data = {"approved": not plan.approved, "by": "chaos", "comment": "too late"}
    names = list(RUNTIMES)
    begun = time.monotonic()
    attempt = 0
    while time.monotonic() - begun < OPERATOR_PATIENCE_SECONDS:
        app = run.system.app(run.session, names[attempt % len(names)])
        attempt += 1
        with contextlib.suppress(aiohttp.ClientError, TimeoutError):
            status, _ = await app.send_event(order_id, plan.event, event_id, data, timeout=15)
            if status < 500:
                run.result.late_events.append(LateEvent(order_id, event_id, str(status)))
                run.result.event_answers[f"late {status}"] += 1
                return
        await asyncio.sleep(min(0.2 * attempt, 2.0))
    run.result.event_answers["late failed"] += 1


async def _until_final(run: _Run, order_id: str) -> str | None:
    """Poll the order's view until it is final or in Error; its state, or None."""
    begun = time.monotonic()
    names = list(RUNTIMES)
    attempt = 0
    while time.monotonic() - begun < bound_seconds(run.config) + TERMINAL_GRACE_SECONDS:
        app = run.system.app(run.session, names[attempt % len(names)])
        attempt += 1
        with contextlib.suppress(aiohttp.ClientError, TimeoutError):
            status, view = await app.view(order_id, timeout=10)
            state = str(view.get("processState", "")) if status == 200 else ""
            if state in FINAL_STATES:
                return state
        await asyncio.sleep(run.config.reviews.poll_seconds * 2)
    return None


async def _until_down(run: _Run, what: str, patience: float) -> None:
    """Until `what` (the broker, Azurite) is down, or `patience` seconds passed."""
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(run.is_down[what].wait(), patience)


async def _until_waiting(run: _Run, order_id: str, event: str) -> None:
    """Poll the order's view (either runtime; a failure is asked again) until it waits
    for the event or is final."""
    begun = time.monotonic()
    names = list(RUNTIMES)
    attempt = 0
    while time.monotonic() - begun < bound_seconds(run.config) + TERMINAL_GRACE_SECONDS:
        app = run.system.app(run.session, names[attempt % len(names)])
        attempt += 1
        with contextlib.suppress(aiohttp.ClientError, TimeoutError):
            status, view = await app.view(order_id, timeout=10)
            if status == 200:
                waiting = view.get("waitingFor") or {}
                state = str(view.get("processState", ""))
                if waiting.get("event") == event or state in FINAL_STATES:
                    return
        await asyncio.sleep(run.config.reviews.poll_seconds)
    run.result.problems.append(f"{order_id}: never seen waiting for {event!r} nor final")


async def _send_event(
    run: _Run, order_id: str, plan: ReviewPlan, event_id: str, approved: bool, early: bool, k: int
) -> None:
    """POST the event until it is answered: 202 (recorded: it must be kept), 409 (the
    order is final), anything else below 500 is a problem of the run; a 503 (the state
    store down), another 5xx or no answer (a runtime killed) is asked again."""
    begun = time.monotonic()
    names = list(RUNTIMES)
    attempt = k
    data = {"approved": approved, "by": "chaos", "comment": "chaos reviewer"}
    answers = run.result.event_answers
    while time.monotonic() - begun < OPERATOR_PATIENCE_SECONDS:
        app = run.system.app(run.session, names[attempt % len(names)])
        attempt += 1
        try:
            status, answer = await app.send_event(order_id, plan.event, event_id, data, timeout=15)
        except (aiohttp.ClientError, TimeoutError):
            answers["retried no answer"] += 1
        else:
            for what in sorted(run.down) if status != 202 else ():
                answers[f"{status} with {what} down"] += 1
            if status == 202:
                answers["202"] += 1
                for what in sorted(run.down):
                    answers[f"202 with {what} down"] += 1
                if all(e.event_id != event_id for e in run.result.events):
                    run.result.events.append(
                        SentEvent(order_id, event_id, plan.event, approved, run.now(), early)
                    )
                return
            if status == 409:
                answers["409"] += 1
                return
            if status < 500:
                answers[str(status)] += 1
                run.result.problems.append(f"event {event_id} answered {status}: {answer}")
                return
            answers[f"retried {status}"] += 1
        await asyncio.sleep(min(0.2 * (attempt - k), 2.0))
    answers["failed"] += 1


async def _operator(run: _Run, order_id: str, names: Sequence[str], action: str) -> str:
    """POST cancel, suspend or resume until it is answered: 202 or 409 (not in a state
    that allows it; for a cancel, "409 past-pivot" when the order's pivot may have
    applied); a killed runtime or a 5xx (the store or bus down) is asked again."""
    begun = time.monotonic()
    attempt = 0
    while time.monotonic() - begun < OPERATOR_PATIENCE_SECONDS:
        app = run.system.app(run.session, names[attempt % len(names)])
        with contextlib.suppress(aiohttp.ClientError, TimeoutError):
            if action == "cancel":
                status, answer = await app.cancel(order_id, "chaos")
            else:
                status, answer = await (app.suspend if action == "suspend" else app.resume)(
                    order_id
                )
            if status == 409 and answer.get("code") == PAST_PIVOT:
                return f"409 {PAST_PIVOT}"
            if status in (202, 409):
                return str(status)
            if status < 500:
                run.result.problems.append(f"{action} of {order_id} answered {status}: {answer}")
                return "refused"
        attempt += 1
        await asyncio.sleep(min(0.5 * attempt, 3.0))
    return "failed"


def bound_seconds(config: ChaosConfig) -> float:
    """The timings' bound, plus each broker or Azurite outage and what it takes after one:
    the Supervisor's longest back-off, then a Pending timeout before it nudges again."""
    t = config.timings
    outages = config.infra.outages
    after_each = SUPERVISOR_BACKOFF_CAP_SECONDS + t.pending_timeout_seconds + t.expiry_seconds
    # A wait for the reviewer (a poll, its delay) or for a notBefore past the last slot.
    reviews = config.reviews
    waits = max(
        reviews.poll_seconds + reviews.within_seconds + reviews.outage_patience_seconds,
        config.schedules.max_seconds,
    )
    return (
        t.convergence_bound_seconds(config.dispatches)
        + waits
        + sum(outages)
        + len(outages) * after_each
    )


async def _converge_and_check(run: _Run, title: str) -> Check:
    config = run.config
    bound = bound_seconds(config)
    since = max(a.at for a in run.accepted.values())
    terminal_at = await run.monitor.wait_terminal(
        run.accepted, since, since + bound + TERMINAL_GRACE_SECONDS - run.now()
    )
    terminal_after = None if terminal_at is None else terminal_at - since
    if terminal_after is None:
        run.progress(f"not every order terminal {bound + TERMINAL_GRACE_SECONDS:.0f} s later")
    else:
        run.progress(f"every order terminal {terminal_after:.1f} s after the last submission")
    settled_after, still_watched = await _settle(run, config.settle_seconds)
    begun = time.monotonic()
    observations, figures_ = await _observe(run, since, terminal_at)
    took = time.monotonic() - begun
    lost = sorted(set(run.accepted) - set(observations.processes))
    if lost:
        run.progress(f"LOST: {len(lost)} accepted order(s) not in the state store: {lost[:5]}")
    check = Check(
        title,
        observations,
        check_all(observations),
        figures_,
        Convergence(terminal_after, settled_after, still_watched, took),
    )
    verdict = "PASS" if check.passed else "FAIL"
    run.progress(f"invariants {title}: {verdict} (collected in {took:.0f} s)")
    return check


async def _settle(run: _Run, timeout: float) -> tuple[float | None, int]:
    """Wait until the Supervisor's watch list is empty: every outbox was sent."""
    begun = time.monotonic()
    watched = -1
    while time.monotonic() - begun < timeout:
        watched = await run.reader.watched()
        if watched == 0:
            return time.monotonic() - begun, 0
        await asyncio.sleep(1.0)
    return None, watched


async def _observe(
    run: _Run, since: float, terminal_at: float | None
) -> tuple[Observations, Figures]:
    system = run.system
    simulator = system.simulator(run.session)
    await _until_none_held(run)
    reconciled, mismatches, left = await _reconcile_until_healed(run)
    states = await run.reader.states()
    ids = {s.order_id for s in states} | set(run.accepted)
    processes = await run.reader.processes(ids)
    rest_index = await run.reader.rest_index()
    effects = await collect.effects(simulator)
    run.alerts.extend(await collect.drain_alerts(system.service_bus_connection_string))
    run.heard.extend(await collect.drain_statuses(system.service_bus_connection_string))
    simulator_stats = await simulator.stats()
    broker_stats = await system.broker(run.session).stats()
    observations = Observations(
        workflow=ORDER_FULFILMENT,
        max_failure_count=run.config.timings.max_failure_count,
        planned=run.planned,
        accepted=dict(run.accepted),
        processes=processes,
        effects=effects,
        alerts=tuple(run.alerts),
        heard=tuple(run.heard),
        samples=tuple(run.monitor.samples),
        last_submission_at=since,
        terminal_at=terminal_at,
        bound_seconds=bound_seconds(run.config),
        outages=tuple((o.started_at, o.ended_at) for o in run.result.outages),
        outage_grace=timedelta(seconds=run.config.timings.expiry_seconds),
        reconciled=reconciled,
        workflows={w.name: w for w in run.config.mix},
        cancel_answers={k: tuple(v) for k, v in run.result.cancel_answers.items()},
        events=tuple(run.result.events),
        rest_index=rest_index,
        reconcile_mismatches=mismatches,
        reconcile_left=left,
        late_events=tuple(run.result.late_events),
        limits=dict(run.config.limits.calls_per_second),
        max_calls_in_one_second={
            name: int(per.get("maxCallsInOneSecond", 0))
            for name, per in simulator_stats.items()
            if isinstance(per, dict)
        },
    )
    logs = count_log_lines(system.runtime_logs())
    answers = run.result.event_answers
    return observations, figures(observations, simulator_stats, broker_stats, logs, answers)


HELD_PATIENCE_SECONDS = 60.0
RECONCILE_RUNS = 6
RECONCILE_PAUSE_SECONDS = 6.0
"""Between two reconciliation runs: its undos are messages to the agents, not awaited."""
HELD_STATES = frozenset(state.value for state in HELD)


async def _until_none_held(run: _Run) -> None:
    """Until no request is held on the network any more (`lateRate`): the judge must
    see every late arrival applied, and reconciliation must find it."""
    simulator = run.system.simulator(run.session)
    begun = time.monotonic()
    while time.monotonic() - begun < HELD_PATIENCE_SECONDS:
        stats = await simulator.stats()
        held = sum(int(p.get("heldNow", 0)) for p in stats.values() if isinstance(p, dict))
        if held == 0:
            return
        await asyncio.sleep(1.0)
    run.result.problems.append("requests still held on the network a minute after the load")


async def _reconcile_until_healed(
    run: _Run,
) -> tuple[int | None, tuple[int, ...], tuple[str, ...]]:
    """Reconciliation over the finished orders (the runtimes sample up to 1000), as an
    operator would run it: its mismatches land on operator-alerts with the others, and
    it undoes what is in force where it should not be. Run again while a run finds a
    mismatch it acts on (its undos are not awaited), a few times at most: the last run
    says whether what it found was healed. One it leaves for an operator on a held order
    stays until the operator acts, so it calls for no further run. The orders the first
    run checked, each run's mismatch count, and the orders of the last run's mismatches
    left on held orders."""
    found: list[int] = []
    checked: int | None = None
    left: tuple[str, ...] = ()
    for k in range(RECONCILE_RUNS):
        answer = await _reconcile(run)
        if answer is None:
            break
        orders, mismatches = answer
        checked = orders if checked is None else checked
        found.append(len(mismatches))
        left = tuple(sorted({m["orderId"] for m in mismatches if _left_on_held(m)}))
        if all(_left_on_held(m) for m in mismatches):
            break
        run.progress(f"reconciliation run {k + 1}: {len(mismatches)} mismatch(es); again shortly")
        await asyncio.sleep(RECONCILE_PAUSE_SECONDS)
    if left:
        run.progress(f"reconciliation left {len(left)} held order(s) for an operator: {left}")
    return checked, tuple(found), left


def _left_on_held(mismatch: Mapping[str, Any]) -> bool:
    """A held order's step settled "not applied" whose provider has it after all: the
    order may still take it as the step's, so reconciliation alerts and leaves it to an
    operator (shared/domain/reconcile.py)."""
    return mismatch.get("reason") == SETTLED_REASON and mismatch.get("state") in HELD_STATES


async def _reconcile(run: _Run) -> tuple[int, list[Mapping[str, Any]]] | None:
    """One run through `POST /api/reconcile`: orders checked and mismatches found."""
    name, _ = run.targets()[0]
    url = run.system.app(run.session, name).url(Route.RECONCILE)
    try:
        async with run.session.post(url, timeout=aiohttp.ClientTimeout(total=120)) as response:
            if response.status != 200:
                run.progress(f"reconciliation answered {response.status}")
                return None
            answer = await response.json()
    except (aiohttp.ClientError, TimeoutError) as exc:
        run.progress(f"reconciliation failed: {type(exc).__name__}: {exc}")
        return None
    return int(answer["orders"]), list(answer.get("mismatches") or ())


async def _resubmit_errors(run: _Run) -> None:
    first = run.result.checks[0].observations
    errors = sorted(
        order_id
        for order_id, p in first.processes.items()
        if p.state.process_state is ProcessState.ERROR
    )
    if not errors:
        return
    run.progress(f"an operator resubmits the {len(errors)} Error order(s)")
    targets = run.targets()
    try:
        for i, order_id in enumerate(errors):
            await _resubmit(run, targets, order_id, i)
            run.result.resubmitted += 1
    except ResubmitError as exc:
        run.result.problems.append(str(exc))
        return
    run.result.checks.append(
        await _converge_and_check(run, f"after resubmitting {len(errors)} Error order(s)")
    )


class ResubmitError(RuntimeError):
    """The operator route refused a resubmission it should have taken."""


async def _resubmit(
    run: _Run, targets: Sequence[tuple[str, str]], order_id: str, first: int
) -> None:
    """POST resubmit until it is taken. A 409 after a failed try means that try went
    through (the order is no longer in Error); on the first try it is a real refusal."""
    for attempt in range(20):
        name, _ = targets[(first + attempt) % len(targets)]
        with contextlib.suppress(aiohttp.ClientError, TimeoutError):
            status, answer = await run.system.app(run.session, name).resubmit(order_id)
            if status == 202 or (status == 409 and attempt > 0):
                previous = run.accepted[order_id]
                run.accepted[order_id] = Accepted(order_id, run.now(), name, previous.tries)
                return
            if status < 500:
                raise ResubmitError(f"resubmit of {order_id} answered {status}: {answer}")
        await asyncio.sleep(0.2 * (attempt + 1))
    raise ResubmitError(f"resubmit of {order_id} never accepted")
