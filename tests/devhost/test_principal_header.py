"""The local runtime hands functions the principal header only in dev-header mode and
only from a loopback client (docs/sign-in.md); anywhere else it is taken off, as the
platform's authentication takes a client's copy off in Azure."""

from __future__ import annotations

import aiohttp
import azure.functions as func
import pytest

from devhost.host import guard
from shared.adapters import host_keys
from shared.contract import DevhostSetting, Setting
from shared.domain.principal import PRINCIPAL_HEADER
from tests.devhost.conftest import HostFactory


@pytest.mark.parametrize(
    ("settings", "passes"),
    [
        ({}, False),
        ({Setting.OPERATOR_AUTH: ""}, False),
        ({Setting.OPERATOR_AUTH: "platform"}, False),
        ({Setting.OPERATOR_AUTH: "token"}, False),
        ({Setting.OPERATOR_AUTH: "dev-header"}, True),
        ({Setting.OPERATOR_AUTH: " Dev-Header "}, True),
    ],
)
def test_only_dev_header_mode_passes_the_header(settings: dict[str, str], passes: bool) -> None:
    assert guard.passes_principal(settings) is passes


@pytest.mark.parametrize(
    ("peer", "kept"),
    [
        ("127.0.0.1", True),
        ("127.8.9.10", True),
        ("::1", True),
        ("10.0.0.5", False),
        ("192.168.1.20", False),
        ("::ffff:10.0.0.5", False),
        ("fe80::1%eth0", False),
        ("", False),
        (None, False),
        ("not-an-address", False),
    ],
)
def test_in_dev_header_mode_only_a_loopback_client_keeps_it(peer: str | None, kept: bool) -> None:
    assert guard.keeps_principal(True, peer) is kept
    assert guard.keeps_principal(False, peer) is False


def test_taking_it_off_leaves_every_other_header() -> None:
    headers = {"X-MS-CLIENT-PRINCIPAL": "e30=", "x-operator": "ann", "accept": "*/*"}
    assert guard.without_principal(headers) == {"x-operator": "ann", "accept": "*/*"}
    assert PRINCIPAL_HEADER.lower() == PRINCIPAL_HEADER


def principal_app() -> func.FunctionApp:
    app = func.FunctionApp(http_auth_level=func.AuthLevel.ANONYMOUS)

    @app.route(route="who", methods=["GET"], auth_level=func.AuthLevel.ANONYMOUS)
    async def who(req: func.HttpRequest) -> func.HttpResponse:
        return func.HttpResponse(req.headers.get(PRINCIPAL_HEADER) or "nobody")

    return app


async def said(url: str, headers: dict[str, str] | None = None) -> tuple[int, str]:
    async with (
        aiohttp.ClientSession() as session,
        session.get(url, headers=headers or {}) as response,
    ):
        return response.status, await response.text()


@pytest.mark.e2e
@pytest.mark.parametrize(("mode", "seen"), [("dev-header", "e30="), ("", "nobody")])
async def test_the_runtime_passes_the_header_to_a_function_only_in_dev_header_mode(
    make_host: HostFactory, mode: str, seen: str
) -> None:
    host = make_host(principal_app(), {Setting.OPERATOR_AUTH: mode})
    await host.start()
    assert await said(f"{host.api_url}/who", {"X-MS-CLIENT-PRINCIPAL": "e30="}) == (200, seen)


@pytest.mark.e2e
async def test_the_host_status_admits_the_master_key_only(make_host: HostFactory) -> None:
    enforced = {
        DevhostSetting.ENFORCE_KEYS: "true",
        DevhostSetting.FUNCTION_KEY: "fn-key",
        DevhostSetting.MASTER_KEY: "master-key",
    }
    host = make_host(principal_app(), enforced)
    await host.start()
    status = f"{host.http_url}{host_keys.STATUS_PATH}"
    assert (await said(status, {"x-functions-key": "master-key"}))[0] == 200
    assert (await said(f"{status}?code=master-key"))[0] == 200
    assert (await said(status, {"x-functions-key": "fn-key"}))[0] == 401
    assert (await said(status))[0] == 401
    assert await host_keys.is_master_key(host.http_url, "master-key")
    assert not await host_keys.is_master_key(host.http_url, "fn-key")
    open_host = make_host(principal_app(), {})
    await open_host.start()
    assert (await said(f"{open_host.http_url}{host_keys.STATUS_PATH}"))[0] == 401
