"""Operators who sign in, on the real local stack with `OperatorAuth=dev-header`
(docs/sign-in.md): the principal travels as App Service authentication would pass it,
no key is sent, and the role decides. A reader who tries to cancel gets 403; an
operator's cancel is recorded under the principal's name, the typed name only a note.
The CLI acts as a principal the same way (`--principal`, `--role`), and so does the demo
(`OperatorAuth=dev-header bin/demo`: a reader's resubmit is refused first)."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from rich.console import Console

from devhost import demo
from devhost.harness.stack import Stack
from shared.contract import Route, Setting
from shared.domain.principal import PRINCIPAL_HEADER, Role, encode_client_principal
from tests.cli.conftest import cli
from tests.waiting import eventually

pytestmark = [pytest.mark.e2e, pytest.mark.azurite, pytest.mark.broker]

READER = {PRINCIPAL_HEADER: encode_client_principal("rita@contoso.test", [Role.READ.value])}
OPERATOR = {
    PRINCIPAL_HEADER: encode_client_principal("oscar@contoso.test", [Role.OPERATE.value]),
    "x-operator": "Oscar at the desk",
}


async def ask(
    session: aiohttp.ClientSession, method: str, url: str, headers: dict[str, str]
) -> tuple[int, str, dict[str, Any]]:
    async with session.request(method, url, headers=headers, json={}) as response:
        return response.status, response.content_type, await response.json(content_type=None)


async def test_a_reader_is_refused_a_cancel_and_an_operators_cancel_carries_its_name(
    tmp_path: Path,
) -> None:
    settings = {Setting.OPERATOR_AUTH: "dev-header"}
    async with (
        Stack("signin", tmp_path, settings=settings) as stack,
        aiohttp.ClientSession() as session,
    ):
        app = stack.app(session)
        # The step runs a while, so the cancel lands before the pivot (payment).
        await stack.simulator(session).set_faults("inventory", slowMs=4000)
        await app.submit_order("si-1")
        cancel = app.url(Route.CANCEL, "si-1")

        status, media, problem = await ask(session, "POST", cancel, {})
        assert (status, media) == (401, "application/problem+json")
        assert problem["code"] == "not-signed-in"

        status, _, listing = await ask(session, "GET", app.url(Route.ORDERS), READER)
        assert status == 200 and "si-1" in {o["orderId"] for o in listing["items"]}

        status, _, view = await ask(session, "GET", app.url(Route.OPS_ORDER, "si-1"), READER)
        assert (status, view["orderId"]) == (200, "si-1")

        status, media, problem = await ask(session, "POST", cancel, READER)
        assert (status, media) == (403, "application/problem+json"), problem
        assert "rita@contoso.test" in problem["detail"] and Role.OPERATE.value in problem["detail"]
        assert "cancel-requested" not in {h["event"] for h in (await app.order("si-1"))["history"]}

        status, _, answer = await ask(session, "POST", cancel, OPERATOR)
        assert status == 202, answer

        async def cancel_entry() -> dict[str, Any] | None:
            history = (await app.order("si-1"))["history"]
            return next((h for h in history if h["event"] == "cancel-requested"), None)

        entry = await eventually("the cancel in the order's history", cancel_entry, timeout=30)
        assert entry["detail"] == "by oscar@contoso.test (note: Oscar at the desk)"

        url = ["--url", stack.api()]
        reader = ["--principal", "rita@contoso.test", "--role", Role.READ.value]
        listed = await cli("orders", "list", *url, *reader, "--json")
        assert listed.code == 0 and "si-1" in listed.out, listed
        refused = await cli("orders", "suspend", "si-1", *url, *reader)
        assert refused.code != 0 and "needs the role Orders.Operate" in refused.err, refused
        anonymous = await cli("orders", "list", *url)
        assert anonymous.code != 0 and "--principal" in anonymous.err, anonymous

        shown = io.StringIO()
        run = demo.Demo(
            Console(file=shown, width=200),
            app,
            stack.simulator(session),
            stack.broker(session),
            stack.api(),
            "signin",
            [],
            set(),
        )
        headers = await demo._reader_then_operator(run, "si-1")
        assert (
            "reader@demo.local (Orders.Read) tries to resubmit si-1: HTTP 403" in shown.getvalue()
        )
        # Past the role check (a 403 otherwise): the cancelled order is not in Error.
        status, answer = await app.resubmit("si-1", headers)
        assert (status, answer["title"]) == (409, "Not in Error"), answer
