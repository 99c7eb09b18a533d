"""Where the CLI finds the API and the bus: flags, then environment, then local settings.

The settings file lookup follows the local runtime (``local.settings.json``, else the
committed sample) so that on a developer machine the CLI reaches the same broker as
``python -m devhost`` without any flag, while in Azure the app-setting names
(``ServiceBusConnection__fullyQualifiedNamespace``) work as environment variables.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

from shared.cli.errors import Usage
from shared.contract import Setting
from shared.domain.principal import Role

API_URL_ENV = "ORDERS_API_URL"
API_KEY_ENV = "ORDERS_API_KEY"
OPERATOR_ENV = "ORDERS_OPERATOR"
TOKEN_ENV = "ORDERS_API_TOKEN"
PRINCIPAL_ENV = "ORDERS_PRINCIPAL"
ROLES_ENV = "ORDERS_ROLES"
DEFAULT_PORT = 7071
SETTINGS_FILES = ("local.settings.json", "local.settings.sample.json")
NAMESPACE_SUFFIX = ".servicebus.windows.net"
_PROJECT_ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class ApiConfig:
    """``url`` is the function app's root (no ``/api``); ``key`` is never printed."""

    url: str
    key: str | None
    operator: str
    timeout: float
    signing_secret: str | None = field(default=None, repr=False)
    """EventSigningSecret from the same environment as the rest (never printed): what
    `orders send-event` signs with unless --secret is given."""
    token: str | None = field(default=None, repr=False)
    """An Entra access token for the app (OperatorAuth=token), sent as a bearer token."""
    principal: str | None = None
    """OperatorAuth=dev-header (the local runtime): the name to act as, sent as the
    X-MS-CLIENT-PRINCIPAL header with `roles`."""
    roles: tuple[str, ...] = ()

    @property
    def api(self) -> str:
        return f"{self.url}/api"


@dataclass(frozen=True)
class BusConfig:
    """Exactly one of a connection string (emulators, SAS) or a namespace (Entra ID)."""

    connection_string: str | None = None
    namespace: str | None = None
    client_id: str | None = None
    source: str = ""

    @property
    def host(self) -> str:
        """The endpoint host: safe to print, unlike the connection string."""
        if self.namespace:
            return self.namespace
        for part in (self.connection_string or "").split(";"):
            name, _, value = part.partition("=")
            if name.strip().lower() == "endpoint":
                return urlsplit(value.strip()).netloc or value.strip()
        return "?"

    @property
    def secrets(self) -> tuple[str, ...]:
        if not self.connection_string:
            return ()
        keys = [
            value
            for name, _, value in (p.partition("=") for p in self.connection_string.split(";"))
            if name.strip().lower() in {"sharedaccesskey", "sharedaccesssignature"} and value
        ]
        return (self.connection_string, *keys)


@dataclass(frozen=True)
class SettingsFile:
    path: Path | None
    values: Mapping[str, str]
    host: Mapping[str, object]


def find_settings(roots: Sequence[Path] | None = None) -> SettingsFile:
    """The first settings file in the working directory or the project root, read leniently.

    Only the string-valued ``Values`` matter here; anything unreadable raises Usage so the
    operator learns which file is broken rather than getting a default silently.
    """
    for root in roots if roots is not None else (Path.cwd(), _PROJECT_ROOT):
        for name in SETTINGS_FILES:
            path = root / name
            if path.is_file():
                return _read(path)
    return SettingsFile(None, {}, {})


def _read(path: Path) -> SettingsFile:
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise Usage(f"cannot read {path}: {exc}") from None
    if not isinstance(document, dict):
        raise Usage(f"{path}: expected a JSON object")
    raw_values = document.get("Values") or {}
    raw_host = document.get("Host") or {}
    values = (
        {str(k): str(v) for k, v in raw_values.items() if isinstance(v, str | int | float)}
        if isinstance(raw_values, dict)
        else {}
    )
    return SettingsFile(path, values, raw_host if isinstance(raw_host, dict) else {})


