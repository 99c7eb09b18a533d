"""The second shipped workflow end to end: a pivot, a retriable step that takes earlier
results, and the catalogue as the API shows it."""

from __future__ import annotations

import pytest

from shared.contract import Queue, Route
from tests.e2e.conftest import System

pytestmark = [pytest.mark.e2e, pytest.mark.azurite, pytest.mark.broker]

EXPRESS = "express-delivery"


async def test_an_express_order_runs_every_step_and_the_last_sees_the_tracking_number(
    system: System,
) -> None:
    await system.submit("exp-1", workflow=EXPRESS)
    view = await system.wait_for("exp-1")
    assert view["processState"] == "Processed"
    assert (view["workflow"], view["workflowVersion"]) == (EXPRESS, 1)
    assert [s["name"] for s in view["steps"]] == [
        "reserve-inventory",
        "charge-payment",
        "create-shipment",
        "notify-customer",
    ]
    effects = {e["operation"]: e for e in await system.effects("exp-1")}
    assert effects["notify-customer"]["service"] == "notifications"
    await system.assert_net_effect("exp-1")
    process_view = await system.order("exp-1")
    assert process_view["processState"] == "Processed"


async def test_an_unknown_workflow_is_a_400_naming_the_known_ones(system: System) -> None:
    status, problem = await system.app.submit(
        {
            "orderId": "exp-x",
            "customerId": "c-1",
            "items": [{"sku": "SKU-1", "quantity": 1, "unitPrice": 1}],
            "workflow": "next-day",
        }
    )
    assert status == 400
    assert "next-day" in problem["detail"] and EXPRESS in problem["detail"]


async def test_a_bounced_notification_holds_the_order_and_refunds_nothing(
    system: System,
) -> None:
    await system.faults("notifications", permanentFailureOperations=["notify-customer"])
    await system.submit("exp-2", workflow=EXPRESS)
    view = await system.wait_for("exp-2", {"Error"})
    assert view["lastError"].startswith("notify-customer: rejected")
    effects = {e["operation"]: e["applied"] for e in await system.effects("exp-2")}
    assert "refund-payment" not in effects and "release-inventory" not in effects
    assert effects["charge-payment"] == 1 and effects["create-shipment"] == 1
    alerts = await system.drain(Queue.OPERATOR_ALERTS, "exp-2")
    assert [a["reason"] for a in alerts] == ["retriable-step-failed"]


async def test_a_cancel_past_the_pivot_is_409_past_pivot(system: System) -> None:
    await system.faults("notifications", permanentFailureOperations=["notify-customer"])
    await system.submit("exp-3", workflow=EXPRESS)
    await system.wait_for("exp-3", {"Error"})
    status, problem = await system.app.cancel("exp-3")
    assert status == 409
    assert problem["code"] == "past-pivot"
    assert (await system.order("exp-3"))["processState"] == "Error"


async def test_a_failed_pivot_compensates_what_came_before(system: System) -> None:
    await system.faults("shipping", permanentFailureOperations=["create-shipment"])
    await system.submit("exp-4", workflow=EXPRESS)
    view = await system.wait_for("exp-4")
    assert view["processState"] == "Compensated"
    await system.assert_net_effect("exp-4")


async def test_the_workflows_route_lists_both_with_kinds_and_inputs(system: System) -> None:
    status, body = await system.app._ask("GET", system.app.url(Route.WORKFLOWS))
    assert status == 200
    flows = {(w["name"], w["version"]): w for w in body["workflows"]}
    assert flows[("order-fulfilment", 1)]["default"] is True
    express = flows[(EXPRESS, 1)]
    assert express["default"] is False
    kinds = [(s["name"], s["kind"], s["undo"]) for s in express["steps"]]
    assert kinds[2] == ("create-shipment", "pivot", None)
    assert express["steps"][3]["inputs"] == [
        "create-shipment.trackingNumber",
        "charge-payment.amount",
    ]
