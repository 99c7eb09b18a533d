"""The demo's closing lines: the slowest order and where to see why it was slow."""

from __future__ import annotations

from typing import Any, cast

from rich.console import Console

from devhost.demo import Demo, _print_slowest
from devhost.harness.load import Tracked


def view(seconds: int, trace_id: str | None = None) -> dict[str, Any]:
    return {
        "processState": "Processed",
        "createdAt": "2026-11-24T10:00:00Z",
        "updatedAt": f"2026-11-24T10:00:{seconds:02d}Z",
        **({"traceId": trace_id} if trace_id else {}),
    }


def demo_with(views: dict[str, dict[str, Any]]) -> Demo:
    none = cast(Any, None)
    console = Console(record=True, width=200)
    orders = [Tracked(order_id, {}) for order_id in views]
    demo = Demo(console, none, none, none, "http://127.0.0.1:7071/api", "r", orders, set())
    demo.views.update(views)
    return demo


def test_the_summary_names_the_slowest_order_and_its_timeline() -> None:
    demo = demo_with(
        {"d-1": view(3), "d-2": view(9, "ab" * 16), "d-3": {"processState": "Pending"}}
    )
    _print_slowest(demo, "http://127.0.0.1:4318/api/traces")
    text = demo.console.export_text()
    assert "slowest order: d-2 (9.00 s, Processed)" in text
    assert "http://127.0.0.1:7071/api/ops?order=d-2" in text
    assert f"http://127.0.0.1:4318/api/traces/{'ab' * 16}" in text


def test_without_a_trace_id_the_spans_are_found_by_order() -> None:
    demo = demo_with({"d 1": view(2)})
    _print_slowest(demo, "http://127.0.0.1:4318/api/traces")
    assert "http://127.0.0.1:4318/api/traces?orderId=d%201" in demo.console.export_text()