def normalise_url(raw: str) -> str:
    url = raw.strip().rstrip("/")
    url = url.removesuffix("/api")
    parts = urlsplit(url)
    if parts.scheme not in {"http", "https"} or not parts.netloc:
        raise Usage(f"--url must be an http(s) address like http://127.0.0.1:7071, got {raw!r}")
    return url


def _default_url(settings: SettingsFile | None) -> str:
    port: object = (settings.host if settings else {}).get("LocalHttpPort", DEFAULT_PORT)
    return f"http://127.0.0.1:{port if str(port).isdigit() else DEFAULT_PORT}"


@dataclass(frozen=True)
class Identity:
    """Who the CLI acts as besides a key (docs/cli.md#signing-in): a bearer token, or
    locally a principal with roles."""

    token: str | None = None
    principal: str | None = None
    roles: Sequence[str] = ()


def api_config(
    url: str | None,
    key: str | None,
    operator: str | None,
    timeout: float,
    env: Mapping[str, str] | None = None,
    settings: SettingsFile | None = None,
    identity: Identity | None = None,
) -> ApiConfig:
    values = os.environ if env is None else env
    chosen = url or values.get(API_URL_ENV) or _default_url(settings)
    given = identity or Identity()
    token = given.token or values.get(TOKEN_ENV) or None
    principal = given.principal or values.get(PRINCIPAL_ENV) or None
    if token and principal:
        raise Usage("act with --token or as --principal, not both")
    roles = tuple(given.roles) or tuple(
        r.strip() for r in values.get(ROLES_ENV, "").split(",") if r.strip()
    )
    return ApiConfig(
        url=normalise_url(chosen),
        key=key or values.get(API_KEY_ENV) or None,
        operator=(operator or values.get(OPERATOR_ENV) or _login(values))[:64],
        timeout=timeout,
        signing_secret=values.get(Setting.EVENT_SIGNING_SECRET) or None,
        token=token,
        principal=principal,
        roles=(roles or tuple(r.value for r in Role)) if principal else (),
    )


def _login(env: Mapping[str, str]) -> str:
    return env.get("USER") or env.get("USERNAME") or "operator"


def normalise_namespace(raw: str) -> str:
    host = raw.strip()
    if "://" in host:
        host = urlsplit(host).netloc
    host = host.strip("/")
    if not host:
        raise Usage("--namespace must name a Service Bus namespace")
    return host if "." in host else f"{host}{NAMESPACE_SUFFIX}"


def bus_config(
    connection: str | None,
    namespace: str | None,
    env: Mapping[str, str] | None = None,
    settings: SettingsFile | None = None,
) -> BusConfig:
    """Flags win, then the environment, then the settings file, each as a whole source.

    Taking a source as a whole matters: a namespace exported in the shell must beat the
    emulator connection string sitting in the sample settings file.
    """
    values = os.environ if env is None else env
    name = Setting.SERVICE_BUS
    sources: list[tuple[str, Mapping[str, str]]] = [
        ("--connection/--namespace", _flags(connection, namespace)),
        ("environment", values),
    ]
    if settings is None:
        settings = find_settings()
    if settings.path is not None:
        sources.append((str(settings.path), settings.values))
    for source, found in sources:
        if found.get(name):
            return BusConfig(connection_string=found[name], source=source)
        if found.get(f"{name}__fullyQualifiedNamespace"):
            return BusConfig(
                namespace=normalise_namespace(found[f"{name}__fullyQualifiedNamespace"]),
                client_id=found.get(f"{name}__clientId") or values.get(f"{name}__clientId") or None,
                source=source,
            )
    raise Usage(
        f"no Service Bus configured: pass --connection or --namespace, or set {name} "
        f"or {name}__fullyQualifiedNamespace"
    )


def _flags(connection: str | None, namespace: str | None) -> dict[str, str]:
    name = Setting.SERVICE_BUS
    if connection and namespace:
        raise Usage("give --connection or --namespace, not both")
    if connection:
        return {name: connection}
    if namespace:
        return {f"{name}__fullyQualifiedNamespace": namespace}
    return {}
