"""End to end through HTTP: the pattern finishes, retries, recovers, compensates, holds."""

from __future__ import annotations

import asyncio
import logging

import pytest

from shared.contract import Queue
from tests.e2e.conftest import System

pytestmark = [pytest.mark.e2e, pytest.mark.azurite, pytest.mark.broker]


def steps(view: dict[str, object]) -> dict[str, tuple[str, int]]:
    return {s["name"]: (s["status"], s["attempts"]) for s in view["steps"]}  # type: ignore[attr-defined]


async def test_happy_path_ends_processed_with_each_effect_applied_once(system: System) -> None:
    await system.submit("happy-1")
    view = await system.wait_for("happy-1")
    assert view["processState"] == "Processed"
    assert view["failureCount"] == 0 and view["lockedBy"] is None
    effects = await system.effects("happy-1")
    assert sorted((e["operation"], e["applied"]) for e in effects) == [
        ("charge-payment", 1),
        ("create-shipment", 1),
        ("reserve-inventory", 1),
    ]
    await system.assert_net_effect("happy-1")
    statuses = [m["status"] for m in await system.drain(Queue.ORDER_STATUS, "happy-1")]
    assert statuses == ["Received", "Processing", "Processed"]


async def test_transient_faults_are_absorbed_by_agent_retries(system: System) -> None:
    await system.faults("inventory", transientErrorRate=0.6)
    await system.faults("shipping", transientErrorRate=0.6)
    for i in range(3):
        await system.submit(f"flaky-{i}")
    for i in range(3):
        view = await system.wait_for(f"flaky-{i}")
        assert view["processState"] == "Processed"
        await system.assert_net_effect(f"flaky-{i}")
    calls = 0
    for i in range(3):
        calls += sum(e["calls"] for e in await system.effects(f"flaky-{i}"))
    assert calls > 9  # retries happened, against the same idempotency keys


async def test_hang_past_the_deadline_is_recovered_by_the_supervisor(system: System) -> None:
    await system.faults("payment", hangRate=1.0, hangSeconds=30)
    await system.submit("hang-1")
    await system.wait_for("hang-1", {"Pending", "Processing"}, failureCount=1)
    await system.clear_faults()
    view = await system.wait_for("hang-1")
    assert view["processState"] == "Processed"
    assert view["failureCount"] == 1
    assert steps(view)["reserve-inventory"] == ("Completed", 1)
    assert steps(view)["charge-payment"][1] >= 2
    assert "timed-out" in [h["event"] for h in view["history"]]


async def test_permanent_failure_at_payment_releases_inventory_and_compensates(
    system: System,
) -> None:
    await system.faults("payment", permanentFailureSkus=["DECLINED"])
    await system.submit("declined-1", skus=("SKU-1", "DECLINED"))
    view = await system.wait_for("declined-1")
    assert view["processState"] == "Compensated"
    assert steps(view)["reserve-inventory"][0] == "Compensated"
    assert steps(view)["charge-payment"][0] == "Failed"
    operations = {e["operation"]: e["applied"] for e in await system.effects("declined-1")}
    assert operations == {"reserve-inventory": 1, "release-inventory": 1, "charge-payment": 0}
    await system.assert_net_effect("declined-1")
    statuses = [m["status"] for m in await system.drain(Queue.ORDER_STATUS, "declined-1")]
    assert statuses[-2:] == ["Failed", "Compensated"]


async def test_hangs_on_every_attempt_end_in_error_then_resubmit_finishes(system: System) -> None:
    await system.faults("shipping", hangRate=1.0, hangSeconds=30)
    await system.submit("stuck-1")
    view = await system.wait_for("stuck-1", timeout=90)
    assert view["processState"] == "Error"
    assert view["failureCount"] == 3
    alerts = await system.drain(Queue.OPERATOR_ALERTS, "stuck-1")
    assert [a["reason"] for a in alerts] == ["max-failure-count-reached"]
    assert alerts[0]["failureCount"] == 3
    await system.clear_faults()
    async with system.session.post(f"{system.api}/orders/stuck-1/resubmit") as r:
        assert r.status == 202, await r.text()
    done = await system.wait_for("stuck-1")
    assert done["processState"] == "Processed"
    assert steps(done)["reserve-inventory"] == ("Completed", 1)
    assert steps(done)["charge-payment"] == ("Completed", 1)
    applied = {e["operation"]: e["applied"] for e in await system.effects("stuck-1")}
    assert applied == {"reserve-inventory": 1, "charge-payment": 1, "create-shipment": 1}
    await system.assert_net_effect("stuck-1")


async def test_every_message_delivered_twice_changes_no_outcome(system: System) -> None:
    system.broker.set_faults(duplicate_rate=1.0)
    await system.faults("payment", permanentFailureSkus=["DECLINED"])
    await system.submit("twice-ok")
    await system.submit("twice-bad", skus=("DECLINED",))
    ok, bad = await asyncio.gather(system.wait_for("twice-ok"), system.wait_for("twice-bad"))
    assert ok["processState"] == "Processed" and bad["processState"] == "Compensated"
    for order_id in ("twice-ok", "twice-bad"):
        assert all(e["applied"] <= 1 for e in await system.effects(order_id))
        await system.assert_net_effect(order_id)
    stats = system.broker.stats()
    assert sum(q["duplicated"] for q in stats.values()) > 0


async def test_logs_carry_no_keys_or_connection_strings(
    system: System, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    await system.faults("payment", permanentFailureSkus=["DECLINED"])
    await system.submit("logs-1")
    await system.submit("logs-2", skus=("DECLINED",))
    await system.wait_for("logs-1")
    await system.wait_for("logs-2")
    text = "\n".join(f"{r.getMessage()} {r.exc_text or ''}" for r in caplog.records)
    assert "order logs-1" in text  # the lifecycle lines are there
    secrets = [
        value
        for value in system.settings.values()
        if "AccountKey=" in value or "SharedAccessKey=" in value
    ]
    assert secrets
    for connection_string in secrets:
        for part in connection_string.split(";"):
            if part.startswith(("AccountKey=", "SharedAccessKey=")):
                assert part.split("=", 1)[1] not in text
        assert connection_string not in text
