"""bench.cost_model's arithmetic on known counts and round prices."""

from __future__ import annotations

from dataclasses import replace

import pytest

from bench.cost_model import (
    Activity,
    Assumptions,
    OrderCounts,
    Price,
    Prices,
    activity_from_run,
    always_ready_per_month,
    assumption_notes,
    bills,
    counts_from_run,
    load_table,
    markdown,
    ours,
    peer_durable_functions,
    peer_step_functions,
    peer_step_functions_express,
    peer_temporal,
    price_notes,
    remote_calls,
    traced_share,
)


def _price(usd: float) -> Price:
    return Price(usd, "test", verified=True)


ROUND = Prices(
    service_bus_per_million_ops=_price(1.0),
    service_bus_base_per_hour=_price(0.0),
    storage_per_10k_transactions=_price(1.0),
    flex_per_million_executions=_price(1.0),
    flex_per_gb_second=_price(0.000001),
    flex_always_ready_baseline_per_gb_second=_price(0.0),
    log_analytics_per_gb=_price(1.0),
    step_functions_per_1k_transitions=_price(0.025),
    step_functions_express_per_million_requests=_price(1.0),
    step_functions_express_per_gb_second=_price(0.00001),
    temporal_per_million_actions=_price(50.0),
)
ORDER = OrderCounts(state_store=8, messages=10, executions=8, remote_calls=3)
BUSY = Activity(10.0, 0.2, 0.8, 2, "test")
"""0.8 billed instance-seconds per order: 0.1 s per execution, the figure once assumed."""
A = Assumptions(activity=BUSY)


def test_our_bill_per_meter() -> None:
    bill = ours(ORDER, ROUND, A)
    cost = {line.meter: line.usd_per_million_orders for line in bill.lines}
    assert cost == pytest.approx(
        {
            "Service Bus Standard operations": 30.0,  # 10 messages x 3 operations
            "Table Storage transactions": 800.0,  # 8 x 1e6 / 1e4
            "Flex Consumption executions": 8.0,
            "Flex Consumption memory": 1.6,  # 0.8 instance-s x 2 GB = 1.6 GB-s per order
            "Application Insights: the app's spans": 2.9,  # 29 spans x 1 kB x 10% traced
            "Application Insights: the host's requests": 8.0,  # 8 records x 1 kB
        }
    )
    assert bill.total == pytest.approx(850.5)


def test_a_retry_waits_its_backoff_inside_a_billed_execution() -> None:
    faulty = OrderCounts(state_store=8, messages=10, executions=8, remote_calls=4, faults=0.25)
    memory = {line.meter: line.per_order for line in ours(faulty, ROUND, A).lines}
    assert memory["Flex Consumption memory"] == pytest.approx((0.8 + 1 * 0.2) * 2)


def test_retries_and_the_traced_share_with_faults() -> None:
    assert remote_calls(0.0) == 3
    assert remote_calls(0.1) == pytest.approx(3 / 0.9)
    assert traced_share(0.0, A) == pytest.approx(0.1)
    # 10% sampled, and every order with at least one of its 3 calls failing: 1 - 0.9^3.
    assert traced_share(0.1, A) == pytest.approx(0.1 + 0.9 * 0.271)


def test_peers_for_the_same_three_step_order() -> None:
    assert peer_step_functions(0.0, ROUND).total == pytest.approx(100.0)  # 4 transitions
    assert peer_step_functions(0.1, ROUND).total == pytest.approx((4 + 1 / 3) * 25)
    # 1 request, and 0.4 s x 64 MB = 0.025 GB-s; a retry waits 0.2 s more.
    assert peer_step_functions_express(0.0, ROUND, A).total == pytest.approx(1.0 + 0.25)
    assert peer_step_functions_express(0.1, ROUND, A).total == pytest.approx(
        1.0 + (0.4 + 0.2 / 3) * 0.0625 * 10
    )
    assert peer_temporal(0.0, ROUND).total == pytest.approx(200.0)  # 4 actions
    assert peer_temporal(0.1, ROUND).total == pytest.approx((4 + 1 / 3) * 50)
    durable = {line.meter: line.per_order for line in peer_durable_functions(0.0, ROUND, A).lines}
    # 7 queue messages x 3 + 4 episodes x 3 + the instance insert.
    # Executions: the starter, 4 orchestrator episodes, 3 activities.
    assert durable["Storage queue and table transactions"] == 34
    assert durable["Flex Consumption executions"] == 8


