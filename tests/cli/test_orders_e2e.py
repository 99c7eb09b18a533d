"""``orders list/show/resubmit/watch/send-event/approve/reject`` against the whole local
stack, through HTTP."""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator

import pytest

from devhost.broker import Broker
from devhost.simulator import SimulatorServer
from shared.cli.errors import Exit
from shared.contract import Setting
from tests.cli.conftest import cli
from tests.e2e.conftest import System, e2e_settings, running_system
from tests.e2e.test_operator_page_waits import submit_reviewed

pytestmark = [pytest.mark.e2e, pytest.mark.azurite, pytest.mark.broker]

SECRET = "cli-e2e-signing-secret"


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


@pytest.fixture
async def signing_system(
    azurite_table_port: int,
    broker: Broker,
    simulator: SimulatorServer,
    monkeypatch: pytest.MonkeyPatch,
) -> AsyncIterator[System]:
    settings = {
        **e2e_settings(azurite_table_port, broker, simulator.url),
        Setting.EVENT_SIGNING_SECRET: SECRET,
        Setting.STATE_TABLE: f"cli{uuid.uuid4().hex[:12]}",
    }
    async with running_system(settings, broker, simulator, monkeypatch) as started:
        yield started


async def test_with_signing_on_send_event_signs_and_approve_reject_need_no_secret(
    signing_system: System,
) -> None:
    system = signing_system
    env = {"ORDERS_API_URL": system.api, "ORDERS_OPERATOR": "ana"}
    for order_id in ("cli-signed", "cli-approved", "cli-rejected"):
        await submit_reviewed(system, order_id)
        await system.wait_for(order_id, {"Processing"}, currentStep=1)
    send = ("orders", "send-event", "cli-signed", "review", "--event-id", "s1", "--approve")
    unsigned = await cli(*send, env=env)
    assert unsigned.code == Exit.AUTH, unsigned.err
    sent = await cli(*send, env={**env, Setting.EVENT_SIGNING_SECRET: SECRET})
    assert sent.code == Exit.OK, sent.err
    approved = await cli("orders", "approve", "cli-approved", "--event-id", "a1", env=env)
    assert approved.code == Exit.OK, approved.err
    assert approved.out == "cli-approved: review (a1) approved by ana\n"
    rejected = await cli(
        "orders", "reject", "cli-rejected", "--event-id", "r1", "--comment", "fraud", env=env
    )
    assert rejected.code == Exit.OK, rejected.err

    assert (await system.wait_for("cli-signed"))["processState"] == "Processed"
    assert (await system.wait_for("cli-approved"))["processState"] == "Processed"
    view = await system.wait_for("cli-rejected")
    assert view["processState"] == "Compensated"
    assert view["lastError"] == "manual-review: rejected: rejected by ana: fraud"
    again = await cli("orders", "approve", "cli-rejected", "--event-id", "a2", env=env)
    assert again.code == Exit.FAILED and "Compensated" in again.err
