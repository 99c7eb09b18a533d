"""The retention policy: what is due, what never is, and how pages are named."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, date, datetime, timedelta

import pytest

from shared.domain.archive import (
    PageEntry,
    RetentionPolicy,
    archive_day,
    blob_name,
    by_day,
    page_id,
    parse_day,
)
from shared.domain.machine.forward import start
from shared.domain.model import ProcessState, StateRecord
from tests.builders import an_order
from tests.workflows import ORDER_FULFILMENT

NOW = datetime(2026, 12, 31, 12, 0, tzinfo=UTC)
DAY = timedelta(days=1)


def a_state(state: ProcessState, updated_at: datetime) -> StateRecord:
    record = start(an_order(), ORDER_FULFILMENT, updated_at).process.state
    return replace(record, process_state=state, updated_at=updated_at)


@pytest.mark.parametrize(
    ("state", "age", "due"),
    [
        (ProcessState.PROCESSED, 30 * DAY, True),
        (ProcessState.PROCESSED, 30 * DAY - timedelta(seconds=1), False),
        (ProcessState.CANCELLED, 89 * DAY, False),
        (ProcessState.CANCELLED, 90 * DAY, True),
        (ProcessState.COMPENSATED, 90 * DAY, True),
        (ProcessState.COMPENSATED, 60 * DAY, False),
    ],
)
def test_a_final_order_is_due_once_its_state_retention_has_passed(
    state: ProcessState, age: timedelta, due: bool
) -> None:
    assert RetentionPolicy().is_due(a_state(state, NOW - age), NOW) is due


@pytest.mark.parametrize("state", [s for s in ProcessState if not s.is_final])
def test_an_order_that_is_not_final_is_never_due_however_old(state: ProcessState) -> None:
    """Error too: an operator may still resubmit it."""
    policy = RetentionPolicy(timedelta(0), timedelta(0), timedelta(0))
    assert not policy.is_due(a_state(state, NOW - 10_000 * DAY), NOW)
    assert policy.retention(state) is None
    assert state not in policy.cutoffs(NOW)


def test_a_state_kept_forever_is_neither_due_nor_asked_for() -> None:
    policy = RetentionPolicy(processed=None)
    assert not policy.is_due(a_state(ProcessState.PROCESSED, NOW - 10_000 * DAY), NOW)
    assert policy.cutoffs(NOW) == {
        ProcessState.CANCELLED: NOW - 90 * DAY,
        ProcessState.COMPENSATED: NOW - 90 * DAY,
    }


def test_an_order_is_archived_under_the_utc_day_it_finished() -> None:
    late = datetime(2026, 3, 3, 23, 30, tzinfo=UTC)
    assert archive_day(late) == date(2026, 3, 3)
    assert blob_name("abc", archive_day(late)) == "2026/03/03/abc.jsonl.gz"


def test_a_page_is_named_by_what_it_holds_in_any_order() -> None:
    a = PageEntry("a", "e1", date(2026, 3, 3))
    b = PageEntry("b", "e2", date(2026, 3, 4))
    assert page_id([a, b]) == page_id([b, a])
    assert page_id([a, b]) != page_id([a, replace(b, etag="e3")])
    assert page_id([a]) != page_id([a, b])
    assert by_day([a, b]) == {date(2026, 3, 3): [a], date(2026, 3, 4): [b]}


@pytest.mark.parametrize("text", ["2026-3-3", "2026/03/03", "../etc", ""])
def test_a_day_is_read_only_as_yyyy_mm_dd(text: str) -> None:
    with pytest.raises(ValueError, match="yyyy-mm-dd"):
        parse_day(text)
    assert parse_day("2026-03-03") == date(2026, 3, 3)