def test_counts_from_a_saved_run_leave_out_the_timers() -> None:
    part = {"writes": 1.0, "queries": 0.5, "point reads": 0.5, "messages": 2.0, "executions": 2.0}
    run = {
        "faults": 0.1,
        "summary": {
            "intake (POST /api/orders)": part,
            "claim + dispatch of reserve-inventory": part,
            "step reserve-inventory (agent + reply)": part,
            "agent_heartbeat": {"writes": 9.0, "executions": 9.0},
        },
    }
    counts = counts_from_run(run)
    assert (counts.state_store, counts.messages, counts.executions) == (6.0, 6.0, 6.0)
    assert counts.faults == 0.1 and counts.remote_calls == pytest.approx(3 / 0.9)
    with pytest.raises(ValueError, match="execution counts"):
        counts_from_run({"summary": {"intake": {"writes": 1.0}}})


def test_the_table_has_a_row_per_meter_and_a_total_per_system() -> None:
    faulty = OrderCounts(state_store=8, messages=10, executions=8, remote_calls=3 / 0.9, faults=0.1)
    table = markdown(bills(ORDER, faulty, ROUND, A), 0.1)
    rows = table.splitlines()
    assert rows[0].count("10% faults") == 2
    assert sum("**total**" in row for row in rows) == 5
    assert "| **this system (Scheduler-Agent-Supervisor)** | **total** | | | **$850.50** |" in table
    assert "not verified" in price_notes(Prices())
    assert "not verified" not in price_notes(ROUND)


def test_the_memory_line_follows_the_measured_instance_time() -> None:
    trickle = Activity(0.25, 0.2, 6.0, 6, "test")
    memory = {
        line.meter: line.per_order
        for line in ours(ORDER, ROUND, Assumptions(activity=trickle)).lines
    }
    assert memory["Flex Consumption memory"] == pytest.approx(12.0)  # 6 s x 2 GB
    durable = {
        line.meter: line.per_order
        for line in peer_durable_functions(0.0, ROUND, Assumptions(activity=trickle)).lines
    }
    # Its two scale groups, each billed as one of our six: 6 s / 6 x 2 groups x 2 GB.
    assert durable["Flex Consumption memory"] == pytest.approx(6.0 / 6 * 2 * 2)


def test_the_load_table_shows_the_old_assumption_beside_each_measured_load() -> None:
    trickle = Activity(0.25, 0.15, 6.0, 6, "test")
    rows = load_table(ORDER, ROUND, A, [BUSY, trickle]).splitlines()
    assert len(rows) == 2 + 3
    assert rows[2].startswith("| before: 0.1 s per execution, assumed | - | 0.800 | 1.60 |")
    # Durable Functions under the old rule too: 8 executions x 0.1 s x 2 GB = 1.6 GB-s.
    assert rows[2].endswith("| $3,409.60 |")
    assert rows[3].startswith("| 0.25 orders/s, measured | 0.150 | 6.000 | 12.00 |")
    assert rows[4].startswith("| 10 orders/s, measured | 0.200 | 0.800 | 1.60 |")


def test_every_assumption_is_printed_with_its_reason() -> None:
    notes = assumption_notes(A).splitlines()
    assert len(notes) == len(A.__dataclass_fields__)
    assert notes[0].startswith("- `activity` = 0.8 billed instance-s per order at 10 orders/s")
    assert all(": " in line for line in notes)


def test_activity_from_a_saved_throughput_run_leaves_out_the_timers() -> None:
    def group(executions: int, active: float, billed: float) -> dict[str, float]:
        return {"executions": executions, "active_seconds": active, "billed_seconds": billed}

    run = {
        "args": {"rate": 2.0},
        "runs": [
            {
                "processed": 10,
                "throughput": 1.9,
                "functions": {
                    "activity": {
                        "HTTP functions": group(10, 1.0, 10.0),
                        "scheduler_reply": group(30, 2.0, 12.0),
                        "supervisor (timer)": group(5, 9.0, 9.0),
                    }
                },
            }
        ],
    }
    activity = activity_from_run(run, "run.json")
    assert activity == Activity(2.0, 0.3, 2.2, 2, "run.json")
    with pytest.raises(ValueError, match="--instrument"):
        activity_from_run({"args": {}, "runs": [{"processed": 1, "functions": {}}]}, "x")


def test_an_always_ready_instance_costs_its_baseline_every_second_of_the_month() -> None:
    one = replace(A, always_ready_instances=1)
    prices = replace(ROUND, flex_always_ready_baseline_per_gb_second=_price(0.000004))
    # 2 GB x 2,592,000 s x $0.000004.
    assert always_ready_per_month(prices, one).endswith("= $20.74 a month")
    assert always_ready_per_month(prices, A).endswith("= $0.00 a month")
