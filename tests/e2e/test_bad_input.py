"""Issue 15's bad-input rows against the running system: deep JSON, a cross-site
request, a foreign Host, a text/plain body, and keys when the runtime enforces them."""

from __future__ import annotations

import base64
import io
import json
import uuid
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
from yarl import URL

import function_app
from devhost.broker import Broker
from devhost.host.loader import functions_of
from devhost.host.runtime import LocalHost
from devhost.simulator import SimulatorServer
from shared import bootstrap, jsonbounds
from shared.cli.app import run as cli
from shared.contract import DevhostSetting, Setting
from shared.settings import azurite_connection_string
from tests.workflows import AGENTS

pytestmark = pytest.mark.e2e

DEEP = "[" * 976 + "]" * 976
ORDER = {"customerId": "c-1", "items": [{"sku": "SKU-1", "quantity": 1, "unitPrice": 5.0}]}
FUNCTION_KEY = "e2e-function-key"
MASTER_KEY = "e2e-master-key"


async def ask(
    session: aiohttp.ClientSession, method: str, url: str, **kwargs: Any
) -> tuple[int, str, dict[str, str]]:
    async with session.request(method, url, **kwargs) as response:
        return response.status, await response.text(), dict(response.headers)


def is_problem(status: int, body: str, expected: int) -> bool:
    return status == expected and json.loads(body)["status"] == expected


async def test_json_976_levels_deep_is_a_400(system: Any) -> None:
    json_type = {"Content-Type": "application/json"}
    for body in (DEEP, '{"customerId": ' + DEEP + "}"):
        status, text, _ = await ask(
            system.session, "POST", f"{system.api}/orders", data=body, headers=json_type
        )
        assert is_problem(status, text, 400), text
    token = base64.urlsafe_b64encode(DEEP.encode()).decode()
    for continuation in (token, DEEP):
        status, text, _ = await ask(
            system.session, "GET", f"{system.api}/orders", params={"continuation": continuation}
        )
        assert is_problem(status, text, 400), text


async def test_a_state_change_from_another_origin_is_a_403(system: Any) -> None:
    evil = {"Origin": "http://evil.example"}
    status, text, _ = await ask(
        system.session, "POST", f"{system.api}/orders", json=ORDER, headers=evil
    )
    assert is_problem(status, text, 403), text
    status, text, _ = await ask(
        system.session, "POST", f"{system.api}/orders/o-1/resubmit", headers=evil
    )
    assert is_problem(status, text, 403), text
    page = await ask(system.session, "GET", f"{system.api}/orders")
    assert json.loads(page[1])["items"] == []


async def test_a_text_plain_post_is_a_415(system: Any) -> None:
    for headers in ({"Content-Type": "text/plain"}, {}):
        status, text, _ = await ask(
            system.session,
            "POST",
            f"{system.api}/orders",
            data=json.dumps(ORDER).encode(),
            headers=headers,
        )
        assert is_problem(status, text, 415), text
    status, _, _ = await ask(
        system.session,
        "POST",
        f"{system.api}/orders",
        data=json.dumps(ORDER),
        headers={"Content-Type": "application/json; charset=utf-8"},
    )
    assert status == 202


async def test_a_foreign_host_is_refused_and_never_echoed(system: Any) -> None:
    status, text, headers = await ask(
        system.session,
        "POST",
        f"{system.api}/orders",
        json={**ORDER, "orderId": "host-1"},
        headers={"Host": "evil.example"},
    )
    assert is_problem(status, text, 421), text
    assert "evil" not in text and "evil" not in json.dumps(headers)
    status, _, headers = await ask(
        system.session, "POST", f"{system.api}/orders", json={**ORDER, "orderId": "host-1"}
    )
    assert status == 202 and headers["Location"].startswith("http://127.0.0.1:")


