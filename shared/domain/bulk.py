"""Bulk actions as data: which orders a filter matches, what acting on them would cause
outside, and the durable job's record.

Pure: no I/O. The use case (shared/usecases/operations/bulk.py) reads pages of orders and feeds
them through `matches` and `effects_of`, so a preview and a real run agree on what
"matching" means.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from datetime import datetime
from enum import StrEnum
from typing import Any, Final

from shared.domain.bulk_request import BulkAction, BulkFilter
from shared.domain.failures import failure_of
from shared.domain.machine.migrate import incompatibility
from shared.domain.model import OrderProcess, ProcessState, StepStatus
from shared.domain.workflow import Workflow

SAMPLES: Final = 10


class JobState(StrEnum):
    RUNNING = "Running"
    DONE = "Done"


def states_to_scan(action: BulkAction, flt: BulkFilter) -> tuple[ProcessState, ...]:
    """The filter's state when the action accepts it (else nothing matches), else every
    state the action accepts."""
    if flt.state is None:
        return action.states
    return (flt.state,) if flt.state in action.states else ()


def matches(
    action: BulkAction,
    flt: BulkFilter,
    process: OrderProcess,
    workflow: Workflow | None,
    target: Workflow | None = None,
) -> bool:
    """Does the filter match, and would the single action do something to this order?
    `target`: where a migrate moves the order (see `migration_target`)."""
    return selects(action, flt, process, workflow) and (
        refusal(action, process, workflow, target) is None
    )


def refusal(
    action: BulkAction, process: OrderProcess, workflow: Workflow | None, target: Workflow | None
) -> str | None:
    """Why the single action would refuse an order the filter selects; None for actions
    whose refusals the filter's states already rule out. Every action refuses an order
    whose version the catalogue no longer keeps (nothing can run it here). A migrate has
    its own too: the order's steps done so far must be the same in the target version."""
    if workflow is None:
        state = process.state
        return (
            f"order {process.order_id} runs on {state.workflow} v{state.workflow_version}, "
            "which the catalogue no longer keeps"
        )
    if action is not BulkAction.MIGRATE:
        return None
    if target is None:
        return "the target version is no longer in the catalogue"
    return incompatibility(process, workflow, target)


def selects(
    action: BulkAction, flt: BulkFilter, process: OrderProcess, workflow: Workflow | None
) -> bool:
    """Does the filter match an order in a state the action accepts?"""
    state = process.state
    if state.process_state not in states_to_scan(action, flt):
        return False
    if (
        action is BulkAction.CANCEL
        and state.cancel_requested
        and not state.process_state.is_at_rest
    ):
        return False
    if flt.customer_id is not None and process.order.customer_id != flt.customer_id:
        return False
    if flt.workflow is not None and state.workflow != flt.workflow:
        return False
    if flt.workflow_version is not None and state.workflow_version != flt.workflow_version:
        return False
    if flt.created_from is not None and state.created_at < flt.created_from:
        return False
    if flt.created_to is not None and state.created_at >= flt.created_to:
        return False
    if flt.step is not None or flt.error_code is not None:
        failure = failure_of(state, workflow)
        if flt.step is not None and failure.step != flt.step:
            return False
        if flt.error_code is not None and failure.error_code != flt.error_code:
            return False
    return True


def needs_steps(action: BulkAction) -> bool:
    """Does matching an order and naming what the action causes need its steps? A
    resubmit's and a resume's need only its state, which an order at rest's entry holds
    (shared/domain/rest_index.py), so their preview reads no order."""
    return action not in (BulkAction.RESUBMIT, BulkAction.RESUME)


def effects_of(
    action: BulkAction, process: OrderProcess, workflow: Workflow | None
) -> tuple[str, ...]:
    """The remote operations the action would cause for this order.

    A cancel undoes every step that completed, is running, or is in doubt (dispatched
    with no answer): the Scheduler compensates those (shared/domain/machine/operator.py:cancel). A
    resubmit re-runs the step the order stopped at (its undo, when it stopped while
    compensating). Suspend, resume and migrate cause no remote call by themselves.
    """
    if workflow is None:
        return ()
    if action is BulkAction.CANCEL:
        undone = []
        for definition, step in zip(workflow.steps, process.steps, strict=False):
            in_doubt = step.status is StepStatus.NOT_STARTED and step.attempts > 0
            if definition.compensation and (
                step.status in (StepStatus.COMPLETED, StepStatus.RUNNING) or in_doubt
            ):
                undone.append(definition.compensation)
        return tuple(reversed(undone))
    if action is BulkAction.RESUBMIT:
        return (failure_of(process.state, workflow).step,)
    return ()


