"""App settings, read when first needed (never at import, which would break indexing)."""

from __future__ import annotations

import math
import os
import socket
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import timedelta

from shared.contract import AgentLimitSetting, ChaosSetting, Setting
from shared.domain.archive import DEFAULT_RETENTION, RetentionPolicy
from shared.domain.fairness import CustomerPolicy
from shared.domain.limits import AgentLimits
from shared.domain.machine.transition import ProcessPolicy
from shared.domain.model import ExhaustedPolicy, ProcessState
from shared.domain.principal import OperatorAuth, TokenPolicy
from shared.domain.workflow import AgentName, Catalogue

# Azurite's published development account: a well-known constant, not a secret.
_AZURITE_KEY = (
    "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
)
DEVELOPMENT_STORAGE = "UseDevelopmentStorage=true"


class ConfigurationError(ValueError):
    """A setting is missing or malformed; the message names it."""


def azurite_connection_string(
    table_port: int = 10002, host: str = "127.0.0.1", blob_port: int | None = None
) -> str:
    """Azurite's account; with `blob_port`, its blob service too (the order archive)."""
    blob = f"BlobEndpoint=http://{host}:{blob_port}/devstoreaccount1;" if blob_port else ""
    return (
        "DefaultEndpointsProtocol=http;AccountName=devstoreaccount1;"
        f"AccountKey={_AZURITE_KEY};TableEndpoint=http://{host}:{table_port}/devstoreaccount1;"
        + blob
    )


@dataclass(frozen=True)
class Connection:
    """Either a connection string (emulators) or an endpoint used with managed identity."""

    connection_string: str | None = None
    endpoint: str | None = None
    client_id: str | None = None


@dataclass(frozen=True)
class Settings:
    catalogue: Catalogue = field(repr=False, kw_only=True)
    """The agents and workflows this instance runs, which these settings were read
    against (each agent's service URL and limits are named in it)."""
    storage: Connection
    service_bus: Connection
    state_table: str
    step_timeout: timedelta
    high_priority_step_timeout: timedelta
    pending_timeout: timedelta
    max_failure_count: int
    exhausted_policy: ExhaustedPolicy
    reply_to_allow_list: frozenset[str]
    service_urls: Mapping[AgentName, str]
    instance_id: str
    chaos_fault_rate: float = 0.0
    """Test-only (chaos runs): the chance that a state-store or bus call crashes."""
    bulk_actions_per_second: float = 50.0
    """How fast a bulk job acts on orders, so a fleet-wide action does not crowd out
    the orders' own traffic."""
    event_signing_secret: str | None = field(default=None, repr=False)
    """EventSigningSecret: events must carry its HMAC; None: function keys alone."""
    trace_query_url: str | None = None
    """The local trace query the operator page links an order to; None in Azure."""
    reconcile_sample_size: int = 50
    """Finished orders one reconciliation run checks at most (1 to 1000)."""
    step_heartbeat: timedelta = timedelta(seconds=10)
    step_max: timedelta | None = None
    """None (StepMaxSeconds 0, the default): no step runs past its complete-by. Off by
    default because a beat cannot tell a slow call from a hung one: with beats on, a
    hung remote call holds its step until StepMaxSeconds instead of its complete-by."""
    max_pending_per_customer: int | None = None
    """IntakeMaxPendingPerCustomer; None (0, the default): no limit."""
    fair_share: int | None = None
    """FairShareRunningPerCustomer; None (0, the default): every order is nudged as it
    arrives, in arrival order."""
    agent_limits: Mapping[AgentName, AgentLimits] = field(default_factory=dict)
    """Each agent's fleet-wide limits: the catalogue's, overridden by AgentLimits__*."""
    retention: RetentionPolicy = field(default_factory=RetentionPolicy)
    """Retention{Processed,Cancelled,Compensated}Days: how long a final order stays in
    the state table before the archiver moves it to the archive; None: forever."""
    archive_storage: Connection | None = None
    """The blob service of the archive (the same account as the table); None where the
    connection string names a table endpoint alone: the archiver does nothing there."""
    clock_skew: timedelta = timedelta(seconds=5)
    """ClockSkewSeconds: a request is live until its complete-by plus this (the policy's
    clock_skew); no undo or move of its step is sent before then unless its key settles."""
    operator_auth: OperatorAuth = OperatorAuth.KEYS
    """OperatorAuth: where operator routes take a signed-in principal from (unset: keys
    only, the principal header ignored)."""
    token_policy: TokenPolicy | None = None
    """Token mode's issuer, audience and JWKS; None in every other mode."""

    @property
    def policy(self) -> ProcessPolicy:
        return ProcessPolicy(
            step_timeout=self.step_timeout,
            high_priority_step_timeout=self.high_priority_step_timeout,
            pending_timeout=self.pending_timeout,
            max_failure_count=self.max_failure_count,
            exhausted_policy=self.exhausted_policy,
            step_heartbeat=self.step_heartbeat,
            step_max=self.step_max,
            clock_skew=self.clock_skew,
        )

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, *, catalogue: Catalogue) -> Settings:
        """`catalogue` names each agent's settings (its service URL, its limits)."""
        values = os.environ if env is None else env
        step_timeout = _number(values, Setting.STEP_TIMEOUT_SECONDS, 30)
        return cls(
            catalogue=catalogue,
            storage=_storage(values),
            service_bus=_service_bus(values),
            state_table=values.get(Setting.STATE_TABLE, "Orders"),
            step_timeout=timedelta(seconds=step_timeout),
            high_priority_step_timeout=timedelta(
                seconds=_number(
                    values, Setting.HIGH_PRIORITY_STEP_TIMEOUT_SECONDS, default=step_timeout / 2
                )
            ),
            pending_timeout=timedelta(seconds=_number(values, Setting.PENDING_TIMEOUT_SECONDS, 60)),
            max_failure_count=int(_number(values, Setting.MAX_FAILURE_COUNT, 3, minimum=1)),
            exhausted_policy=_policy(values),
            reply_to_allow_list=frozenset(
                q.strip()
                for q in values.get(Setting.REPLY_TO_ALLOW_LIST, "").split(",")
                if q.strip()
            ),
            service_urls={
                name: values.get(
                    spec.service_url_setting,
                    spec.local_service_url or f"http://127.0.0.1:7072/{name}",
                )
                for name, spec in catalogue.agents.items()
            },
            instance_id=values.get(Setting.INSTANCE_ID)
            or f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}",
            chaos_fault_rate=_number(values, ChaosSetting.FAULT_RATE, 0, minimum=0),
            bulk_actions_per_second=_number(values, Setting.BULK_ACTIONS_PER_SECOND, 50),
            trace_query_url=values.get(Setting.TRACE_QUERY_URL, "").strip() or None,
            event_signing_secret=values.get(Setting.EVENT_SIGNING_SECRET, "").strip() or None,
            reconcile_sample_size=int(
                min(_number(values, Setting.RECONCILE_SAMPLE_SIZE, 50, minimum=1), 1000)
            ),
            step_heartbeat=timedelta(seconds=_number(values, Setting.STEP_HEARTBEAT_SECONDS, 10)),
            step_max=_step_max(values),
            clock_skew=timedelta(seconds=_number(values, Setting.CLOCK_SKEW_SECONDS, 5, minimum=0)),
            max_pending_per_customer=_count_or_none(
                values, Setting.INTAKE_MAX_PENDING_PER_CUSTOMER
            ),
            fair_share=_count_or_none(values, Setting.FAIR_SHARE_RUNNING_PER_CUSTOMER),
            agent_limits=_agent_limits(values, catalogue),
            retention=RetentionPolicy(
                processed=_retention(
                    values, Setting.RETENTION_PROCESSED_DAYS, ProcessState.PROCESSED
                ),
                cancelled=_retention(
                    values, Setting.RETENTION_CANCELLED_DAYS, ProcessState.CANCELLED
                ),
                compensated=_retention(
                    values, Setting.RETENTION_COMPENSATED_DAYS, ProcessState.COMPENSATED
                ),
            ),
            archive_storage=_archive_storage(values),
            operator_auth=_operator_auth(values),
            token_policy=_token_policy(values),
        )

    @property
    def customer_policy(self) -> CustomerPolicy:
        return CustomerPolicy(max_pending=self.max_pending_per_customer, fair_share=self.fair_share)


