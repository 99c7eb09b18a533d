"""The chaos suite's own parts, without starting anything: the order plan, the bound,
the log counts, the monitor's bookkeeping and the report."""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from chaos import config as presets
from chaos.collect import InFlight
from chaos.config import (
    EXPRESS_DELIVERY,
    ORDER_FULFILMENT,
    REVIEWED_ORDER,
    SCHEDULED_DELIVERY,
    SERVICES,
    Cancels,
    Timings,
    failing_sku,
    finishing_dispatches,
    parse_mix,
    services_of,
    workflow_named,
)
from chaos.figures import count_log_lines
from chaos.load import plan_orders, submit_all
from chaos.model import Accepted, Alert, Check, Convergence, Figures, InvariantResult
from chaos.monitor import Monitor
from chaos.report import as_text
from chaos.run import RunResult, _left_on_held, plan_cancels, plan_reviews
from chaos.system import KillEvent
from devhost.harness.ports import free_port
from shared.domain.model import ProcessState
from shared.domain.reconcile import MISMATCH_REASON, SETTLED_REASON
from tests.chaos.test_held import rejected_twice
from tests.chaos.test_invariants import STEPS, effect, healthy, observe


def test_the_plan_is_seeded_and_spreads_rejected_skus_over_every_service() -> None:
    two = ORDER_FULFILMENT.name, ORDER_FULFILMENT.name, EXPRESS_DELIVERY
    config = presets.full(orders=300, seed=5).with_(workflows=two)
    first, again = plan_orders(config, "r"), plan_orders(config, "r")
    assert first == again
    assert len({p.order_id for p in first}) == 300
    failing = [p for p in first if p.failing_service is not None]
    express = workflow_named(EXPRESS_DELIVERY)
    # at least one per (workflow, service) pair: 3 + 4, though 1% of 300 is 3
    assert len(failing) == len(SERVICES) + len(services_of(express))
    assert Counter((p.workflow, p.failing_service) for p in failing) == Counter(
        [(ORDER_FULFILMENT.name, s) for s in SERVICES]
        + [(express.name, s) for s in services_of(express)]
    )
    for p in failing:
        assert p.failing_service is not None
        assert failing_sku(p.failing_service) in {i["sku"] for i in p.body["items"]}
    # every third order on express-delivery, and its body says so
    assert [p.workflow for p in first[:6]] == [ORDER_FULFILMENT.name] * 2 + [express.name] + [
        ORDER_FULFILMENT.name
    ] * 2 + [express.name]
    assert all(p.body["workflow"] == p.workflow for p in first)
    plain = [i["sku"] for p in first if p.failing_service is None for i in p.body["items"]]
    assert not [sku for sku in plain if sku.startswith("PERM-")]
    assert plan_orders(config.with_(seed=6), "r") != first
    only = plan_orders(presets.full(orders=30, seed=5).with_(workflows=(express.name,)), "r")
    assert {p.workflow for p in only} == {express.name}
    assert {p.failing_service for p in only} == {None, *services_of(express)}


def test_a_share_of_clients_ask_for_the_final_status_only_and_the_rest_of_the_plan_stays() -> None:
    config = presets.full(orders=200, seed=5)
    planned = plan_orders(config, "r")
    final = [p for p in planned if p.body.get("notify") == "final"]
    assert 20 <= len(final) <= 60  # a fifth of 200, drawn
    assert {p.body.get("notify") for p in planned} == {None, "final"}
    none = plan_orders(config.with_(final_share=0.0), "r")
    assert [{k: v for k, v in p.body.items() if k != "notify"} for p in planned] == [
        dict(p.body) for p in none
    ]