ITEMS = '[{"sku": "SKU-1", "quantity": 1, "unitPrice": 5.0}]'
EDGE_BODIES = {
    "order, customerId escaped": (
        "POST",
        "orders",
        '{"customerId": "c-\\ud800", "items": $}'.replace("$", ITEMS),
    ),
    "order, customerId raw": (
        "POST",
        "orders",
        '{"customerId": "c-\ud800", "items": $}'.replace("$", ITEMS),
    ),
    "order, unitPrice 1e400": (
        "POST",
        "orders",
        '{"customerId": "c-1", "items": [{"sku": "S", "quantity": 1, "unitPrice": 1e400}]}',
    ),
    "cancel reason": ("POST", "orders/o-edge/cancel", '{"reason": "\\ud800"}'),
    "approval by NaN": (
        "POST",
        "orders/o-edge/events/review",
        '{"eventId": "ev-1", "data": {"approved": true, "by": NaN}}',
    ),
    "approval by a lone surrogate": (
        "POST",
        "orders/o-edge/events/review",
        '{"eventId": "ev-2", "data": {"approved": true, "by": "\\ud800x"}}',
    ),
    "approval by an object": (
        "POST",
        "orders/o-edge/events/review",
        '{"eventId": "ev-3", "data": {"approved": true, "by": {"name": "ana"}}}',
    ),
    "drain reason": ("PUT", "agents/payment/drain", '{"drained": true, "reason": "\\udfff"}'),
    **{
        f"bulk {action}, filter.customerId {how}{', dry run' if dry else ''}": (
            "POST",
            "orders/bulk",
            json.dumps({"action": action, "dryRun": dry, "filter": {"state": state}})[:-2]
            + f', "customerId": "{lone}"}}}}',
        )
        for action, state in (("cancel", "Error"), ("resume", "Suspended"), ("resubmit", "Error"))
        for how, lone in (("escaped", "\\ud800"), ("raw", "\ud800"))
        for dry in (False, True)
    },
}
"""Issue 41's findings 1-4 on the running system: each was a 202 (and stored), or a 500
for the bulk filter, whose Table Storage query could not quote it."""


async def test_a_lone_surrogate_or_a_non_finite_number_in_a_body_is_a_400_and_kept_nowhere(
    system: Any,
) -> None:
    review = {**ORDER, "orderId": "o-edge", "workflow": "reviewed-order"}
    status, text, _ = await ask(system.session, "POST", f"{system.api}/orders", json=review)
    assert status == 202, text
    json_type = {"Content-Type": "application/json"}
    for case, (method, path, body) in EDGE_BODIES.items():
        status, text, _ = await ask(
            system.session,
            method,
            f"{system.api}/{path}",
            data=body.encode("utf-8", "surrogatepass"),
            headers=json_type,
        )
        assert is_problem(status, text, 400), (case, status, text)
    status, text, _ = await ask(system.session, "GET", f"{system.api}/orders/o-edge")
    assert status == 200
    order = jsonbounds.loads(text)  # strict: what the rule refuses was never kept
    assert order["events"] == [] and order["processState"] != "Cancelled"
    status, text, _ = await ask(system.session, "GET", f"{system.api}/agents")
    assert not any(a["drained"] for a in jsonbounds.loads(text)["agents"])
    status, text, _ = await ask(system.session, "GET", f"{system.api}/orders?pageSize=1000")
    assert [o["orderId"] for o in jsonbounds.loads(text)["items"]] == ["o-edge"]


@pytest.mark.parametrize(
    "path",
    [
        "orders/%ED%A0%80",
        "orders/o-edge/events/%ED%A0%80",
        "orders?continuation=%ED%A0%80",
        "orders?state=Error&continuation=%ED%A0%80",
        "orders?state=Processing&continuation=%ED%A0%80",
        "archive/%ED%A0%80",
        "orders?pageSize=NaN",
        "archive/2026-01-01?pages=Infinity",
    ],
)
async def test_a_surrogates_bytes_or_a_non_finite_number_in_a_url_is_no_5xx(
    system: Any, path: str
) -> None:
    """A URL has no spelling for a lone surrogate: these are the bytes one would take,
    which the runtime reads as U+FFFD; a 4xx, never a 5xx."""
    url = URL(f"{system.api}/{path}", encoded=True)
    async with system.session.get(url) as response:
        assert response.status < 500, await response.text()