def _operator_auth(values: Mapping[str, str]) -> OperatorAuth:
    try:
        mode = OperatorAuth.parse(values.get(Setting.OPERATOR_AUTH, ""))
    except ValueError as exc:
        raise ConfigurationError(str(exc)) from None
    if mode is OperatorAuth.DEV_HEADER and values.get(Setting.SITE_NAME, "").strip():
        raise ConfigurationError(
            f"{Setting.OPERATOR_AUTH}=dev-header is for the local runtime only: in Azure "
            "anyone could send the header; use platform or token"
        )
    return mode


def _token_policy(values: Mapping[str, str]) -> TokenPolicy | None:
    if _operator_auth(values) is not OperatorAuth.TOKEN:
        return None
    names = (Setting.OPERATOR_AUTH_ISSUER, Setting.OPERATOR_AUTH_AUDIENCE)
    needed = (*names, Setting.OPERATOR_AUTH_JWKS_URL)
    issuer, audience, jwks = (values.get(n, "").strip() for n in needed)
    missing = [n for n, v in zip(needed, (issuer, audience, jwks), strict=True) if not v]
    if missing:
        raise ConfigurationError(f"{Setting.OPERATOR_AUTH}=token needs {', '.join(missing)}")
    if not jwks.startswith(("https://", "http://127.0.0.1", "http://localhost")):
        raise ConfigurationError(f"{Setting.OPERATOR_AUTH_JWKS_URL} must be an https URL")
    audiences = tuple(a.strip() for a in audience.split(",") if a.strip())
    return TokenPolicy(issuer=issuer, audiences=audiences, jwks_url=jwks)


