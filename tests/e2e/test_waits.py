"""Waiting for the world, end to end on the local stack: approvals sent before and after
their step, twice, rejected, expired; suspend and cancel while waiting; a timer that fires
after a kill -9 of the runtime; and the events API's bad input."""

from __future__ import annotations

import copy
import hmac
import json
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from hashlib import sha256
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from devhost.broker import Broker
from devhost.harness.clients import AppClient
from devhost.harness.ports import LOOPBACK, free_port
from devhost.harness.process import Child
from devhost.harness.services import runtime_command
from devhost.simulator import SimulatorServer
from shared.catalogue import DEFAULT_FILE, FILE_SETTING
from shared.contract import Queue, Setting
from shared.domain.event_signature import header
from tests.e2e.conftest import System, e2e_settings, running_system

pytestmark = [pytest.mark.e2e, pytest.mark.azurite, pytest.mark.broker]

APPROVE = {"approved": True, "by": "ana"}
REJECT = {"approved": False, "by": "ana", "comment": "fraud"}
SECRET = "events-test-secret"


def catalogue_with_quick_review(tmp_path: Path) -> Path:
    """The shipped catalogue plus `quick-review`: a review that expires in 3 s."""
    doc = json.loads(DEFAULT_FILE.read_text(encoding="utf-8"))
    reviewed = next(w for w in doc["workflows"] if w["name"] == "reviewed-order")
    quick = copy.deepcopy(reviewed) | {"name": "quick-review"}
    quick["steps"][1]["timeoutSeconds"] = 3
    doc["workflows"].append(quick)
    path = tmp_path / "catalogue.json"
    path.write_text(json.dumps(doc), encoding="utf-8")
    return path


