"""Operators who sign in, route by route (docs/sign-in.md, docs/contract.md#15-who-acts).

The principal header in every shape a client could send it gets a precise 401 or 403,
never a 500; a bearer token is checked against a local JWKS served by a real HTTP
server, with a key made for the test; with `OperatorAuth` unset the header changes
nothing.
"""

from __future__ import annotations

import base64
import contextlib
import json
import time
import uuid
from collections.abc import AsyncIterator, Mapping
from typing import Any

import azure.functions as func
import jwt
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from cryptography.hazmat.primitives.asymmetric import rsa

from shared.adapters import host_keys
from shared.contract import Setting
from shared.domain.principal import PRINCIPAL_HEADER, Role, encode_client_principal
from shared.settings import ConfigurationError, Settings
from tests.functions.conftest import SETTINGS, Harness, harness_with
from tests.functions.test_functions import ORDER, assert_problem, body
from tests.workflows import CATALOGUE

DEV_HEADER = {Setting.OPERATOR_AUTH: "dev-header"}
ISSUER = "https://login.example.test/tenant-1/v2.0"
AUDIENCE = "api://orders-test"


@contextlib.asynccontextmanager
async def served(app: web.Application) -> AsyncIterator[TestServer]:
    """A real HTTP server on a free loopback port."""
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    try:
        yield server
    finally:
        await server.close()


def header(document: Any) -> dict[str, str]:
    raw = json.dumps(document).encode()
    return {PRINCIPAL_HEADER: base64.b64encode(raw).decode()}


def principal(name: str, *roles: Role) -> dict[str, str]:
    return {PRINCIPAL_HEADER: encode_client_principal(name, [r.value for r in roles])}


async def list_orders(harness: Harness, headers: Mapping[str, str]) -> func.HttpResponse:
    return await harness.http("list_orders_http", "GET", "orders", headers=dict(headers))


async def cancel(harness: Harness, headers: Mapping[str, str]) -> func.HttpResponse:
    return await harness.http(
        "cancel_order_http",
        "POST",
        "orders/fn-1/cancel",
        headers=dict(headers),
        route_params={"orderId": "fn-1"},
    )


async def cancel_detail(harness: Harness) -> str:
    history = await harness.store.history("fn-1")
    return next(h.detail for h in history if h.event == "cancel-requested")


@pytest.fixture
async def dev_header() -> AsyncIterator[Harness]:
    async with harness_with(DEV_HEADER) as harness:
        await harness.http("submit_order_http", "POST", "orders", ORDER)
        yield harness


@pytest.mark.parametrize(
    ("sent", "words"),
    [
        ({PRINCIPAL_HEADER: "not base64!"}, "not base64"),
        ({PRINCIPAL_HEADER: base64.b64encode(b"{not json").decode()}, "not base64 of JSON"),
        ({PRINCIPAL_HEADER: base64.b64encode(b"\xff\xfe").decode()}, "not base64 of JSON"),
        ({PRINCIPAL_HEADER: ""}, "empty"),
        ({PRINCIPAL_HEADER: "A" * 20000}, "over"),
        (header([1, 2]), '{"claims"'),
        (header({"auth_typ": "aad"}), '{"claims"'),
        (header({"claims": ["roles"]}), "not an object"),
        (header({"claims": [{"typ": "roles", "val": 7}]}), '"val": str'),
        (
            header({"name_typ": "name", "claims": [{"typ": "roles", "val": "Orders.Read"}]}),
            "no one",
        ),
        (header({"claims": [{"typ": "name", "val": "   "}]}), "no one"),
        ({PRINCIPAL_HEADER: base64.b64encode(b"[" * 100000).decode()[:16000]}, "JSON"),
    ],
)
async def test_a_principal_header_that_does_not_read_is_a_401_saying_why(
    dev_header: Harness, sent: dict[str, str], words: str
) -> None:
    for answer in (await list_orders(dev_header, sent), await cancel(dev_header, sent)):
        problem = assert_problem(answer, 401)
        assert words in problem["detail"] and problem["code"] == "not-signed-in"


async def test_no_principal_and_no_key_is_a_401(dev_header: Harness) -> None:
    problem = assert_problem(await cancel(dev_header, {}), 401)
    assert Role.OPERATE.value in problem["detail"]


