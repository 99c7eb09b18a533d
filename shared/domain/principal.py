"""Who acts on an operator route: a signed-in principal with an app role, or the master
key (docs/contract.md#15-who-acts, docs/sign-in.md).

Pure: the principal's header is parsed here, a token's claims are read here, and the
rule of who may do what is here; reading the setting, checking a token's signature and
answering HTTP are the adapters' and the functions' part.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Any, Final

PRINCIPAL_HEADER: Final = "x-ms-client-principal"
"""How App Service authentication hands the app the signed-in user (case-insensitive)."""
ROLES_CLAIM: Final = "roles"
"""Entra puts a principal's app roles in claims of this type, in a token and in the
header alike."""
MASTER_KEY_ACTOR: Final = "master-key"
"""What an action taken with the master key (break-glass) records as who acted."""
MAX_NAME: Final = 64
"""A recorded name or note is cut to this, as the typed name always was."""
MAX_HEADER_CHARS: Final = 16 * 1024


class Role(Enum):
    """The two app roles of the app registration."""

    READ = "Orders.Read"
    """Every operator read: orders, the page and its data, failures, agents, bulk jobs."""
    OPERATE = "Orders.Operate"
    """Every action: cancel, suspend, resume, resubmit, drain, bulk, reconcile, migrate,
    archive, an approval's answer."""


class OperatorAuth(Enum):
    """The setting `OperatorAuth`: where the app takes a principal from."""

    KEYS = ""
    """Unset: keys as the host checks them; the principal header is ignored."""
    PLATFORM = "platform"
    """The platform's authentication is on and strips the header from clients."""
    DEV_HEADER = "dev-header"
    """The local runtime and tests: the header as a loopback client sends it."""
    TOKEN = "token"
    """An Entra bearer token, validated in the app (no platform authentication)."""

    @classmethod
    def parse(cls, raw: str) -> OperatorAuth:
        value = raw.strip().lower()
        for mode in cls:
            if mode.value == value:
                return mode
        allowed = ", ".join(m.value for m in cls if m.value)
        raise ValueError(f"OperatorAuth must be unset or one of {allowed}, not {raw!r}")

    @property
    def signed_in(self) -> bool:
        return self is not OperatorAuth.KEYS


@dataclass(frozen=True)
class TokenPolicy:
    """What a bearer token must be in token mode: from this issuer, for one of these
    audiences (the app registration as a v2 token names it, its client id, and as a v1
    token does, its application id URI), signed with a key of this JWKS."""

    issuer: str
    audiences: tuple[str, ...]
    jwks_url: str


class NotSignedIn(Exception):
    """No principal could be read: the answer is 401, with the reason in words."""


@dataclass(frozen=True)
class Principal:
    name: str
    roles: frozenset[str]

    def may(self, role: Role) -> bool:
        """Each role stands alone, as the contract has it: an operator who also reads the
        page is given both roles."""
        return role.value in self.roles


@dataclass(frozen=True)
class Actor:
    """Who acted, as an action records it: the principal's name (or `master-key`), and
    the name a person typed (`x-operator`) only as a note beside it."""

    name: str
    note: str | None = None

    @property
    def recorded(self) -> str:
        """The history's `by`: `alice@contoso.com`, or `alice@contoso.com (note: Ann)`."""
        return f"{self.name} (note: {self.note})" if self.note else self.name

    @classmethod
    def of(cls, name: str, typed: str | None) -> Actor:
        note = (typed or "").strip()[:MAX_NAME] or None
        return cls(name[:MAX_NAME], note if note != name[:MAX_NAME] else None)


