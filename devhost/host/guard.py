"""What the local front door refuses before a function runs.

In Azure the platform fronts the app: it routes by host name and checks function keys.
Locally the runtime listens on loopback, where any web page the developer opens can
reach it; so it answers only to loopback host names (no DNS rebinding), refuses
state-changing requests from another origin (no cross-site POST), and, when asked,
checks keys the way the Functions host does.
"""

from __future__ import annotations

import hmac
import ipaddress
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum

from devhost.settings import SettingsError
from shared.contract import DevhostSetting, Setting
from shared.domain.principal import PRINCIPAL_HEADER

LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "[::1]"})
UNSAFE_METHODS = frozenset({"POST", "PUT", "DELETE", "PATCH"})
KEY_HEADER = "x-functions-key"
KEY_QUERY = "code"


def host_name(host_header: str) -> str:
    """``localhost:7071`` -> ``localhost``; ``[::1]:7071`` -> ``[::1]``; lower case."""
    value = host_header.strip().lower()
    if value.startswith("["):
        end = value.find("]")
        return value[: end + 1] if end > 0 else value
    return value.split(":", 1)[0]


def allowed_host(host_header: str | None, also: frozenset[str] = frozenset()) -> bool:
    """A request without Host (HTTP/1.0) comes from no browser, so it may pass."""
    if host_header is None:
        return True
    name = host_name(host_header)
    port = host_header.strip()[len(name) :]
    if port and not (port.startswith(":") and port[1:].isdigit()):
        return False
    return name in LOOPBACK_NAMES or name in also


def foreign_origin(method: str, origin: str | None, own: str) -> bool:
    """A state-changing request whose Origin is present and not this runtime's."""
    if method.upper() not in UNSAFE_METHODS or origin is None:
        return False
    return origin.strip().lower() != own.lower()


class AuthLevel(Enum):
    ANONYMOUS = "anonymous"
    FUNCTION = "function"
    ADMIN = "admin"

    @classmethod
    def of(cls, binding_value: object) -> AuthLevel:
        """The binding says ``FUNCTION`` or ``function`` (or ``AuthLevel.FUNCTION``);
        the Functions host's default for an HTTP trigger is ``function``."""
        text = str(binding_value or "function").rsplit(".", 1)[-1].lower()
        return cls(text)


@dataclass(frozen=True)
class Keys:
    """The keys the runtime demands when ``DevhostEnforceKeys`` is ``true``.

    As in Azure: a function route takes the function key or the master key, an admin
    route only the master key, an anonymous route none; a missing or wrong key is
    ``401`` (the Functions host answers both with 401). The values never appear in a
    repr, a log line or an answer.
    """

    function_key: str = field(repr=False)
    master_key: str = field(repr=False)

    @classmethod
    def from_settings(cls, settings: Mapping[str, str]) -> Keys | None:
        if settings.get(DevhostSetting.ENFORCE_KEYS, "").strip().lower() != "true":
            return None
        function_key = settings.get(DevhostSetting.FUNCTION_KEY, "")
        master_key = settings.get(DevhostSetting.MASTER_KEY, "")
        if not function_key or not master_key:
            raise SettingsError(
                f"{DevhostSetting.ENFORCE_KEYS}=true needs {DevhostSetting.FUNCTION_KEY} "
                f"and {DevhostSetting.MASTER_KEY} set"
            )
        return cls(function_key, master_key)

    def admits(self, level: AuthLevel, presented: str | None) -> bool:
        if level is AuthLevel.ANONYMOUS:
            return True
        if not presented:
            return False
        if _same(presented, self.master_key):
            return True
        return level is AuthLevel.FUNCTION and _same(presented, self.function_key)


def _same(presented: str, key: str) -> bool:
    return hmac.compare_digest(presented.encode(), key.encode())


def passes_principal(settings: Mapping[str, str]) -> bool:
    """Whether the runtime hands functions the principal header at all: only with
    `OperatorAuth=dev-header`. Otherwise it is taken off every request, as the platform's
    authentication takes a client's copy off in Azure (docs/sign-in.md)."""
    return settings.get(Setting.OPERATOR_AUTH, "").strip().lower() == "dev-header"


def keeps_principal(passes: bool, peer: str | None) -> bool:
    """The header reaches the function only in dev-header mode and from a loopback
    client: a runtime bound to another interface must not take anyone's word for who
    they are."""
    if not passes or not peer:
        return False
    try:
        return ipaddress.ip_address(peer.split("%", 1)[0]).is_loopback
    except ValueError:
        return False


def without_principal(headers: Mapping[str, str]) -> dict[str, str]:
    return {k: v for k, v in headers.items() if k.lower() != PRINCIPAL_HEADER}