@pytest.fixture
async def keyed_api(
    azurite_table_port: int,
    broker: Broker,
    simulator: SimulatorServer,
    monkeypatch: pytest.MonkeyPatch,
) -> AsyncIterator[str]:
    """The app on the local runtime with DevhostEnforceKeys=true."""
    settings = {
        Setting.STORAGE: azurite_connection_string(azurite_table_port),
        Setting.SERVICE_BUS: broker.connection_string,
        Setting.STATE_TABLE: f"keys{uuid.uuid4().hex[:12]}",
        Setting.SUPERVISOR_SCHEDULE: "*/1 * * * * *",
        Setting.RECONCILE_SCHEDULE: "0 0 * * * *",
        Setting.ARCHIVE_SCHEDULE: "0 0 0 1 1 *",
        Setting.AGENT_HEARTBEAT_SCHEDULE: "*/5 * * * * *",
        Setting.BULK_ACTIONS_SCHEDULE: "*/5 * * * * *",
        Setting.STEP_TIMEOUT_SECONDS: "6",
        **{spec.service_url_setting: f"{simulator.url}/{name}" for name, spec in AGENTS.items()},
        DevhostSetting.ENFORCE_KEYS: "true",
        DevhostSetting.FUNCTION_KEY: FUNCTION_KEY,
        DevhostSetting.MASTER_KEY: MASTER_KEY,
    }
    for name, value in settings.items():
        monkeypatch.setenv(name, value)
    bootstrap.reset()
    host = LocalHost(functions_of(function_app.app), settings, port=0, drain_timeout=5)
    await host.start()
    try:
        yield host.api_url
    finally:
        await host.stop()
        await bootstrap.shutdown()


async def test_keys_are_enforced_when_the_setting_is_on(keyed_api: str) -> None:
    async with aiohttp.ClientSession() as session:

        async def status(method: str, path: str, key: str | None = None, **kw: Any) -> int:
            headers = {"x-functions-key": key} if key else {}
            return (await ask(session, method, f"{keyed_api}/{path}", headers=headers, **kw))[0]

        body = {**ORDER, "orderId": "keyed-1"}
        assert await status("POST", "orders", json=body) == 401
        assert await status("POST", "orders", "wrong", json=body) == 401
        assert await status("POST", "orders", FUNCTION_KEY, json=body) == 202
        assert await status("GET", "orders/keyed-1", FUNCTION_KEY) == 200
        assert await status("GET", f"orders/keyed-1?code={MASTER_KEY}") == 200
        assert await status("GET", "orders") == 401
        assert await status("GET", "orders", FUNCTION_KEY) == 401
        assert await status("GET", "orders", MASTER_KEY) == 200
        assert await status("GET", "ops/data", FUNCTION_KEY) == 401
        assert await status("GET", "health") in (200, 503)
        assert await status("GET", "openapi.json") == 200

    url = keyed_api.removesuffix("/api")
    for key, expected in ((MASTER_KEY, 0), (FUNCTION_KEY, None), (None, None)):
        out, err = io.StringIO(), io.StringIO()
        argv = ["--json", "orders", "list", "--url", url]
        code = await cli([*argv, "--key", key] if key else argv, out, err, env={})
        if expected == 0:
            assert code == 0, err.getvalue()
            listed = json.loads(out.getvalue())
            assert [o["orderId"] for o in listed["items"]] == ["keyed-1"]
        else:
            assert code != 0
            assert "HTTP 401" in err.getvalue()
            assert MASTER_KEY not in err.getvalue() and FUNCTION_KEY not in err.getvalue()
    out, err = io.StringIO(), io.StringIO()
    code = await cli(
        ["--json", "orders", "show", "keyed-1", "--url", url, "--key", FUNCTION_KEY], out, err, {}
    )
    assert code == 0, err.getvalue()
    assert json.loads(out.getvalue())["orderId"] == "keyed-1"