async def test_a_principal_without_the_role_is_a_403_naming_who_and_what(
    dev_header: Harness,
) -> None:
    nobody = principal("nora@contoso.test")
    problem = assert_problem(await list_orders(dev_header, nobody), 403)
    assert "nora@contoso.test holds no app role" in problem["detail"]
    reader = principal("rita@contoso.test", Role.READ)
    assert (await list_orders(dev_header, reader)).status_code == 200
    problem = assert_problem(await cancel(dev_header, reader), 403)
    assert problem["code"] == "missing-role" and Role.OPERATE.value in problem["detail"]
    assert not [h for h in await dev_header.store.history("fn-1") if h.event == "cancel-requested"]


async def test_an_operator_acts_is_recorded_by_its_name_claim_and_reads_only_with_read(
    dev_header: Harness,
) -> None:
    operator = principal("oscar@contoso.test", Role.OPERATE)
    assert_problem(await list_orders(dev_header, operator), 403)
    typed = {**operator, "x-operator": "someone else"}
    assert (await cancel(dev_header, typed)).status_code == 202
    assert await cancel_detail(dev_header) == "by oscar@contoso.test (note: someone else)"


async def test_the_name_is_the_claim_name_typ_names() -> None:
    document = {
        "auth_typ": "aad",
        "name_typ": "preferred_username",
        "role_typ": "http://schemas.microsoft.com/ws/2008/06/identity/claims/role",
        "claims": [
            {"typ": "name", "val": "Oscar O."},
            {"typ": "preferred_username", "val": "oscar@contoso.test"},
            {"typ": "roles", "val": Role.OPERATE.value},
        ],
    }
    async with harness_with(DEV_HEADER) as harness:
        await harness.http("submit_order_http", "POST", "orders", ORDER)
        assert (await cancel(harness, header(document))).status_code == 202
        assert await cancel_detail(harness) == "by oscar@contoso.test"


async def test_with_operator_auth_unset_the_header_is_ignored(harness: Harness) -> None:
    await harness.http("submit_order_http", "POST", "orders", ORDER)
    nobody = {**principal("nora@contoso.test"), "x-operator": "ann"}
    assert (await list_orders(harness, {PRINCIPAL_HEADER: "not base64!"})).status_code == 200
    assert (await cancel(harness, nobody)).status_code == 202
    assert await cancel_detail(harness) == "by ann"


async def test_the_master_key_is_break_glass_recorded_as_master_key(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async def status(request: web.Request) -> web.Response:
        return web.Response(status=200 if request.headers.get("x-functions-key") == "mk" else 401)

    app = web.Application()
    app.router.add_get(host_keys.STATUS_PATH, status)
    async with served(app) as server, harness_with(DEV_HEADER) as harness:
        own = str(server.make_url("")).rstrip("/")
        monkeypatch.setattr("shared.functions.signin.base_url", lambda req: own)
        await harness.http("submit_order_http", "POST", "orders", ORDER)
        assert_problem(await cancel(harness, {"x-functions-key": "guess"}), 401)
        answer = await cancel(harness, {"x-functions-key": "mk", "x-operator": "ann"})
        assert answer.status_code == 202, body(answer)
        assert await cancel_detail(harness) == "by master-key (note: ann)"


def test_dev_header_refuses_to_run_in_azure_and_token_mode_needs_its_settings() -> None:
    with pytest.raises(ConfigurationError, match="local runtime only"):
        Settings.from_env(
            {**SETTINGS, **DEV_HEADER, Setting.SITE_NAME: "orders-app"}, catalogue=CATALOGUE
        )
    with pytest.raises(ConfigurationError, match="OperatorAuthAudience"):
        Settings.from_env({**SETTINGS, Setting.OPERATOR_AUTH: "token"}, catalogue=CATALOGUE)
    with pytest.raises(ConfigurationError, match="OperatorAuth must be"):
        Settings.from_env({**SETTINGS, Setting.OPERATOR_AUTH: "header"}, catalogue=CATALOGUE)


# -- token mode ---------------------------------------------------------------------------


class Tenant:
    """A tenant of one: a signing key, its JWKS served over HTTP, and tokens."""

    def __init__(self) -> None:
        self.key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        self.kid = uuid.uuid4().hex

    def jwks(self) -> dict[str, Any]:
        jwk = json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(self.key.public_key()))
        return {"keys": [{**jwk, "kid": self.kid, "use": "sig", "alg": "RS256"}]}

    def token(
        self,
        *,
        roles: list[str] | None = None,
        audience: str = AUDIENCE,
        issuer: str = ISSUER,
        expires_in: int = 600,
        key: rsa.RSAPrivateKey | None = None,
    ) -> str:
        claims: dict[str, Any] = {
            "iss": issuer,
            "aud": audience,
            "exp": int(time.time()) + expires_in,
            "iat": int(time.time()),
            "preferred_username": "tess@contoso.test",
            "oid": "00000000-0000-0000-0000-000000000001",
        }
        if roles is not None:
            claims["roles"] = roles
        return jwt.encode(claims, key or self.key, "RS256", headers={"kid": self.kid})


