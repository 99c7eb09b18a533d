"""The operator page and the snapshot it polls, called as the host would."""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import json
import re
from datetime import timedelta
from typing import Any

import pytest
from azure.functions.timer import TimerRequest

from shared import bootstrap
from shared.contract import Route
from shared.domain.health import AgentHealth, BreakerState
from shared.domain.model import ProcessState
from shared.ports import StoreUnavailable
from tests.app_functions import registered_functions
from tests.functions.conftest import Harness, context_for

ORDER = {"customerId": "c-1", "items": [{"sku": "A", "quantity": 1, "unitPrice": 2.0}]}


def body(response: Any) -> Any:
    return json.loads(response.get_body())


async def submit(harness: Harness, order_id: str) -> None:
    response = await harness.http(
        "submit_order_http", "POST", "orders", {**ORDER, "orderId": order_id}
    )
    assert response.status_code == 202


async def drive_to_error(harness: Harness, order_id: str) -> None:
    """Claimed and timed out MaxFailureCount (3) times: the Supervisor holds it in Error."""
    await submit(harness, order_id)
    for _ in range(3):
        await harness.message("scheduler_nudge", {"orderId": order_id})
        harness.clock.advance(31)
        await harness.functions["supervisor"].func(
            TimerRequest(past_due=False), **context_for(harness.functions["supervisor"])
        )
    stored = await harness.store.load(order_id)
    assert stored is not None and stored.state.process_state is ProcessState.ERROR


def a_heartbeat(harness: Harness, instance: str, age_seconds: float) -> AgentHealth:
    return AgentHealth(
        agent="payment",
        instance=instance,
        breaker=BreakerState.OPEN,
        success_rate=0.5,
        latency_ms=120.0,
        in_flight=3,
        capacity=16,
        calls=8,
        heartbeat_at=harness.clock.now() - timedelta(seconds=age_seconds),
        open_until=harness.clock.now() + timedelta(seconds=20),
    )


async def data(harness: Harness, **params: str) -> dict[str, Any]:
    response = await harness.http("ops_data", "GET", Route.OPS_DATA, params=params)
    assert response.status_code == 200, response.get_body()
    assert response.mimetype == "application/json"
    assert response.headers["Cache-Control"] == "no-store"
    found: dict[str, Any] = body(response)
    return found


def test_the_ops_routes_are_get_only_and_need_the_admin_key() -> None:
    triggers = {f.name: f.trigger for f in registered_functions()}
    assert {
        name: (t["route"], t["methods"], t["authLevel"])
        for name, t in triggers.items()
        if name in {"ops_page", "ops_data", "ops_order"}
    } == {
        "ops_page": (Route.OPS_PAGE, ["GET"], "ADMIN"),
        "ops_data": (Route.OPS_DATA, ["GET"], "ADMIN"),
        "ops_order": (Route.OPS_ORDER, ["GET"], "ADMIN"),
    }


async def test_the_page_is_html_with_a_csp_that_allows_only_its_own_inline_code(
    harness: Harness,
) -> None:
    response = await harness.http("ops_page", "GET", Route.OPS_PAGE)
    assert response.status_code == 200
    assert (response.mimetype, response.charset) == ("text/html", "utf-8")
    html = response.get_body().decode()
    assert html.startswith("<!doctype html>")
    csp = response.headers["Content-Security-Policy"]
    assert "default-src 'none'" in csp and "connect-src 'self'" in csp
    (script,) = re.findall(r"<script>(.*?)</script>", html, flags=re.DOTALL)
    digest = base64.b64encode(hashlib.sha256(script.encode()).digest()).decode()
    assert f"script-src 'sha256-{digest}'" in csp
    assert "unsafe-inline" not in csp
    assert response.headers["Referrer-Policy"] == "no-referrer"
    assert response.headers["X-Content-Type-Options"] == "nosniff"


async def test_the_page_renders_data_as_text_and_passes_the_key_on(harness: Harness) -> None:
    html = (await harness.http("ops_page", "GET", Route.OPS_PAGE)).get_body().decode()
    for sink in (".innerHTML", ".outerHTML", "insertAdjacentHTML", "document.write", "eval("):
        assert sink not in html
    assert 'get("code")' in html and 'searchParams.set("code", code)' in html
    assert html.count("withCode(") >= 3  # the definition, the data poll and the resubmit


