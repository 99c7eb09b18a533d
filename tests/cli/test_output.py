"""Formatting: tables line up, nothing is multi-line, long text is cut, times are UTC."""

from __future__ import annotations

import io
import json
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

from shared.cli import output
from shared.cli.commands import Console
from shared.cli.deadletters import DeadLetter, Peeked, Settled, Settlement

STATE: dict[str, Any] = {
    "orderId": "o-1",
    "processState": "Error",
    "lockedBy": None,
    "completeBy": None,
    "failureCount": 3,
    "attempt": 4,
    "phase": "forward",
    "currentStep": 1,
    "lastError": "step create-shipment passed its complete-by\nat attempt 4",
    "createdAt": "2026-01-02T03:04:05.678000+00:00",
    "updatedAt": "2026-01-02T03:04:09+00:00",
}
VIEW: dict[str, Any] = {
    **STATE,
    "customerId": "c-1",
    "priority": "normal",
    "replyTo": None,
    "items": [{"sku": "SKU-1", "quantity": 2, "unitPrice": 5.0}],
    "steps": [
        {"name": "reserve-inventory", "status": "Completed", "attempts": 1, "completeBy": None},
        {
            "name": "create-shipment",
            "status": "Running",
            "attempts": 3,
            "completeBy": "2026-01-02T03:05:00Z",
            "error": {"code": "timeout", "message": "no answer"},
        },
    ],
    "history": [
        {
            "at": "2026-01-02T03:04:05Z",
            "event": "received",
            "detail": None,
            "processState": "Pending",
            "failureCount": 0,
            "attempt": 0,
        }
    ],
}


def test_table_columns_line_up_and_empty_cells_show_a_dash() -> None:
    text = output.table(["A", "LONGER"], [["xxxx", None], ["y", "z"]])
    assert text.splitlines() == ["A     LONGER", "xxxx  -", "y     z"]


def test_cells_are_one_line_and_cut_with_an_ellipsis() -> None:
    assert output.cell("a\nb  c") == "a b c"
    assert output.cell("abcdefgh", 5) == "abcd…"


def test_times_are_shown_in_utc_to_the_second() -> None:
    assert output.when("2026-01-02T03:04:05.678Z") == "2026-01-02 03:04:05Z"
    plus_two = datetime(2026, 1, 2, 5, 4, 5, tzinfo=timezone(timedelta(hours=2)))
    assert output.when(plus_two) == "2026-01-02 03:04:05Z"
    assert output.when(None) == "-"
    assert output.when("yesterday") == "yesterday"


def test_orders_table_has_a_row_per_order() -> None:
    lines = output.orders_table([STATE, {**STATE, "orderId": "o-2", "lastError": None}])
    header = lines.splitlines()[0]
    assert header.startswith("ORDER ID  STATE") and header.endswith("LAST ERROR")
    assert all(column in header for column in output.ORDER_COLUMNS)
    assert "o-1       Error  3         1       4" in lines
    assert "2026-01-02 03:04:09Z" in lines
    assert len(lines.splitlines()) == 3
    assert output.orders_table([]) == "no orders"


def test_order_details_show_state_steps_and_history() -> None:
    text = output.order_details(VIEW)
    assert "state         Error" in text
    assert "current step  create-shipment (#1)" in text
    assert "items         SKU-1 x2 @ 5.0" in text
    assert "last error    step create-shipment passed its complete-by at attempt 4" in text
    steps = text.split("STEPS\n")[1].split("\n\nHISTORY")[0].splitlines()
    assert steps[0].split() == ["STEP", "STATUS", "ATTEMPTS", "COMPLETE", "BY", "ERROR"]
    assert steps[2].split() == [
        "create-shipment", "Running", "3", "2026-01-02", "03:05:00Z", "timeout:", "no", "answer",
    ]  # fmt: skip
    assert "2026-01-02 03:04:05Z  received  Pending" in text


