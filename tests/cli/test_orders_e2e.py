"""``orders list/show/resubmit/watch`` against the whole local stack, through HTTP."""

from __future__ import annotations

import json

import pytest

from shared.cli.errors import Exit
from tests.cli.conftest import cli
from tests.e2e.conftest import System

pytestmark = [pytest.mark.e2e, pytest.mark.azurite, pytest.mark.broker]


async def test_an_order_in_error_is_listed_shown_resubmitted_and_watched_to_the_end(
    quick_system: System,
) -> None:
    system = quick_system
    env = {"ORDERS_API_URL": system.api, "ORDERS_OPERATOR": "cli-test"}
    await system.faults("shipping", hangRate=1.0, hangSeconds=30)
    await system.submit("cli-stuck-1")
    await system.submit("cli-stuck-2")
    await system.wait_for("cli-stuck-1", {"Error"}, timeout=30)
    await system.wait_for("cli-stuck-2", {"Error"}, timeout=30)

    paged = await cli(
        "orders", "list", "--state", "error", "--page-size", "1", "--all", "--json", env=env
    )
    assert paged.code == Exit.OK, paged.err
    listed = json.loads(paged.out)
    assert sorted(o["orderId"] for o in listed["items"]) == ["cli-stuck-1", "cli-stuck-2"]
    assert {o["processState"] for o in listed["items"]} == {"Error"}

    first = await cli("orders", "list", "--state", "Error", "--page-size", "1", env=env)
    assert first.code == Exit.OK
    lines = first.out.splitlines()
    assert lines[0].split()[:3] == ["ORDER", "ID", "STATE"]
    assert lines[1].split()[1:3] == ["Error", "1"]
    assert lines[-1].startswith("more orders: add --all, or --continuation ")

    shown = await cli("orders", "show", "cli-stuck-1", env=env)
    assert shown.code == Exit.OK, shown.err
    assert "state         Error" in shown.out
    assert "reserve-inventory  Completed" in shown.out
    assert "charge-payment     Completed" in shown.out
    assert "create-shipment" in shown.out.split("HISTORY")[0]
    assert "timed-out" in shown.out.split("HISTORY")[1]

    unknown = await cli("orders", "show", "cli-nope", env=env)
    assert unknown.code == Exit.NOT_FOUND
    assert unknown.err == (
        "python -m shared.cli: error: order 'cli-nope' not found (no order with id 'cli-nope')\n"
    )

    await system.clear_faults()
    resubmitted = await cli("orders", "resubmit", "cli-stuck-1", "cli-stuck-2", env=env)
    assert resubmitted.code == Exit.OK, resubmitted.out + resubmitted.err
    assert resubmitted.out.count("resubmitted") == 2

    watched = await cli(
        "orders", "watch", "cli-stuck-1", "--interval", "0.2", "--max-wait", "30", env=env
    )
    assert watched.code == Exit.OK, watched.out + watched.err
    assert watched.out.splitlines()[-1] == "cli-stuck-1 ended Processed"
    assert "step create-shipment: Completed" in watched.out or "Processed" in watched.out

    await system.wait_for("cli-stuck-2", {"Processed"})
    again = await cli("orders", "resubmit", "cli-stuck-2", "cli-nope", "--json", env=env)
    assert again.code == Exit.FAILED
    answers = {a["orderId"]: a for a in json.loads(again.out)}
    assert answers["cli-stuck-2"]["result"] == "refused"
    assert "only an order in Error can be resubmitted" in answers["cli-stuck-2"]["detail"]
    assert answers["cli-nope"]["result"] == "not found"
    done = await system.order("cli-stuck-1")
    assert "cli-test" in json.dumps(done["history"])


async def test_send_event_approves_a_waiting_order_as_the_operator(quick_system: System) -> None:
    system = quick_system
    env = {"ORDERS_API_URL": system.api, "ORDERS_OPERATOR": "ana"}
    status, answer = await system.app.submit(
        {
            "orderId": "cli-review",
            "customerId": "c-1",
            "items": [{"sku": "SKU-1", "quantity": 1, "unitPrice": 5}],
            "workflow": "reviewed-order",
        }
    )
    assert status == 202, answer
    await system.wait_for("cli-review", {"Processing"}, currentStep=1)
    unknown = await cli("orders", "send-event", "cli-review", "picked", "--event-id", "e2", env=env)
    assert unknown.code == Exit.FAILED and "never waits for event 'picked'" in unknown.err
    bad = await cli(
        "orders",
        "send-event",
        "cli-review",
        "review",
        "--event-id",
        "e1",
        "--data",
        "[1]",
        env=env,
    )
    assert bad.code == Exit.USAGE, bad.err
    sent = await cli(
        "orders",
        "send-event",
        "cli-review",
        "review",
        "--event-id",
        "e1",
        "--approve",
        "--comment",
        "checked",
        env=env,
    )
    assert sent.code == Exit.OK, sent.err
    assert "event review (e1) stored" in sent.out
    view = await system.wait_for("cli-review")
    assert view["processState"] == "Processed"
    review = next(s for s in view["steps"] if s["name"] == "manual-review")
    assert review["status"] == "Completed"
    assert [(e["eventId"], e["by"]) for e in view["events"]] == [("e1", "ana")]
