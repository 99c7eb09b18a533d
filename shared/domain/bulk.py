"""Bulk actions as data: which orders a filter matches, what acting on them would cause
outside, and the durable job's record.

Pure: no I/O. The use case (shared/usecases/bulk.py) reads pages of orders and feeds
them through `matches` and `effects_of`, so a preview and a real run agree on what
"matching" means.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any, Final

from shared.domain.failures import failure_of
from shared.domain.machine.migrate import incompatibility
from shared.domain.model import OrderProcess, ProcessState, StepStatus
from shared.domain.workflow import Catalogue, Workflow

MAX_LIMIT: Final = 100_000
SAMPLES: Final = 10
_FILTER_KEYS: Final = (
    "state",
    "step",
    "errorCode",
    "customerId",
    "createdFrom",
    "createdTo",
    "workflow",
    "workflowVersion",
)
_INT_FILTER_KEYS: Final = frozenset({"workflowVersion"})
_BODY_KEYS: Final = {"action", "filter", "dryRun", "limit", "toVersion"}
MAX_VERSION: Final = 1_000_000
MAX_TEXT: Final = 200


class BulkAction(StrEnum):
    RESUBMIT = "resubmit"
    CANCEL = "cancel"
    SUSPEND = "suspend"
    RESUME = "resume"
    MIGRATE = "migrate"

    @property
    def states(self) -> tuple[ProcessState, ...]:
        """The states the single action accepts: only those are scanned, so a bulk job
        never reads the Processed history that makes up most of the table."""
        if self is BulkAction.RESUBMIT:
            return (ProcessState.ERROR,)
        if self is BulkAction.RESUME:
            return (ProcessState.SUSPENDED,)
        if self is BulkAction.SUSPEND:
            return (ProcessState.PENDING, ProcessState.PROCESSING, ProcessState.COMPENSATING)
        return (
            ProcessState.ERROR,
            ProcessState.SUSPENDED,
            ProcessState.PENDING,
            ProcessState.PROCESSING,
            ProcessState.COMPENSATING,
        )


class JobState(StrEnum):
    RUNNING = "Running"
    DONE = "Done"


class BulkRequestError(ValueError):
    """A bulk request that cannot be accepted; `title` and the message go to the 400."""

    def __init__(self, title: str, detail: str) -> None:
        super().__init__(detail)
        self.title = title


@dataclass(frozen=True)
class BulkFilter:
    state: ProcessState | None = None
    step: str | None = None
    error_code: str | None = None
    customer_id: str | None = None
    created_from: datetime | None = None
    created_to: datetime | None = None
    """Exclusive: orders created before this instant."""
    workflow: str | None = None
    workflow_version: int | None = None
    """Only with `workflow`: a version means nothing without its workflow."""

    def to_json(self) -> dict[str, Any]:
        values: dict[str, Any] = {
            "state": self.state.value if self.state else None,
            "step": self.step,
            "errorCode": self.error_code,
            "customerId": self.customer_id,
            "createdFrom": _iso(self.created_from),
            "createdTo": _iso(self.created_to),
            "workflow": self.workflow,
            "workflowVersion": self.workflow_version,
        }
        return {k: v for k, v in values.items() if v is not None}


@dataclass(frozen=True)
class BulkRequest:
    action: BulkAction
    filter: BulkFilter
    dry_run: bool = False
    limit: int | None = None
    to_version: int | None = None
    """migrate only: the version of `filter.workflow` the orders move to."""


def parse_request(data: Any) -> BulkRequest:
    """The body of POST /api/orders/bulk, or BulkRequestError saying what is wrong."""
    if not isinstance(data, dict):
        raise BulkRequestError("Invalid body", "the body is a JSON object")
    unknown = sorted(set(data) - _BODY_KEYS)
    if unknown:
        raise BulkRequestError("Invalid body", f"unknown fields: {', '.join(unknown)}")
    raw_action = data.get("action")
    try:
        action = BulkAction(str(raw_action))
    except ValueError:
        allowed = ", ".join(a.value for a in BulkAction)
        raise BulkRequestError(
            "Invalid action", f"action must be one of {allowed}, got {raw_action!r}"[:300]
        ) from None
    dry_run = data.get("dryRun", False)
    if not isinstance(dry_run, bool):
        raise BulkRequestError("Invalid dryRun", "dryRun must be true or false")
    limit = whole_number(data.get("limit"))
    if limit is not None and (
        isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_LIMIT
    ):
        raise BulkRequestError(
            "Invalid limit", f"limit must be a whole number from 1 to {MAX_LIMIT}"
        )
    flt = parse_filter(data.get("filter"))
    to_version = data.get("toVersion")
    if action is not BulkAction.MIGRATE:
        if to_version is not None:
            raise BulkRequestError(
                "Invalid toVersion", f"toVersion is only for migrate, not {action.value}"
            )
        return BulkRequest(action, flt, dry_run, limit)
    if to_version is None:
        raise BulkRequestError(
            "Invalid toVersion", "migrate needs toVersion: the version the orders move to"
        )
    if not _whole(to_version):
        raise BulkRequestError(
            "Invalid toVersion", f"toVersion must be a whole number from 1 to {MAX_VERSION}"
        )
    if flt.workflow is None:
        raise BulkRequestError(
            "Invalid filter", "migrate needs filter.workflow: the workflow whose orders move"
        )
    if flt.workflow_version == to_version:
        raise BulkRequestError(
            "Invalid toVersion",
            f"toVersion {to_version} is filter.workflowVersion: the orders are already there",
        )
    return BulkRequest(action, flt, dry_run, limit, to_version)


def migration_target(request: BulkRequest, catalogue: Catalogue) -> Workflow | None:
    """The workflow version a migrate moves orders to (None for other actions), or
    BulkRequestError naming the versions the catalogue keeps."""
    if request.action is not BulkAction.MIGRATE:
        return None
    name = request.filter.workflow or ""
    target = catalogue.get(name, request.to_version)
    if target is not None:
        return target
    kept = sorted(w.version for w in catalogue.workflows if w.name == name)
    if not kept:
        known = ", ".join(catalogue.names)
        raise BulkRequestError(
            "Unknown workflow", f"no workflow {name!r} in the catalogue; it has {known}"[:300]
        )
    versions = ", ".join(f"v{v}" for v in kept)
    raise BulkRequestError(
        "Unknown version",
        f"{name} has no v{request.to_version} in the catalogue; it keeps {versions}"[:300],
    )


def _whole(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= MAX_VERSION


def whole_number(value: Any) -> Any:
    """A JSON number that is whole (`303.0`) as the integer it is, as JSON Schema reads
    it and as the order intake already does; anything else unchanged, to be refused."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