@dataclass
class Preview:
    """What a dry run answers; also the count a real run starts with."""

    matched: int = 0
    sample_order_ids: list[str] = field(default_factory=list)
    effects: Counter[str] = field(default_factory=Counter)
    refused: int = 0
    """Orders the filter selects that the action would refuse (a migrate's incompatible
    orders): not counted in `matched`, never acted on."""
    refusals: list[dict[str, str]] = field(default_factory=list)

    def consider(
        self,
        action: BulkAction,
        flt: BulkFilter,
        process: OrderProcess,
        workflow: Workflow | None,
        target: Workflow | None = None,
    ) -> bool:
        """Count the order as matched or refused; True when it matched."""
        if not selects(action, flt, process, workflow):
            return False
        reason = refusal(action, process, workflow, target)
        if reason is None:
            self.add(action, process, workflow)
            return True
        self.refused += 1
        if len(self.refusals) < SAMPLES:
            self.refusals.append({"orderId": process.order_id, "reason": reason})
        return False

    def add(self, action: BulkAction, process: OrderProcess, workflow: Workflow | None) -> None:
        self.matched += 1
        if len(self.sample_order_ids) < SAMPLES:
            self.sample_order_ids.append(process.order_id)
        self.effects.update(effects_of(action, process, workflow))

    def effects_view(self) -> list[dict[str, Any]]:
        ordered = sorted(self.effects.items(), key=lambda kv: (-kv[1], kv[0]))
        return [{"operation": op, "count": n} for op, n in ordered]


@dataclass(frozen=True)
class Cursor:
    """Where the scan stands: the index into the states to scan and the store's
    continuation within that state; `state_index` past the end means exhausted."""

    state_index: int = 0
    continuation: str | None = None


@dataclass(frozen=True)
class BulkJob:
    """The durable job: stored in the state table, changed only ETag-conditionally.

    `in_flight` is the page being acted on: written before the first action and cleared
    with the counters after the last, so a run that died in between knows exactly which
    orders may already have been acted on (and checks their history) instead of acting
    twice. `next_cursor` is where the scan continues after that page.
    """

    bulk_id: str
    action: BulkAction
    filter: BulkFilter
    matched: int
    created_at: datetime
    updated_at: datetime
    operator: str = "operator"
    to_version: int | None = None
    """migrate only: the version of `filter.workflow` the orders move to."""
    state: JobState = JobState.RUNNING
    done: int = 0
    skipped: int = 0
    failed: int = 0
    cursor: Cursor = Cursor()
    in_flight: tuple[str, ...] = ()
    next_cursor: Cursor | None = None
    etag: str | None = None

    @property
    def acted(self) -> int:
        return self.done + self.skipped + self.failed

    @property
    def remaining(self) -> int:
        """The job acts on at most as many orders as the preview counted; once it is
        Done, none remain (`finished`)."""
        return max(0, self.matched - self.acted)

    @property
    def actor(self) -> str:
        """The operator name the single action records in the order's history: it is
        how a re-run tells that this job already acted on an order."""
        return f"bulk:{self.bulk_id}"

    def counted(self, done: int, skipped: int, failed: int, now: datetime) -> BulkJob:
        return replace(
            self,
            done=self.done + done,
            skipped=self.skipped + skipped,
            failed=self.failed + failed,
            updated_at=now,
        )

    def finished(self, now: datetime) -> BulkJob:
        """Done, with every order it matched accounted for: the scan has passed them
        all, so an order the preview counted that the scan did not find still matching
        (it moved on before its turn: another operator or another job acted on it, it
        failed, it finished) was skipped, as the contract says. Without this, a job
        reported done + skipped + failed < matched, and a second identical job started
        beside the first reported nothing at all for orders the first had taken."""
        return replace(
            self, state=JobState.DONE, skipped=self.skipped + self.remaining, updated_at=now
        )


@dataclass(frozen=True)
class Lease:
    """Who works the bulk jobs until when: one row, changed only ETag-conditionally, so
    of the instances whose timers tick together one holds it and the others pass."""

    holder: str
    until: datetime
    etag: str | None = None

    def free(self, now: datetime) -> bool:
        return self.until <= now


def acted_by(details: Iterable[str], actor: str) -> bool:
    """Does an order's history show an action by `actor` (see BulkJob.actor)?"""
    mark = f"by {actor}"
    return any(
        d == mark or d.startswith((f"{mark}:", f"{mark},")) or d.endswith(f" {mark}")
        for d in details
    )
