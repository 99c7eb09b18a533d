"""A bulk request as the API takes it: the action, the filter, the limit, checked field by
field so that every refusal is a 400 naming the field (never a 500 from a date or a
number out of range)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any, Final

from shared.domain.messages import NO_CONTROL_CHARACTERS
from shared.domain.model import ProcessState
from shared.domain.rfc3339 import EXAMPLE, parse_date_time
from shared.domain.workflow import Catalogue, Workflow

MAX_LIMIT: Final = 100_000
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
CONTROL: Final = re.compile(NO_CONTROL_CHARACTERS.replace("^[^", "[").replace("]*$", "]"))
"""No stored name has one (names refuse them at the intake), and a filter is a query."""


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
    to_version = whole_number(data.get("toVersion"))
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
    it and as the order intake already does; anything else unchanged, to be refused.
    Every integer field of the request goes through it (limit, toVersion,
    filter.workflowVersion), so `1.0` is never taken in one and refused in another."""
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
    given = {
        k: whole_number(v) if k in _INT_FILTER_KEYS else v for k, v in data.items() if v is not None
    }
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
        elif CONTROL.search(value):
            raise BulkRequestError(
                "Invalid filter", f"filter.{key} must not contain control characters"
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
        return parse_date_time(str(raw)).astimezone(UTC)
    except ValueError:
        raise BulkRequestError(
            "Invalid filter",
            f"filter.{key} must be an RFC 3339 date-time with an offset, e.g. {EXAMPLE}",
        ) from None
    except OverflowError:
        # 0001-01-01T00:00:00+14:00 is a valid date whose UTC time is before year 1.
        raise BulkRequestError(
            "Invalid filter", f"filter.{key} is outside the range of dates in UTC"
        ) from None


def _iso(at: datetime | None) -> str | None:
    return at.astimezone(UTC).isoformat().replace("+00:00", "Z") if at else None