def _count_or_none(values: Mapping[str, str], name: str) -> int | None:
    """A whole number of orders, 0 (the default) meaning the rule is off."""
    number = _number(values, name, 0, minimum=0)
    if number != int(number):
        raise ConfigurationError(f"setting {name} must be a whole number, got {values[name]!r}")
    return int(number) or None


def _number(values: Mapping[str, str], name: str, default: float, minimum: float = 0.001) -> float:
    raw = values.get(name)
    if raw is None or raw == "":
        return default
    try:
        number = float(raw)
    except ValueError:
        raise ConfigurationError(f"setting {name} must be a number, got {raw!r}") from None
    if not math.isfinite(number):
        raise ConfigurationError(f"setting {name} must be a finite number, got {raw!r}")
    if number < minimum:
        raise ConfigurationError(f"setting {name} must be at least {minimum}, got {raw!r}")
    return number


def _agent_limits(values: Mapping[str, str], catalogue: Catalogue) -> dict[AgentName, AgentLimits]:
    """The catalogue's limits, each overridden by its app setting when set (0 lifts it)."""
    limits = {}
    for name, spec in catalogue.agents.items():
        declared = spec.limits
        concurrent = _override(
            values, AgentLimitSetting.MAX_CONCURRENT.format(agent=name), declared.max_concurrent
        )
        rate = _override(
            values, AgentLimitSetting.CALLS_PER_SECOND.format(agent=name), declared.calls_per_second
        )
        if concurrent is not None and concurrent != int(concurrent):
            raise ConfigurationError(
                f"setting {AgentLimitSetting.MAX_CONCURRENT.format(agent=name)} must be a whole "
                f"number, got {concurrent}"
            )
        limits[name] = AgentLimits(None if concurrent is None else int(concurrent), rate)
    return limits


def _override(values: Mapping[str, str], name: str, declared: float | None) -> float | None:
    if not values.get(name, "").strip():
        return declared
    number = _number(values, name, 0, minimum=0)
    return number or None


def _retention(values: Mapping[str, str], name: str, state: ProcessState) -> timedelta | None:
    """Days, fractions allowed (a test's retention of seconds); absent or empty: the
    default; 0: kept forever, never archived."""
    default = DEFAULT_RETENTION[state]
    days = _number(values, name, default.days if default else 0, minimum=0)
    return timedelta(days=days) if days else None


def _archive_storage(values: Mapping[str, str]) -> Connection | None:
    """The account's blob service: from the connection string (locally: Azurite, with
    its blob endpoint), or `__blobServiceUri`, or the account name, with the same identity
    as the tables."""
    name = Setting.STORAGE
    raw = (values.get(name) or "").strip()
    if raw:
        if raw == DEVELOPMENT_STORAGE:
            return Connection(azurite_connection_string(blob_port=10000))
        parts = {p.split("=", 1)[0].strip().lower() for p in raw.split(";") if "=" in p}
        if "tableendpoint" in parts and "blobendpoint" not in parts:
            return None
        return Connection(raw)
    endpoint = values.get(f"{name}__blobServiceUri")
    account = values.get(f"{name}__accountName")
    if not endpoint and account:
        endpoint = f"https://{account}.blob.core.windows.net"
    if not endpoint:
        return None
    return Connection(endpoint=endpoint, client_id=values.get(f"{name}__clientId"))


def _step_max(values: Mapping[str, str]) -> timedelta | None:
    seconds = _number(values, Setting.STEP_MAX_SECONDS, 0, minimum=0)
    return timedelta(seconds=seconds) if seconds else None


def _policy(values: Mapping[str, str]) -> ExhaustedPolicy:
    raw = values.get(Setting.EXHAUSTED_POLICY, ExhaustedPolicy.HOLD.value)
    try:
        return ExhaustedPolicy(raw.strip().lower())
    except ValueError:
        raise ConfigurationError(
            f"setting {Setting.EXHAUSTED_POLICY} must be 'hold' or 'compensate', got {raw!r}"
        ) from None


def _storage(values: Mapping[str, str]) -> Connection:
    name = Setting.STORAGE
    raw = values.get(name)
    if raw:
        return Connection(
            azurite_connection_string(blob_port=10000)
            if raw.strip() == DEVELOPMENT_STORAGE
            else raw
        )
    endpoint = values.get(f"{name}__tableServiceUri")
    account = values.get(f"{name}__accountName")
    if not endpoint and account:
        endpoint = f"https://{account}.table.core.windows.net"
    if not endpoint:
        raise ConfigurationError(
            f"set {name} (a connection string) or {name}__tableServiceUri / {name}__accountName"
        )
    return Connection(endpoint=endpoint, client_id=values.get(f"{name}__clientId"))


def _service_bus(values: Mapping[str, str]) -> Connection:
    name = Setting.SERVICE_BUS
    raw = values.get(name)
    if raw:
        return Connection(raw)
    namespace = values.get(f"{name}__fullyQualifiedNamespace")
    if not namespace:
        raise ConfigurationError(
            f"set {name} (a connection string) or {name}__fullyQualifiedNamespace"
        )
    return Connection(endpoint=namespace, client_id=values.get(f"{name}__clientId"))