def test_watch_changes_report_new_history_and_step_changes_only() -> None:
    assert output.changes(None, VIEW) == ["o-1: Error (failures 3, step create-shipment (#1))"]
    assert output.changes(VIEW, VIEW) == []
    later = json.loads(json.dumps(VIEW))
    later["processState"] = "Pending"
    later["steps"][1]["status"] = "NotStarted"
    later["history"].append(
        {
            "at": "2026-01-02T03:06:00Z",
            "event": "resubmitted",
            "detail": "by ann",
            "processState": "Pending",
            "failureCount": 0,
            "attempt": 4,
        }
    )
    assert output.changes(VIEW, later) == [
        "2026-01-02 03:06:00Z  resubmitted  -> Pending  by ann",
        "step create-shipment: NotStarted (attempts 3)",
    ]
    only_state = {**VIEW, "processState": "Processing"}
    assert output.changes(VIEW, only_state) == ["state Error -> Processing"]


def dead_letter(**fields: Any) -> DeadLetter:
    base: dict[str, Any] = {
        "queue": "agent-payment",
        "message_id": "m-1",
        "sequence_number": 7,
        "enqueued_at": datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC),
        "delivery_count": 10,
        "reason": "MaxDeliveryCountExceeded",
        "description": "too many",
        "properties": {"poisonReason": "bad-json", "poisonDetail": "line 1"},
        "body": b'{"orderId": "o-1",\n "step": "charge-payment"}',
        "body_size": 44,
    }
    return DeadLetter(**{**base, **fields})


def test_dead_letters_text_shows_every_field_and_names_the_empty_queues() -> None:
    text = output.dead_letters_text(
        [Peeked("agent-payment", [dead_letter()], more=True), Peeked("orders", [], more=False)],
        limit=20,
    )
    assert "agent-payment/$DeadLetterQueue: 1 message (first 1; raise --max to see more)" in text
    assert "m-1  seq 7  enqueued 2026-01-02 03:04:05Z  deliveries 10" in text
    assert "reason       MaxDeliveryCountExceeded" in text
    assert "description  too many" in text
    assert "properties   poisonReason=bad-json poisonDetail=line 1" in text
    assert 'body         {"orderId": "o-1", … (44 bytes)' in text
    assert text.endswith("no dead letters on: orders")


def test_dead_letter_json_is_serialisable() -> None:
    value = output.dead_letter_json(dead_letter(body=None, body_size=0), limit=10)
    decoded = json.loads(output.to_json(value))
    assert decoded["enqueuedTime"] == "2026-01-02T03:04:05+00:00"
    assert decoded["bodyExcerpt"] == "(not a data body)"
    assert decoded["applicationProperties"]["poisonReason"] == "bad-json"


def test_settlement_text_and_json() -> None:
    result = Settlement(
        "orders",
        done=[Settled("m-1", 3, "m-1~requeue-3")],
        skipped=[("m-2", "value body: move it by hand")],
    )
    text = output.settlement_text(result, "requeued")
    assert text.splitlines() == [
        "requeued m-1 (seq 3) to orders as m-1~requeue-3",
        "skipped m-2: value body: move it by hand",
        "requeued 1 message from orders/$DeadLetterQueue",
    ]
    assert output.settlement_json(result)["done"] == [
        {"messageId": "m-1", "sequenceNumber": 3, "newMessageId": "m-1~requeue-3"}
    ]


def test_a_lone_surrogate_is_shown_as_its_escape_on_a_utf8_terminal() -> None:
    """An order stored before the edge refused them (issue 41): printing it raised
    UnicodeEncodeError, and the CLI died showing it. As JSON the escape is the same
    text; in a table, a readable one."""
    written = io.BytesIO()
    out = io.TextIOWrapper(written, encoding="utf-8", errors="strict")
    console = Console(out, True)
    console.data({**STATE, "lastError": "cancelled: \ud800x"})
    console.show(output.orders_table([{**STATE, "lastError": "cancelled: \ud800x"}]))
    out.flush()
    document, table = written.getvalue().decode("utf-8").split("\n}\n")
    assert json.loads(document + "}")["lastError"] == "cancelled: \ud800x"
    assert "cancelled: \\ud800x" in table
