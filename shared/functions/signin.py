"""Who may call an operator route, and who it records as acting (docs/contract.md#15-who-acts).

Every operator route starts with `gate.admit(req, Role.X)` (the Gate its handler
holds): an Actor to record, or the 401 or 403 to answer. The mode is the setting
`OperatorAuth` (docs/sign-in.md):

* unset: the host has checked the master key (the routes are `admin`); the actor is
  the typed name (`x-operator`) as before, and the principal header is ignored;
* `platform` and `dev-header`: the `X-MS-CLIENT-PRINCIPAL` header (the local runtime
  passes it from loopback clients only, and the platform strips it from clients);
* `token`: an Entra bearer token, validated here.

In a signed-in mode the routes are `anonymous` to the host, so the master key
(break-glass) is checked here, by asking the host (shared/adapters/host_keys.py).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import azure.functions as func

from shared.adapters import host_keys
from shared.adapters.entra_token import tokens_for
from shared.contract import Setting
from shared.domain.principal import (
    MASTER_KEY_ACTOR,
    PRINCIPAL_HEADER,
    Actor,
    NotSignedIn,
    OperatorAuth,
    Principal,
    Role,
    TokenPolicy,
    parse_client_principal,
)
from shared.functions.http import base_url, problem

TYPED_NAME_HEADER = "x-operator"


def route_level() -> func.AuthLevel:
    """The host's auth level of an operator route, decided when the functions are
    indexed: `admin` with keys only; `anonymous` when a principal may come without a key
    (the app then checks it, and the master key, itself). A malformed value is left to
    the first invocation to name (shared/settings.py)."""
    try:
        mode = OperatorAuth.parse(os.environ.get(Setting.OPERATOR_AUTH, ""))
    except ValueError:
        return func.AuthLevel.ADMIN
    return func.AuthLevel.ANONYMOUS if mode.signed_in else func.AuthLevel.ADMIN


@dataclass(frozen=True)
class Gate:
    """The setting `OperatorAuth` and, in token mode, the token's issuer and audience."""

    mode: OperatorAuth
    token_policy: TokenPolicy | None = None

    async def admit(self, req: func.HttpRequest, role: Role) -> Actor | func.HttpResponse:
        mode = self.mode
        typed = req.headers.get(TYPED_NAME_HEADER)
        if not mode.signed_in:
            return Actor.of(typed or "operator", None)
        try:
            principal = await _principal(req, mode, self.token_policy)
        except NotSignedIn as exc:
            return _unauthorized(mode, str(exc))
        if principal is None:
            key = req.headers.get(host_keys.KEY_HEADER) or req.params.get("code")
            if key and await host_keys.is_master_key(base_url(req), key):
                return Actor.of(MASTER_KEY_ACTOR, typed)
            how = "a bearer token" if mode is OperatorAuth.TOKEN else "a signed-in principal"
            return _unauthorized(mode, f"this route needs {how} with the role {role.value}")
        if not principal.may(role):
            held = ", ".join(sorted(principal.roles)) or "no app role"
            return problem(
                403,
                "Forbidden",
                f"{principal.name} holds {held}; this route needs the role {role.value}",
                code="missing-role",
            )
        return Actor.of(principal.name, typed)


async def _principal(
    req: func.HttpRequest, mode: OperatorAuth, token_policy: TokenPolicy | None
) -> Principal | None:
    if mode is OperatorAuth.TOKEN:
        authorization = (req.headers.get("authorization") or "").strip()
        if not authorization:
            return None
        scheme, _, token = authorization.partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise NotSignedIn("the Authorization header is not 'Bearer <token>'")
        assert token_policy is not None
        return await tokens_for(token_policy).principal(token.strip())
    header = req.headers.get(PRINCIPAL_HEADER)
    return None if header is None else parse_client_principal(header)


def _unauthorized(mode: OperatorAuth, detail: str) -> func.HttpResponse:
    headers = {"WWW-Authenticate": "Bearer"} if mode is OperatorAuth.TOKEN else None
    return problem(401, "Unauthorized", detail, headers, code="not-signed-in")