def test_the_default_mix_has_reviewed_and_scheduled_orders_with_their_waits() -> None:
    planned = plan_orders(presets.full(orders=100, seed=5), "r")
    by_workflow = Counter(p.workflow for p in planned)
    assert by_workflow == {
        ORDER_FULFILMENT.name: 40,
        EXPRESS_DELIVERY: 20,
        REVIEWED_ORDER: 20,
        SCHEDULED_DELIVERY: 20,
    }
    # an event or timer step has no service: no order is planned to fail there
    assert {p.failing_service for p in planned if p.workflow == REVIEWED_ORDER} >= {
        "inventory",
        "payment",
        "shipping",
    }
    scheduled = [p for p in planned if p.workflow == SCHEDULED_DELIVERY]
    span = presets.Schedules()
    assert all(
        p.not_before_after is not None
        and span.min_seconds <= p.not_before_after <= span.max_seconds
        for p in scheduled
    )
    assert all(p.not_before_after is None for p in planned if p.workflow != SCHEDULED_DELIVERY)
    reviews = plan_reviews(presets.full(orders=100, seed=5), planned)
    assert set(reviews) == {p.order_id for p in planned if p.workflow == REVIEWED_ORDER}
    assert {r.event for r in reviews.values()} == {"review"}
    for pick in ("early", "approved", "second"):
        assert {getattr(r, pick) for r in reviews.values()} == {True, False}


def test_the_mix_reads_names_and_weights() -> None:
    assert (
        parse_mix("order-fulfilment:2,express-delivery,reviewed-order,scheduled-delivery")
        == presets.MIX
    )
    assert parse_mix(" express-delivery ") == (EXPRESS_DELIVERY,)
    for wrong in ("", "nope", "express-delivery:0"):
        with pytest.raises(ValueError):
            parse_mix(wrong)


class CountingWindow:
    def __init__(self) -> None:
        self.admitted = 0
        self.open = 0

    async def admit(self) -> None:
        self.admitted += 1
        self.open += 1

    def release(self) -> None:
        self.open -= 1


async def test_submission_alternates_runtimes_at_the_pace_and_passes_the_window() -> None:
    async def accept(request: web.Request) -> web.Response:
        return web.json_response({"orderId": (await request.json())["orderId"]}, status=202)

    app = web.Application()
    app.router.add_post("/api/orders", accept)
    planned = plan_orders(presets.quick(orders=6), "s")
    window = CountingWindow()
    seen: list[Accepted] = []
    down = ("a", f"http://127.0.0.1:{free_port()}/api")
    async with TestServer(app) as server, aiohttp.ClientSession() as session:
        up = ("b", str(server.make_url("/api")))
        started = time.monotonic()
        accepted = await submit_all(
            session, [down, up], planned, 50.0, 2, started, seen.append, window
        )
    assert [a.order_id for a in accepted] == [p.order_id for p in planned]
    assert {a.runtime for a in accepted} == {"b"}
    assert [a.tries for a in accepted] == [2, 1] * 3  # even orders try the dead "a" first
    assert all(a.at >= i / 50.0 for i, a in enumerate(accepted))
    assert sorted(seen, key=lambda a: a.order_id) == accepted
    assert (window.admitted, window.open) == (6, 0)


def test_the_bound_counts_every_dispatch_and_every_expiry() -> None:
    timings = Timings(
        step_timeout_seconds=4,
        pending_timeout_seconds=10,
        supervisor_period_seconds=1,
        max_failure_count=3,
    )
    # back-off before the third expiry: 1 s x 2^(2 - 1)
    assert timings.max_backoff_seconds == 2
    assert timings.expiry_seconds == 10 + 1 + 2
    assert timings.convergence_bound_seconds(dispatches=6) == (3 + 6) * 13
    # express-delivery: four steps forward, two of them undoable: six, as order-fulfilment
    assert finishing_dispatches(ORDER_FULFILMENT) == 6
    assert finishing_dispatches(workflow_named(EXPRESS_DELIVERY)) == 6
    assert presets.full().dispatches == 6
    assert timings.settings()["SupervisorSchedule"] == "*/1 * * * * *"


