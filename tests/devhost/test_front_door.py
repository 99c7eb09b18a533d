"""The local front door: loopback host names only, no cross-origin state changes, and
function and admin keys when ``DevhostEnforceKeys`` is on."""

from __future__ import annotations

import logging

import aiohttp
import azure.functions as func
import pytest

from devhost.host import LocalHost
from devhost.host.guard import AuthLevel, allowed_host, foreign_origin, host_name
from devhost.settings import SettingsError
from shared.contract import DevhostSetting
from tests.devhost.conftest import HostFactory

FUNCTION_KEY = "fn-key-123"
MASTER_KEY = "master-key-456"
ENFORCED = {
    DevhostSetting.ENFORCE_KEYS: "true",
    DevhostSetting.FUNCTION_KEY: FUNCTION_KEY,
    DevhostSetting.MASTER_KEY: MASTER_KEY,
}


def keyed_app() -> func.FunctionApp:
    app = func.FunctionApp(http_auth_level=func.AuthLevel.FUNCTION)

    @app.route(route="things", methods=["POST"], auth_level=func.AuthLevel.FUNCTION)
    async def add_thing(req: func.HttpRequest) -> func.HttpResponse:
        return func.HttpResponse(status_code=202, headers={"Location": f"{req.url}/1"})

    @app.route(route="admin/things", methods=["GET"], auth_level=func.AuthLevel.ADMIN)
    async def list_things(req: func.HttpRequest) -> func.HttpResponse:
        return func.HttpResponse("[]", mimetype="application/json")

    @app.route(route="open", methods=["GET"], auth_level=func.AuthLevel.ANONYMOUS)
    async def open_route(req: func.HttpRequest) -> func.HttpResponse:
        return func.HttpResponse("ok")

    return app


async def started(make_host: HostFactory, settings: dict[str, str]) -> LocalHost:
    host = make_host(keyed_app(), settings)
    await host.start()
    return host


async def status_of(
    method: str, url: str, headers: dict[str, str] | None = None
) -> tuple[int, str, dict[str, str]]:
    async with (
        aiohttp.ClientSession() as session,
        session.request(method, url, headers=headers or {}) as response,
    ):
        return response.status, await response.text(), dict(response.headers)


@pytest.mark.parametrize(
    ("header", "allowed"),
    [
        ("localhost", True),
        ("localhost:7071", True),
        ("127.0.0.1:7071", True),
        ("[::1]:7071", True),
        ("LOCALHOST:1", True),
        (None, True),
        ("evil.example", False),
        ("evil.example:7071", False),
        ("localhost.evil.example", False),
        ("127.0.0.1.nip.io:7071", False),
        ("localhost:7071@evil.example", False),
        ("[::1]evil", False),
    ],
)
def test_only_loopback_host_names_are_allowed(header: str | None, allowed: bool) -> None:
    assert allowed_host(header) is allowed


def test_host_names_and_origins() -> None:
    assert host_name("[::1]:7071") == "[::1]"
    own = "http://127.0.0.1:7071"
    assert not foreign_origin("POST", None, own)
    assert not foreign_origin("POST", "http://127.0.0.1:7071", own)
    assert not foreign_origin("GET", "http://evil.example", own)
    assert foreign_origin("POST", "http://evil.example", own)
    assert foreign_origin("DELETE", "null", own)
    assert foreign_origin("PUT", "http://127.0.0.1:7072", own)


def test_auth_levels_from_bindings() -> None:
    assert AuthLevel.of("FUNCTION") is AuthLevel.FUNCTION
    assert AuthLevel.of("AuthLevel.ADMIN") is AuthLevel.ADMIN
    assert AuthLevel.of(None) is AuthLevel.FUNCTION


@pytest.mark.e2e
async def test_a_foreign_host_is_refused_and_not_echoed(make_host: HostFactory) -> None:
    host = await started(make_host, {})
    status, body, headers = await status_of(
        "POST", f"{host.api_url}/things", {"Host": "evil.example"}
    )
    assert status == 421
    assert headers["Content-Type"].startswith("application/problem+json")
    assert "evil" not in body and "evil" not in str(headers)
    status, _, headers = await status_of("POST", f"{host.api_url}/things")
    assert status == 202 and headers["Location"].startswith("http://127.0.0.1:")


@pytest.mark.e2e
async def test_a_state_change_from_another_origin_is_refused(make_host: HostFactory) -> None:
    host = await started(make_host, {})
    evil = {"Origin": "http://evil.example"}
    assert (await status_of("POST", f"{host.api_url}/things", evil))[0] == 403
    assert (await status_of("GET", f"{host.api_url}/open", evil))[0] == 200
    own = {"Origin": host.http_url}
    assert (await status_of("POST", f"{host.api_url}/things", own))[0] == 202


@pytest.mark.e2e
async def test_without_the_setting_no_key_is_needed(make_host: HostFactory) -> None:
    host = await started(make_host, {DevhostSetting.ENFORCE_KEYS: "false"})
    assert (await status_of("GET", f"{host.api_url}/admin/things"))[0] == 200


@pytest.mark.e2e
async def test_keys_are_enforced_as_azure_does(
    make_host: HostFactory, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    host = await started(make_host, ENFORCED)
    api = host.api_url

    async def status(method: str, path: str, key: str | None = None, query: bool = False) -> int:
        if key is not None and query:
            return (await status_of(method, f"{api}/{path}?code={key}"))[0]
        headers = {"x-functions-key": key} if key is not None else {}
        return (await status_of(method, f"{api}/{path}", headers))[0]

    assert await status("POST", "things") == 401
    assert await status("POST", "things", "wrong") == 401
    assert await status("POST", "things", FUNCTION_KEY) == 202
    assert await status("POST", "things", MASTER_KEY) == 202
    assert await status("POST", "things", FUNCTION_KEY, query=True) == 202
    assert await status("GET", "admin/things") == 401
    assert await status("GET", "admin/things", FUNCTION_KEY) == 401
    assert await status("GET", "admin/things", MASTER_KEY) == 200
    assert await status("GET", "admin/things", MASTER_KEY, query=True) == 200
    assert await status("GET", "open") == 200
    _, body, headers = await status_of("GET", f"{api}/admin/things")
    assert headers["Content-Type"].startswith("application/problem+json")
    assert "master key" in body
    logged = caplog.text + repr(host._http)
    assert FUNCTION_KEY not in logged and MASTER_KEY not in logged


def test_enforcement_without_keys_is_a_settings_error(make_host: HostFactory) -> None:
    with pytest.raises(SettingsError, match="DevhostMasterKey"):
        make_host(keyed_app(), {DevhostSetting.ENFORCE_KEYS: "true"})


def test_the_key_settings_are_documented() -> None:
    from tests.infra.test_contract_doc import documented  # noqa: PLC0415

    code = {v for k, v in vars(DevhostSetting).items() if k.isupper()}
    assert documented("7.3 Local front door") == code