def parse_client_principal(header: str) -> Principal:
    """The principal App Service authentication passes as `X-MS-CLIENT-PRINCIPAL`:
    base64 of `{"auth_typ", "name_typ", "role_typ", "claims": [{"typ", "val"}]}`.

    Anything else raises NotSignedIn saying what was wrong, never another exception.
    """
    raw = header.strip()
    if not raw:
        raise NotSignedIn("the X-MS-CLIENT-PRINCIPAL header is empty")
    if len(raw) > MAX_HEADER_CHARS:
        raise NotSignedIn(f"the X-MS-CLIENT-PRINCIPAL header is over {MAX_HEADER_CHARS} characters")
    try:
        decoded = base64.b64decode(raw + "=" * (-len(raw) % 4), validate=True)
    except (binascii.Error, ValueError):
        raise NotSignedIn("the X-MS-CLIENT-PRINCIPAL header is not base64") from None
    try:
        document = json.loads(decoded.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise NotSignedIn("the X-MS-CLIENT-PRINCIPAL header is not base64 of JSON") from None
    if not isinstance(document, dict) or not isinstance(document.get("claims"), list):
        raise NotSignedIn('the X-MS-CLIENT-PRINCIPAL header is not {"claims": [...], ...}')
    pairs: list[tuple[str, str]] = []
    for claim in document["claims"]:
        if not isinstance(claim, dict):
            raise NotSignedIn("a claim of X-MS-CLIENT-PRINCIPAL is not an object")
        typ, val = claim.get("typ"), claim.get("val")
        if not isinstance(typ, str) or not isinstance(val, str):
            raise NotSignedIn('a claim of X-MS-CLIENT-PRINCIPAL is not {"typ": str, "val": str}')
        pairs.append((typ, val))
    name_typ = document.get("name_typ")
    role_typ = document.get("role_typ")
    names = [v for t, v in pairs if isinstance(name_typ, str) and t == name_typ]
    name = next((n for n in names if n.strip()), None) or _first(pairs, _NAME_CLAIMS)
    if name is None:
        raise NotSignedIn("the X-MS-CLIENT-PRINCIPAL header names no one (no name claim)")
    roles = frozenset(v for t, v in pairs if t == ROLES_CLAIM or (role_typ and t == role_typ))
    return Principal(name.strip(), roles)


_NAME_CLAIMS: Final = (
    "preferred_username",
    "name",
    "upn",
    "http://schemas.xmlsoap.org/ws/2005/05/identity/claims/name",
    "oid",
    "http://schemas.microsoft.com/identity/claims/objectidentifier",
    "azp",
    "appid",
    "sub",
)
"""Where a name is found when `name_typ` finds none: a person's sign-in name first, an
application's id last (a daemon's token has no user name)."""


def _first(pairs: Iterable[tuple[str, str]], types: Iterable[str]) -> str | None:
    found = dict(reversed(list(pairs)))
    for typ in types:
        value = found.get(typ, "").strip()
        if value:
            return value
    return None


def principal_from_claims(claims: Mapping[str, Any]) -> Principal:
    """A validated token's claims as a principal: `roles` a list of strings."""
    pairs = [(k, v) for k, v in claims.items() if isinstance(v, str)]
    name = _first(pairs, _NAME_CLAIMS)
    if name is None:
        raise NotSignedIn("the token names no one (no name, oid or sub claim)")
    raw_roles = claims.get(ROLES_CLAIM, [])
    roles = [raw_roles] if isinstance(raw_roles, str) else raw_roles
    if not isinstance(roles, list):
        raise NotSignedIn("the token's roles claim is not a list")
    return Principal(name, frozenset(r for r in roles if isinstance(r, str)))


def encode_client_principal(name: str, roles: Iterable[str]) -> str:
    """The header as App Service writes it: what the local runtime's clients and the
    CLI send in dev-header mode."""
    claims = [{"typ": "name", "val": name}, *({"typ": ROLES_CLAIM, "val": r} for r in roles)]
    document = {"auth_typ": "aad", "name_typ": "name", "role_typ": ROLES_CLAIM, "claims": claims}
    return base64.b64encode(json.dumps(document).encode("utf-8")).decode("ascii")
