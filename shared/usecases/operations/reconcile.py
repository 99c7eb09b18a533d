"""Reconciliation: compare a sample of orders recently come to rest (finished, or held in
Error or Suspended: shared/domain/reconcile.py) with what the remote services recorded
for their keys, alert on each disagreement, undo what should not be in force, keep the
run.

Cost, bounded per run whatever the table holds:

- Finding the sample: range reads of the rest states' entries created in the
  window's days (`UpdatedAt` within `window`, filtered server-side), starting at a
  random order id and wrapping round once (ReconcileStore.finished_sample). The random
  start spreads the runs over the key space, and no run reads every order.
- Asking: at most `sample_size` x steps x providers tried x 3 outcome queries (one GET
  each, a few more only on transient errors within the query's 2 s), `concurrency`
  orders at once, each through the agent's own breaker (shared/usecases/flow/outcomes.py):
  an outage answers "no answer", which is unknown, never a mismatch. A step tried at
  one provider costs what it did (usually one GET); each failover adds one GET (two
  when that provider applied it); an undo that found nothing to undo adds the do-key's,
  and the heal key's when that do applied after it (`rules.heal_key`). With the defaults
  (50 orders, 3 steps, no failover) that is usually 150 GETs an hour, 300 when every
  undo found nothing, 450 at most.
- Writing: one alert message per mismatch, then one undo per effect to take back (the
  alerts in one send and the undos in another, once the alerts were taken), and one row
  for the run.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import timedelta

from shared.catalogue.running import workflow_of
from shared.domain import reconcile as rules
from shared.domain.in_doubt import RemoteOutcome
from shared.domain.machine.transition import ProcessPolicy
from shared.domain.model import OrderProcess
from shared.domain.reconcile import Answers, Mismatch, ReconcileRun, StepCheck, Verdict
from shared.domain.workflow import Catalogue, Workflow
from shared.ports import Clock, MessageBus, ReconcileStore
from shared.telemetry.logsafe import app_logger
from shared.usecases.flow.outcomes import OutcomeQueries

log = app_logger("orders.reconcile")

DEFAULT_SAMPLE_SIZE = 50
DEFAULT_WINDOW = timedelta(hours=24)
"""Orders come to rest this recently are sampled: long enough to catch a late disagreement,
short enough that the services still keep their keys."""
CONCURRENCY = 8
"""Orders checked at once: each asks its steps one after the other."""
RUNS_KEPT = 10
"""Runs the operator page shows."""


def random_start() -> str:
    """A point in the order ids' key space: hex digits, as generated ids start with."""
    return f"{random.getrandbits(16):04x}"


@dataclass(frozen=True)
class Reconciler:
    store: ReconcileStore
    queries: OutcomeQueries
    bus: MessageBus
    clock: Clock
    instance: str
    policy: ProcessPolicy
    """The undo it sends gets the step's complete-by, as the order's own would."""
    sample_size: int = DEFAULT_SAMPLE_SIZE
    window: timedelta = DEFAULT_WINDOW
    concurrency: int = CONCURRENCY
    catalogue: Catalogue = field(kw_only=True)
    """The workflows the sampled orders ran on (an order whose version it no longer
    keeps is not checked)."""
    start: Callable[[], str] = random_start

    async def run(self) -> ReconcileRun:
        """One run. An alert or the run's record that cannot be written is logged and the
        run still returns: the next run will find the same mismatch again."""
        started = self.clock.now()
        sample = await self.store.finished_sample(
            started - self.window, self.start(), self.sample_size
        )
        gate = asyncio.Semaphore(self.concurrency)
        tally = _Tally()

        async def check(process: OrderProcess) -> None:
            async with gate:
                await self._check(process, tally)

        await asyncio.gather(*(check(p) for p in sample[: self.sample_size]))
        finished = self.clock.now()
        undos = [
            # Built now, not when its order was checked: its complete-by counts from the
            # send (a run of many orders outlasts a step's timeout, and an agent drops a
            # request past its complete-by). Its id names the run, so a later run's undo
            # of an effect still found is sent again (the broker would drop it as the
            # earlier one's duplicate); the undo key answers a repeat, never undoing twice.
            replace(undo, message_id=f"{undo.message_id}:{started:%Y%m%dT%H%M%S%f}")
            for heal in tally.heals
            for undo in rules.heals(*heal, finished)
        ]
        run = ReconcileRun(
            instance=self.instance,
            started_at=started,
            finished_at=finished,
            orders=min(len(sample), self.sample_size),
            queries=tally.queries,
            unknown=tally.unknown,
            mismatches=tuple(m for m, _ in tally.mismatches),
        )
        if tally.mismatches:
            log.warning(
                "reconciliation: %d mismatches in %d orders, %d undone: %s",
                len(tally.mismatches),
                run.orders,
                len(undos),
                "; ".join(m.message for m, _ in tally.mismatches),
            )
            alerts = [m.alert(count, finished) for m, count in tally.mismatches]
            try:
                # The alerts first, on their own: the bus may send each queue on its own,
                # and an undo that lands without its alert heals silently, since the next
                # run finds the order right. Alerts without their undos are found again.
                await self.bus.send(alerts)
                if undos:
                    await self.bus.send(undos)
            except Exception as exc:  # the run is still recorded; the next finds it again
                log.warning(
                    "reconciliation alerts and undos not sent (%s: %s)", type(exc).__name__, exc
                )
        try:
            await self.store.record_run(run)
        except Exception as exc:  # the checks stand; only the page misses this run
            log.warning("reconciliation run not recorded (%s: %s)", type(exc).__name__, exc)
        return run

    async def _check(self, process: OrderProcess, tally: _Tally) -> None:
        workflow = workflow_of(self.catalogue, process.state)
        if workflow is None:
            return
        for step in rules.checks(process, workflow):
            answers: dict[tuple[str, str], RemoteOutcome] = {}
            while (asked := rules.next_question(step, answers)) is not None:
                answers[asked] = await self.queries.ask(*asked)
                tally.queries += 1
            if rules.verdict(step, answers) is Verdict.UNKNOWN:
                tally.unknown += 1
            for mismatch in rules.mismatches(step, answers):
                tally.mismatches.append((mismatch, process.state.failure_count))
            tally.heals.append((process, workflow, self.policy, step, answers))


@dataclass
class _Tally:
    queries: int = 0
    unknown: int = 0
    mismatches: list[tuple[Mismatch, int]] = field(default_factory=list)
    heals: list[tuple[OrderProcess, Workflow, ProcessPolicy, StepCheck, Answers]] = field(
        default_factory=list
    )
    """What each undo is built from, once the run ends (`rules.heals`)."""