def test_log_counts_take_the_crash_message_not_the_traceback_source_line(tmp_path: Path) -> None:
    log = tmp_path / "runtime-a1.log"
    log.write_text(
        "12:00:01 WARNING devhost.servicebus scheduler_nudge failed on message nudge:o:1 "
        "(delivery 1): ChaosFault: chaos: injected crash before reading an order; abandoning\n"
        "12:00:02 ERROR devhost.timer timer supervisor failed (invocation 1)\n"
        "Traceback (most recent call last):\n"
        '    raise ChaosFault(f"chaos: injected crash {where}")\n'
        "shared.adapters.chaos.ChaosFault: chaos: injected crash before sending\n"
        "12:00:03 INFO orders.scheduler order o-2 stale reply ignored: charge-payment do\n"
    )
    counts = count_log_lines([log, tmp_path / "missing.log"])
    assert counts["chaos crashes injected"] == 2
    assert counts["stale replies ignored"] == 1


class _Reader:
    def __init__(self) -> None:
        self.rows: list[InFlight] = []

    async def in_flight(self) -> list[InFlight]:
        return list(self.rows)


async def test_the_monitor_counts_unfinished_orders_and_samples_them() -> None:
    reader = _Reader()
    monitor = Monitor(reader, interval=0.01)  # type: ignore[arg-type]
    accepted = {i: Accepted(i, 0.0, "a", 1) for i in ("o-1", "o-2")}
    reader.rows = [InFlight("o-1", ProcessState.PROCESSING, "chaos-a1", 0)]
    await monitor.scan()
    assert monitor.in_flight(accepted) == 1
    late = {**accepted, "o-3": Accepted("o-3", monitor.now() + 1, "b", 1)}
    assert monitor.in_flight(late) == 2  # accepted after the scan began: not seen yet
    reader.rows = []
    monitor.start()
    try:
        assert await monitor.wait_terminal(accepted, not_before=0.0, timeout=5) is not None
    finally:
        await monitor.stop()
    assert (monitor.samples[0].order_id, monitor.samples[0].locked_by) == ("o-1", "chaos-a1")


def test_the_report_shows_setup_figures_and_each_verdict() -> None:
    obs = healthy()
    passing = (InvariantResult("no remote effect applied twice", True, 9),)
    failing = (
        InvariantResult("no remote effect applied twice", False, 9, ("o-1: applied 2 times",)),
    )
    result = RunResult(presets.quick(), "c7-abcd", Path("/tmp/x"), "table")
    result.kills.append(KillEvent("a", "chaos-a1", 123, 3.0, 2.5))
    figures = Figures(states={"Processed": 2, "Error": 1}, recoveries=4)
    convergence = Convergence(3.5, 0.2, 0, 1.0)
    result.checks.append(Check("after the load", obs, passing, figures, convergence))
    text = as_text(result)
    assert "chaos-a1 (pid 123) at 3.0 s" in text
    assert "every order terminal 3.5 s after the last submission" in text
    assert "PASS" in text and "chaos run: PASS" in text
    result.checks.append(Check("after resubmitting", obs, failing, figures, convergence))
    text = as_text(result)
    assert "FAIL no remote effect applied twice (after resubmitting)" in text
    assert "o-1: applied 2 times" in text
    assert "chaos run: FAIL" in text


def test_the_report_says_why_each_order_left_in_error_is_there() -> None:
    result = RunResult(presets.quick(), "c7-abcd", Path("/tmp/x"), "table")
    figures = Figures(states={"Processed": 1, "Error": 1})
    convergence = Convergence(3.5, 0.2, 0, 1.0)
    result.checks.append(Check("after the load", healthy(), (), figures, convergence))
    assert "orders left in Error" not in as_text(result)
    held = observe(
        [rejected_twice("x-held")],
        [*(effect("x-held", s) for s in STEPS), effect("x-held", "notify-customer", applied=0)],
        alerts=[Alert("x-held", "retriable-step-failed", 0)],
        failing={"x-held": "notifications"},
    )
    result.checks.append(Check("after resubmitting", held, (), figures, convergence))
    text = as_text(result, width=400)
    table = text[text.index("orders left in Error: why") : text.index("what the system absorbed")]
    assert "after the load" not in table  # nothing was in Error then
    for cell in (
        "after resubmitting",
        "x-held",
        "resubmitted 1x",
        "notify-customer: rejected; alerts: retriable-step-failed",
        "planned: notifications rejects PERM-NOTIFICATIONS at notify-customer",
        "in force: reserve-inventory at inventory, charge-payment at payment, create-shipment "
        "at shipping",
    ):
        assert cell in table
    story = text[text.index("story of x-held (after resubmitting):") :]
    assert "resubmitted: by chaos" in story
    assert story.count("step-failed: notify-customer: rejected") == 2


