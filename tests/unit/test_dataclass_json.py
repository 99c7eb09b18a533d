"""The generic codec that stores step records as JSON: fields added later round-trip."""

from __future__ import annotations

import dataclasses
import json
from datetime import UTC, datetime
from typing import Any

from shared.adapters.dataclass_json import from_json, to_json
from shared.domain.model import ErrorInfo, StepRecord, StepStatus

AT = datetime(2030, 5, 6, 7, 8, 9, 123456, tzinfo=UTC)

StepRecordOfTomorrow = dataclasses.make_dataclass(
    "StepRecordOfTomorrow",
    [
        ("routed_to", str | None, dataclasses.field(default=None)),
        ("retries_left", int, dataclasses.field(default=3)),
        ("tags", tuple[str, ...], dataclasses.field(default=())),
        ("last_error", ErrorInfo | None, dataclasses.field(default=None)),
    ],
    bases=(StepRecord,),
    frozen=True,
)


def a_full_step() -> StepRecord:
    return StepRecord(
        name="charge-payment",
        status=StepStatus.FAILED,
        attempts=2,
        complete_by=AT,
        result={"id": "p-1", "lines": [1, 2.5, None, "ü"]},
        error=ErrorInfo("declined", "no funds"),
        compensation_attempts=1,
    )


def through_json(value: object) -> object:
    return json.loads(json.dumps(to_json(value)))


def test_every_field_of_a_step_round_trips() -> None:
    step = a_full_step()
    assert from_json(StepRecord, through_json(step)) == step


def test_fields_at_their_defaults_are_left_out() -> None:
    assert through_json(StepRecord("reserve-inventory")) == {"name": "reserve-inventory"}
    assert from_json(StepRecord, {"name": "x"}) == StepRecord("x")


def test_a_field_added_later_round_trips_without_a_change_to_the_codec() -> None:
    fields = {f.name: getattr(a_full_step(), f.name) for f in dataclasses.fields(StepRecord)}
    step = StepRecordOfTomorrow(
        **fields,
        routed_to="payment-secondary",
        retries_left=0,
        tags=("a", "b"),
        last_error=ErrorInfo("timeout", "slow"),
    )
    assert from_json(StepRecordOfTomorrow, through_json(step)) == step


def test_records_written_before_a_field_existed_read_with_its_default() -> None:
    old = through_json(a_full_step())
    new: Any = from_json(StepRecordOfTomorrow, old)
    assert new.routed_to is None and new.retries_left == 3 and new.tags == ()
    assert new.error == ErrorInfo("declined", "no funds")


def test_keys_no_field_claims_are_ignored() -> None:
    written = through_json(StepRecordOfTomorrow("x", routed_to="elsewhere"))
    assert from_json(StepRecord, written) == StepRecord("x")