def parse_filter(data: Any) -> BulkFilter:
    if data is None:
        raise BulkRequestError(
            "Empty filter", "a filter is required: bulk actions never match everything"
        )
    if not isinstance(data, dict):
        raise BulkRequestError("Invalid filter", "filter is a JSON object")
    unknown = sorted(set(data) - set(_FILTER_KEYS))
    if unknown:
        raise BulkRequestError("Invalid filter", f"unknown filter fields: {', '.join(unknown)}")
    given = {k: v for k, v in data.items() if v is not None}
    if not given:
        raise BulkRequestError(
            "Empty filter", "the filter names nothing: bulk actions never match everything"
        )
    for key, value in given.items():
        if key in _INT_FILTER_KEYS:
            if not _whole(value):
                raise BulkRequestError(
                    "Invalid filter",
                    f"filter.{key} must be a whole number from 1 to {MAX_VERSION}",
                )
        elif not isinstance(value, str) or not value or len(value) > MAX_TEXT:
            raise BulkRequestError(
                "Invalid filter", f"filter.{key} must be a non-empty string of at most {MAX_TEXT}"
            )
    state: ProcessState | None = None
    if "state" in given:
        try:
            state = ProcessState(given["state"])
        except ValueError:
            allowed = ", ".join(s.value for s in ProcessState)
            raise BulkRequestError(
                "Invalid filter", f"filter.state must be one of {allowed}"
            ) from None
    created_from = _date(given, "createdFrom")
    created_to = _date(given, "createdTo")
    if created_from and created_to and created_from >= created_to:
        raise BulkRequestError(
            "Invalid filter", "filter.createdFrom must be before filter.createdTo"
        )
    if "workflowVersion" in given and "workflow" not in given:
        raise BulkRequestError(
            "Invalid filter",
            "filter.workflowVersion needs filter.workflow: versions are per workflow",
        )
    return BulkFilter(
        state=state,
        step=given.get("step"),
        error_code=given.get("errorCode"),
        customer_id=given.get("customerId"),
        created_from=created_from,
        created_to=created_to,
        workflow=given.get("workflow"),
        workflow_version=given.get("workflowVersion"),
    )


def _date(given: Mapping[str, Any], key: str) -> datetime | None:
    raw = given.get(key)
    if raw is None:
        return None
    try:
        at = datetime.fromisoformat(str(raw).replace("Z", "+00:00"))
        return (at if at.tzinfo else at.replace(tzinfo=UTC)).astimezone(UTC)
    except ValueError:
        raise BulkRequestError(
            "Invalid filter",
            f"filter.{key} must be an ISO 8601 date or date-time, e.g. 2026-01-31T00:00:00Z",
        ) from None
    except OverflowError:
        # 0001-01-01T00:00:00+14:00 is a valid date whose UTC time is before year 1.
        raise BulkRequestError(
            "Invalid filter", f"filter.{key} is outside the range of dates in UTC"
        ) from None


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
    whose refusals the filter's states already rule out. Only a migrate has its own: the
    order's steps done so far must be the same in the target version."""
    if action is not BulkAction.MIGRATE:
        return None
    if target is None:
        return "the target version is no longer in the catalogue"
    if workflow is None:
        state = process.state
        return (
            f"order {process.order_id} runs on {state.workflow} v{state.workflow_version}, "
            "which the catalogue no longer keeps"
        )
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
        and not state.process_state.is_terminal
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


def effects_of(
    action: BulkAction, process: OrderProcess, workflow: Workflow | None
) -> tuple[str, ...]:
    """The remote operations the action would cause for this order.

    A cancel undoes every step that completed, is running, or is in doubt (dispatched
    with no answer): the Scheduler compensates those (shared/domain/process.py). A
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
        """The job acts on at most as many orders as the preview counted."""
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


def _iso(at: datetime | None) -> str | None:
    return at.astimezone(UTC).isoformat().replace("+00:00", "Z") if at else None