def test_cancel_plan_is_seeded_and_takes_about_its_share() -> None:
    cancels = Cancels(share=0.2, twice_share=0.5, within_seconds=4)
    config = presets.quick(seed=3).with_(cancels=cancels)
    ids = [f"o-{i}" for i in range(1000)]
    plan = plan_cancels(config, ids)
    assert plan == plan_cancels(config, ids)
    assert 150 < len(plan) < 250
    assert all(0 <= delay <= 4 for delay, _ in plan.values())
    assert 0.35 < sum(twice for _, twice in plan.values()) / len(plan) < 0.65
    assert plan_cancels(config.with_(cancels=Cancels()), ids) == {}


def test_the_runs_have_a_slow_provider_and_one_without_abandon() -> None:
    for config in (presets.full(), presets.quick()):
        slow = config.slow
        assert slow.slow_ms > config.timings.step_timeout_seconds * 1000
        assert slow.service == "payment" and 0 < slow.from_share < slow.to_share < 1
        settings = config.remote.for_service("payment", slow_ms=slow.slow_ms)
        assert settings["slowMs"] == slow.slow_ms
        without = [s for s in SERVICES if not config.remote.for_service(s)["abandonSupported"]]
        assert without == ["payment"]
        assert config.remote.cleared(without[0])["abandonSupported"] is False


def test_the_provider_without_abandon_has_requests_that_arrive_after_their_live_time() -> None:
    """The residual risk of docs/in-doubt.md, in every run: some charges reach payment
    after the complete-by plus the clock-skew margin and a sweep, while faults are on.
    The quick run (CI) has them too, now that reconciliation heals a charge that applied
    after its refund found nothing to undo."""
    for config in (presets.full(), presets.quick()):
        t = config.timings
        late = config.remote.for_service("payment")
        assert late["lateRate"] > 0 and late["abandonSupported"] is False
        assert late["lateSeconds"] > t.step_timeout_seconds + t.clock_skew_seconds + 1
        assert t.settings()["ClockSkewSeconds"] == str(t.clock_skew_seconds)
        others = [s for s in SERVICES if s != "payment"]
        assert all(config.remote.for_service(s)["lateRate"] == 0 for s in others)
        assert "lateRate" not in config.remote.cleared("payment")


def test_the_runs_have_our_own_limits_on() -> None:
    """Both runs, the quick one included: two runtimes share each limited agent's rate
    row, and the judge holds them to it (docs/limits.md)."""
    for config in (presets.full(), presets.quick()):
        settings = config.limits.settings()
        assert settings["AgentLimits__shipping__callsPerSecond"] == "10"
        assert settings["AgentLimits__notifications__callsPerSecond"] == "3"
        assert int(settings["FairShareRunningPerCustomer"]) > 0
        assert int(settings["IntakeMaxPendingPerCustomer"]) > 0


def test_the_default_mix_runs_every_shipped_workflow_and_every_kept_version() -> None:
    """Item 5 of issue 37: every workflow of catalogue.json is in the mix. New orders
    start on a workflow's newest version, so an older version the catalogue keeps (for
    orders in flight) would need orders pinned to it: this fails the day one is kept."""
    catalogue = presets.CATALOGUE
    assert set(presets.MIX) == set(catalogue.names)
    assert set(catalogue.workflows) == set(catalogue.latest())


def test_reconciliation_leaves_only_a_held_orders_settled_step_to_an_operator() -> None:
    """What the run stops reconciling again for, read from the route's answer: a held
    order's step settled "not applied" that its provider has after all, nothing else."""
    assert _left_on_held({"reason": SETTLED_REASON, "state": "Error"})
    assert _left_on_held({"reason": SETTLED_REASON, "state": "Suspended"})
    assert not _left_on_held({"reason": SETTLED_REASON, "state": "Processed"})
    assert not _left_on_held({"reason": MISMATCH_REASON, "state": "Error"})
