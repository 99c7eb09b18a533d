"""`bench.compare` prints the pinned per-order counts (bench/order_counts.py)."""

from __future__ import annotations

from rich.console import Console

from bench.compare import pinned_counts
from bench.order_counts import FINAL_ONLY, HEADERS, PINNED, OrderCounts


def printed(
    pinned: dict[str, OrderCounts], final_only: dict[str, OrderCounts] | None = None
) -> str:
    console = Console(record=True, width=250)
    console.print(pinned_counts(pinned, final_only or {}))
    return console.export_text()


def test_each_workflow_is_one_row_with_its_totals() -> None:
    counts = OrderCounts(
        messages={"scheduler": 1, "order-status": 2},
        table={"insert": 2, "If-Match replace": 3, "merge": 1},
        invocations={"scheduler_nudge": 1, "scheduler_reply": 4},
        http={"submit_order_http": 1},
        remote_calls={"inventory": 1},
    )
    text = printed({"some-flow": counts})
    (line,) = [line for line in text.splitlines() if "some-flow" in line]
    cells = [cell.strip() for cell in line.strip().strip("│┃").split("│")]
    assert len(cells) == len(HEADERS)
    by_header = dict(zip(HEADERS, cells, strict=True))
    assert by_header["messages"] == "3"
    assert by_header["Service Bus credits"] == "6"
    assert by_header["table requests"] == "6"  # the merge has no column but counts
    assert by_header["insert"] == "2" and by_header["If-Match replace"] == "3"
    assert by_header["upsert"] == "0" and by_header["point read"] == "0"
    assert by_header["trigger invocations"] == "5"
    assert by_header["HTTP requests"] == "1"


def test_the_default_printout_is_the_pinned_table() -> None:
    text = printed(dict(PINNED), dict(FINAL_ONLY))
    assert all(name in text for name in PINNED)
    (line,) = [line for line in text.splitlines() if "order-fulfilment, notify final" in line]
    cells = [cell.strip() for cell in line.strip().strip("│┃").split("│")]
    expected = FINAL_ONLY["order-fulfilment"].total_messages
    assert dict(zip(HEADERS, cells, strict=True))["messages"] == str(expected)