@pytest.fixture
async def tenant_harness() -> AsyncIterator[tuple[Tenant, Harness]]:
    tenant = Tenant()

    async def keys(request: web.Request) -> web.Response:
        return web.json_response(tenant.jwks())

    app = web.Application()
    app.router.add_get("/discovery/v2.0/keys", keys)
    async with served(app) as server:
        settings = {
            Setting.OPERATOR_AUTH: "token",
            Setting.OPERATOR_AUTH_ISSUER: ISSUER,
            Setting.OPERATOR_AUTH_AUDIENCE: AUDIENCE,
            Setting.OPERATOR_AUTH_JWKS_URL: str(server.make_url("/discovery/v2.0/keys")),
        }
        async with harness_with(settings) as harness:
            await harness.http("submit_order_http", "POST", "orders", ORDER)
            yield tenant, harness


def bearer(token: str) -> dict[str, str]:
    return {"authorization": f"Bearer {token}"}


async def test_a_token_for_this_audience_from_this_issuer_is_admitted_with_its_roles(
    tenant_harness: tuple[Tenant, Harness],
) -> None:
    tenant, harness = tenant_harness
    reader = bearer(tenant.token(roles=[Role.READ.value]))
    assert (await list_orders(harness, reader)).status_code == 200
    assert_problem(await cancel(harness, reader), 403)
    assert (
        await cancel(harness, bearer(tenant.token(roles=[Role.OPERATE.value])))
    ).status_code == 202
    assert await cancel_detail(harness) == "by tess@contoso.test"


@pytest.mark.parametrize(
    ("make", "words"),
    [
        (lambda t: t.token(roles=["Orders.Read"], audience="api://another-app"), "audience"),
        (lambda t: t.token(roles=["Orders.Read"], issuer="https://elsewhere/v2.0"), "issuer"),
        (lambda t: t.token(roles=["Orders.Read"], expires_in=-3600), "expired"),
        (
            lambda t: t.token(
                roles=["Orders.Read"],
                key=rsa.generate_private_key(public_exponent=65537, key_size=2048),
            ),
            "not valid",
        ),
        (lambda t: "not.a.token", "cannot be checked"),
    ],
)
async def test_a_token_that_does_not_hold_is_a_401(
    tenant_harness: tuple[Tenant, Harness], make: Any, words: str
) -> None:
    tenant, harness = tenant_harness
    answer = await list_orders(harness, bearer(make(tenant)))
    problem = assert_problem(answer, 401)
    assert words in problem["detail"], problem
    assert answer.headers.get("WWW-Authenticate") == "Bearer"


async def test_in_token_mode_the_principal_header_is_no_way_in(
    tenant_harness: tuple[Tenant, Harness],
) -> None:
    _, harness = tenant_harness
    assert_problem(await list_orders(harness, principal("rita", Role.OPERATE)), 401)
    assert_problem(await list_orders(harness, {"authorization": "Basic cml0YTpyaXRh"}), 401)


async def test_a_token_without_roles_is_a_403(tenant_harness: tuple[Tenant, Harness]) -> None:
    tenant, harness = tenant_harness
    assert_problem(await list_orders(harness, bearer(tenant.token())), 403)