@pytest.fixture
async def waits(
    azurite_table_port: int,
    broker: Broker,
    simulator: SimulatorServer,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> AsyncIterator[System]:
    settings = e2e_settings(azurite_table_port, broker, simulator.url)
    settings[FILE_SETTING] = str(catalogue_with_quick_review(tmp_path))
    async with running_system(settings, broker, simulator, monkeypatch) as started:
        yield started


async def event(
    system: System, order_id: str, name: str, event_id: str | None, data: Any = None, **kw: Any
) -> tuple[int, dict[str, Any]]:
    body: dict[str, Any] = {} if event_id is None else {"eventId": event_id}
    if data is not None:
        body["data"] = data
    raw = kw.pop("raw", None)
    url = f"{system.api}/orders/{order_id}/events/{name}"
    payload = raw if raw is not None else json.dumps(body).encode()
    headers = {"content-type": "application/json", **kw.pop("headers", {})}
    async with system.session.post(url, data=payload, headers=headers) as response:
        return response.status, await response.json(content_type=None)


async def submit(system: System, order_id: str, workflow: str, **extra: Any) -> None:
    body = {
        "orderId": order_id,
        "customerId": "c-1",
        "items": [{"sku": "SKU-1", "quantity": 1, "unitPrice": 5}],
        "workflow": workflow,
        **extra,
    }
    status, answer = await system.app.submit(body)
    assert status == 202, answer


async def test_an_approval_sent_before_its_step_is_consumed_once(waits: System) -> None:
    await submit(waits, "w-early", "reviewed-order")
    assert (await event(waits, "w-early", "review", "ev-1", APPROVE))[0] == 202
    assert (await event(waits, "w-early", "review", "ev-1", APPROVE))[0] == 202
    view = await waits.wait_for("w-early")
    assert view["processState"] == "Processed"
    assert [(e["eventId"], e["consumedBy"]) for e in view["events"]] == [("ev-1", "manual-review")]
    consumed = [h for h in view["history"] if h["event"] == "event-consumed"]
    assert len(consumed) == 1
    await waits.assert_net_effect("w-early")


async def test_a_waiting_order_shows_what_it_waits_for_and_an_approval_moves_it(
    waits: System,
) -> None:
    await submit(waits, "w-wait", "reviewed-order")
    view = await waits.wait_for("w-wait", {"Processing"}, currentStep=1)
    assert view["waitingFor"]["event"] == "review"
    assert view["waitingFor"]["deadline"] > view["waitingFor"]["since"]
    assert (await event(waits, "w-wait", "review", "ev-1", APPROVE))[0] == 202
    assert (await event(waits, "w-wait", "review", "ev-1", REJECT))[0] == 202
    done = await waits.wait_for("w-wait")
    assert done["processState"] == "Processed" and done["waitingFor"] is None


async def test_a_rejected_approval_compensates(waits: System) -> None:
    await submit(waits, "w-rej", "reviewed-order")
    await waits.wait_for("w-rej", {"Processing"}, currentStep=1)
    await event(waits, "w-rej", "review", "ev-1", REJECT)
    view = await waits.wait_for("w-rej")
    assert view["processState"] == "Compensated"
    assert view["lastError"] == "manual-review: rejected: rejected by ana: fraud"
    await waits.assert_net_effect("w-rej")


async def test_an_expired_wait_follows_its_policy(waits: System) -> None:
    await submit(waits, "w-late", "quick-review")
    view = await waits.wait_for("w-late", timeout=30)
    assert view["processState"] == "Compensated"
    assert view["lastError"].startswith("manual-review: wait-expired: no review by")
    assert view["failureCount"] == 0
    await waits.assert_net_effect("w-late")


async def test_suspend_freezes_the_wait_and_resume_continues_it(waits: System) -> None:
    await submit(waits, "w-sus", "reviewed-order")
    await waits.wait_for("w-sus", {"Processing"}, currentStep=1)
    assert (await waits.app.suspend("w-sus"))[0] == 202
    assert (await event(waits, "w-sus", "review", "ev-1", APPROVE))[0] == 202
    # A negative check: the event is kept, not taken. No message carries it (it is stored
    # in the answer's write); the Supervisor is what could still move the order, so two
    # of its sweeps begun after the event have had their chance.
    (kept,) = (await waits.order("w-sus"))["events"]
    await waits.sweeps_after(datetime.fromisoformat(kept["at"]), 2)
    held = await waits.order("w-sus")
    assert held["processState"] == "Suspended"
    assert held["events"][0]["consumedBy"] is None
    assert (await waits.app.resume("w-sus"))[0] == 202
    assert (await waits.wait_for("w-sus"))["processState"] == "Processed"


async def test_cancel_while_waiting_undoes_what_was_done(waits: System) -> None:
    await submit(waits, "w-can", "reviewed-order")
    await waits.wait_for("w-can", {"Processing"}, currentStep=1)
    assert (await waits.app.cancel("w-can"))[0] == 202
    assert (await waits.wait_for("w-can"))["processState"] == "Cancelled"
    await waits.assert_net_effect("w-can")
    status, problem = await event(waits, "w-can", "review", "ev-late", APPROVE)
    assert status == 409, problem


async def test_bad_events_get_precise_answers(waits: System) -> None:
    await submit(waits, "w-bad", "reviewed-order")
    assert (await event(waits, "w-bad", "review", None, APPROVE))[0] == 400
    status, problem = await event(waits, "w-bad", "picked", "ev-1", {})
    assert status == 400 and "never waits for event 'picked'" in problem["detail"]
    assert (await event(waits, "w-bad", "review", "ev-2", {"ok": True}))[0] == 400
    deep: Any = {}
    for _ in range(40):
        deep = {"d": deep}
    assert (await event(waits, "w-bad", "review", "ev-3", deep))[0] == 400
    assert (await event(waits, "w-bad", "review", "ev-4", {"x": "y" * 9000}))[0] == 413
    assert (await event(waits, "nobody", "review", "ev-5", APPROVE))[0] == 404
    assert (await waits.order("w-bad"))["events"] == []


async def test_a_signed_event_is_taken_and_replayed_anywhere_else_is_401(
    azurite_table_port: int,
    broker: Broker,
    simulator: SimulatorServer,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A signed approval authorises its order's event and nothing else (issue 41): to
    another order, as another event, changed, or outside its window it is a 401
    problem+json, and the other order is left as it was."""
    settings = e2e_settings(azurite_table_port, broker, simulator.url)
    settings[Setting.EVENT_SIGNING_SECRET] = SECRET
    async with running_system(settings, broker, simulator, monkeypatch) as system:
        await submit(system, "w-sig", "reviewed-order")
        await submit(system, "w-other", "reviewed-order")
        await system.wait_for("w-other", {"Processing"}, currentStep=1)
        body = json.dumps({"eventId": "ev-1", "data": APPROVE}).encode()
        t = int(time.time())
        good = header(SECRET, t, "w-sig", "review", body)
        tampered = json.dumps({"eventId": "ev-1", "data": REJECT}).encode()
        refused = [
            ("w-sig", "review", body, header("guess", t, "w-sig", "review", body)),
            ("w-sig", "review", body, None),
            ("w-other", "review", body, good),
            ("w-sig", "approval", body, good),
            ("w-sig", "review", tampered, good),
            ("w-sig", "review", body, header(SECRET, t - 301, "w-sig", "review", body)),
            (
                "w-other",
                "review",
                body,
                "sha256=" + hmac.new(SECRET.encode(), body, sha256).hexdigest(),
            ),
        ]
        for order_id, name, raw, signature in refused:
            url = f"{system.api}/orders/{order_id}/events/{name}"
            headers = {"content-type": "application/json"}
            if signature is not None:
                headers["x-signature"] = signature
            async with system.session.post(url, data=raw, headers=headers) as response:
                problem = await response.json(content_type=None)
                assert response.status == 401, (order_id, name, problem)
                assert response.content_type == "application/problem+json"
                assert problem["title"] == "Bad signature" and problem["detail"]
        status, _ = await event(
            system, "w-sig", "review", None, raw=body, headers={"x-signature": good}
        )
        assert status == 202
        assert (await system.wait_for("w-sig"))["processState"] == "Processed"
        other = await system.order("w-other")
        assert other["events"] == [] and other["processState"] == "Processing"
        assert other["waitingFor"]["event"] == "review"


async def test_a_timer_fires_after_a_kill_of_the_runtime_during_the_wait(
    azurite_table_port: int, tmp_path: Path
) -> None:
    with (
        Broker(
            port=0, control_port=0, db_path=str(tmp_path / "b.sqlite3"), lock_seconds=4
        ) as broker,
        SimulatorServer(port=0, seed=3) as simulator,
    ):
        settings = e2e_settings(azurite_table_port, broker, simulator.url)
        port = free_port()
        command = runtime_command(port=port, state_dir=tmp_path / "devhost")
        runtime = Child("runtime", command, tmp_path / "runtime.log", env=settings)
        runtime.start()
        try:
            async with aiohttp.ClientSession() as session:
                app = AppClient(session, f"http://{LOOPBACK}:{port}/api")
                await app.wait_healthy(30, runtime)
                not_before = datetime.now(UTC) + timedelta(seconds=6)
                status, answer = await app.submit(
                    {
                        "orderId": "w-timer",
                        "customerId": "c-1",
                        "items": [{"sku": "SKU-1", "quantity": 1, "unitPrice": 5}],
                        "workflow": "scheduled-delivery",
                        "notBefore": not_before.isoformat(),
                    }
                )
                assert status == 202, answer
                view = await app.wait_for("w-timer", {"Processing"}, 30, currentStep=2)
                assert view["waitingFor"]["until"]
                runtime.kill()
                runtime.start()
                await app.wait_healthy(30, runtime)
                back = datetime.now(UTC)
                done = await app.wait_for("w-timer", {"Processed"}, 60)
        finally:
            runtime.stop(timeout=30)
    fired = next(h for h in done["history"] if h["event"] == "timer-fired")
    at = datetime.fromisoformat(fired["at"].replace("Z", "+00:00"))
    # Not before its time, and soon after both its time and the restart (on a loaded
    # machine the runtime may come back after notBefore): one Supervisor period and room.
    assert not_before <= at < max(not_before, back) + timedelta(seconds=1 + 1 + 2)


async def test_status_notifications_carry_on_through_a_wait(waits: System) -> None:
    await submit(waits, "w-note", "reviewed-order")
    await waits.wait_for("w-note", {"Processing"}, currentStep=1)
    await event(waits, "w-note", "review", "ev-1", APPROVE)
    await waits.wait_for("w-note")
    statuses = [m["status"] for m in await waits.drain(Queue.ORDER_STATUS, "w-note")]
    assert statuses == ["Received", "Processing", "Processed"]