async def test_the_snapshot_shows_states_error_orders_agents_and_sweeps(harness: Harness) -> None:
    await submit(harness, "ops-waiting")
    await drive_to_error(harness, "ops-stuck")
    c = await bootstrap.container()
    await c.health.publish_health(a_heartbeat(harness, "fresh", 5))
    await c.health.publish_health(a_heartbeat(harness, "gone", 61))
    snapshot = await data(harness)
    assert snapshot["at"] == harness.clock.now().isoformat().replace("+00:00", "Z")
    assert snapshot["unavailable"] == []
    assert (snapshot["countCap"], snapshot["staleAfterSeconds"]) == (50, 60)
    counts = {c["state"]: c for c in snapshot["orders"]["counts"]}
    assert list(counts) == [s.value for s in ProcessState]
    assert counts["Pending"] == {
        "state": "Pending",
        "count": 1,
        "capped": False,
        "recent": ["ops-waiting"],
    }
    assert (counts["Error"]["count"], counts["Error"]["recent"]) == (1, ["ops-stuck"])
    (error,) = snapshot["orders"]["errors"]
    assert error["orderId"] == "ops-stuck" and error["failureCount"] == 3
    assert (error["workflow"], error["workflowVersion"]) == ("order-fulfilment", 1)
    assert error["step"] == "reserve-inventory" and error["lastError"]
    agents = {a["instance"]: a for a in snapshot["agents"]}
    assert (agents["fresh"]["stale"], agents["gone"]["stale"]) == (False, True)
    assert (agents["fresh"]["ageSeconds"], agents["gone"]["ageSeconds"]) == (5.0, 61.0)
    assert agents["fresh"] == {
        **agents["fresh"],
        "agent": "payment",
        "breaker": "open",
        "successRate": 0.5,
        "latencyMs": 120.0,
        "inFlight": 3,
        "capacity": 16,
        "calls": 8,
    }
    sweeps = snapshot["sweeps"]
    assert len(sweeps) == 3 and {s["instance"] for s in sweeps} == {"test-instance"}
    assert sweeps[0]["startedAt"] > sweeps[1]["startedAt"] > sweeps[2]["startedAt"]
    assert [s["errored"] for s in sweeps] == [1, 0, 0]
    assert all(s["requeued"] >= 1 for s in sweeps[1:])  # ops-waiting's pending timeout too


async def test_counts_stop_at_the_cap_and_say_so(harness: Harness) -> None:
    for n in range(3):
        await submit(harness, f"ops-{n}")
    capped = {c["state"]: c for c in (await data(harness, countCap="2"))["orders"]["counts"]}
    assert (capped["Processing"]["count"], capped["Processing"]["capped"]) == (2, True)
    exact = {c["state"]: c for c in (await data(harness, countCap="3"))["orders"]["counts"]}
    assert (exact["Processing"]["count"], exact["Processing"]["capped"]) == (3, False)


@pytest.mark.parametrize("cap", ["0", "1001", "-1", "abc", "2.5", "", "²", "1e3", " 5"])
async def test_a_bad_count_cap_is_a_400_problem(harness: Harness, cap: str) -> None:
    response = await harness.http("ops_data", "GET", Route.OPS_DATA, params={"countCap": cap})
    assert response.status_code == 400
    assert response.mimetype == "application/problem+json"
    assert body(response)["title"] == "Invalid countCap"


class Broken:
    """A store whose every call fails, as an unreachable Table service does."""

    def __getattr__(self, name: str) -> Any:
        async def fail(*args: object, **kwargs: object) -> None:
            raise StoreUnavailable(f"{name}: connection refused")

        return fail


async def test_an_unreadable_section_is_named_and_the_rest_still_shows(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    await submit(harness, "ops-1")
    c = await bootstrap.container()
    monkeypatch.setattr(c, "health", Broken())
    snapshot = await data(harness)
    assert snapshot["unavailable"] == ["agents", "sweeps"]
    assert snapshot["agents"] == [] and snapshot["sweeps"] == []
    assert {c["state"]: c["count"] for c in snapshot["orders"]["counts"]}["Processing"] == 1
    monkeypatch.setattr(harness.store, "rest_entries", Broken().rest_entries)
    assert (await data(harness))["unavailable"] == ["orders", "agents", "sweeps"]


async def test_a_sweep_that_cannot_be_recorded_still_recovers_orders(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    await submit(harness, "ops-1")
    c = await bootstrap.container()
    monkeypatch.setattr(c, "health", Broken())
    harness.clock.advance(31)
    await harness.functions["supervisor"].func(
        TimerRequest(past_due=False), **context_for(harness.functions["supervisor"])
    )
    stored = await harness.store.load("ops-1")
    assert stored is not None and stored.state.failure_count == 1


async def test_the_page_may_read_the_local_trace_query_and_the_snapshot_names_it(
    harness: Harness,
) -> None:
    assert (await data(harness))["traceQueryUrl"] is None  # Azure: Application Insights
    c = await bootstrap.container()
    c.settings = dataclasses.replace(c.settings, trace_query_url="http://127.0.0.1:4318/api/traces")
    response = await harness.http("ops_page", "GET", Route.OPS_PAGE)
    csp = response.headers["Content-Security-Policy"]
    assert "connect-src 'self' http://127.0.0.1:4318;" in csp
    assert (await data(harness))["traceQueryUrl"] == "http://127.0.0.1:4318/api/traces"
