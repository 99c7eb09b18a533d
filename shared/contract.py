"""Contract names, declared once.

Everything a client, the infra or an acceptance check relies on (queue names, queue
properties, setting names, routes) lives here and is imported everywhere else,
including the tests and the consistency checks against Bicep and emulator config.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import Final


class Queue:
    """Service Bus queue names (docs/contract.md#1-queues)."""

    ORDERS: Final = "orders"
    SCHEDULER: Final = "scheduler"
    AGENT_REPLIES: Final = "agent-replies"
    SCHEDULER_HIGH: Final = "scheduler-high"
    AGENT_REPLIES_HIGH: Final = "agent-replies-high"
    """The Scheduler's lanes for high-priority orders: their claims and replies do not
    wait behind a normal backlog either."""
    ORDER_STATUS: Final = "order-status"
    OPERATOR_ALERTS: Final = "operator-alerts"


HIGH_PRIORITY_SUFFIX: Final = "-high"
"""Each agent queue has a high-priority lane, `<queue>-high`, served by its own trigger."""


def high_priority(queue: str) -> str:
    return f"{queue}{HIGH_PRIORITY_SUFFIX}"


def agent_queue(agent: str, high: bool = False) -> str:
    """Where an agent listens: `agent-{name}`, and `agent-{name}-high` for its fast lane."""
    queue = f"agent-{agent}"
    return high_priority(queue) if high else queue


CORE_QUEUES: Final[tuple[str, ...]] = (
    Queue.ORDERS,
    Queue.SCHEDULER,
    Queue.AGENT_REPLIES,
    Queue.ORDER_STATUS,
    Queue.OPERATOR_ALERTS,
    Queue.SCHEDULER_HIGH,
    Queue.AGENT_REPLIES_HIGH,
)
"""The queues every catalogue needs; each agent adds its two lanes (the whole set, and
each agent's service URL setting, are shared.catalogue.derive's, from a given catalogue)."""


class PoisonProperty:
    """Application properties of a dead-lettered poison message (see the Service Bus
    adapter's `park`): why it was rejected, and which message it is a copy of."""

    COPY_OF: Final = "poisonCopyOf"
    REASON: Final = "poisonReason"
    DETAIL: Final = "poisonDetail"
    ORIGINAL_DELIVERY_COUNT: Final = "originalDeliveryCount"
    TRUNCATED_FROM: Final = "poisonTruncatedFrom"
    """Set when the body was cut to fit: the original size in bytes."""


@dataclass(frozen=True)
class QueueProperties:
    """What the code assumes of every queue; the infra and emulator config must agree."""

    lock_duration_seconds: int = 60
    max_delivery_count: int = 10
    duplicate_detection_window_seconds: int = 600
    dead_lettering_on_message_expiration: bool = True
    requires_duplicate_detection: bool = True


QUEUE_PROPERTIES: Final = QueueProperties()

NOTIFICATION_QUEUES: Final[tuple[str, ...]] = (Queue.ORDER_STATUS, Queue.OPERATOR_ALERTS)
"""The queues the app only writes: their readers are outside it (the submitting
application, operators; docs/operations.md#who-reads-the-notification-queues). A reader
that is late or absent must not fill them, so in Azure their messages live for a set
time (a deployment parameter) and then expire."""

NOTIFICATION_QUEUE_PROPERTIES: Final = replace(
    QUEUE_PROPERTIES, dead_lettering_on_message_expiration=False
)
"""A notification nobody read is dropped when it expires, not dead-lettered: its order's
state is in the state table (and an alert has already fired), while a dead-letter
queue would keep every unread one against the queue's size cap and raise a dead-letter
alert for each."""


def queue_properties(queue: str) -> QueueProperties:
    """What the code assumes of ``queue``: the notification queues' own, else the common."""
    return NOTIFICATION_QUEUE_PROPERTIES if queue in NOTIFICATION_QUEUES else QUEUE_PROPERTIES


ARCHIVE_CONTAINER: Final = "order-archive"
"""The blob container of archived orders (docs/operations.md#retention-and-archive); the
Bicep creates it in the app's storage account."""


class Setting:
    """App setting names read by the code (docs/contract.md#6-settings)."""

    STORAGE: Final = "AzureWebJobsStorage"
    SERVICE_BUS: Final = "ServiceBusConnection"
    STATE_TABLE: Final = "StateTableName"
    SUPERVISOR_SCHEDULE: Final = "SupervisorSchedule"
    RECONCILE_SCHEDULE: Final = "ReconcileSchedule"
    """NCRONTAB of the reconciliation timer (finished and held orders against the services' keys)."""
    RECONCILE_SAMPLE_SIZE: Final = "ReconcileSampleSize"
    """Orders (finished, or held in Error or Suspended) one reconciliation run checks at most."""
    ARCHIVE_SCHEDULE: Final = "ArchiveSchedule"
    """NCRONTAB of the archive timer (finished orders past their retention to blobs)."""
    AGENT_HEARTBEAT_SCHEDULE: Final = "AgentHeartbeatSchedule"
    """NCRONTAB of the agents' heartbeat timer (each agent's health, probes of tripped
    breakers); keep it well inside routing's 60 s staleness limit."""
    BULK_ACTIONS_SCHEDULE: Final = "BulkActionsSchedule"
    """NCRONTAB of the timer that works bulk jobs: how soon a job starts after its 202."""
    RETENTION_PROCESSED_DAYS: Final = "RetentionProcessedDays"
    """Days a Processed order stays in the state table before it is archived; 0: forever."""
    RETENTION_CANCELLED_DAYS: Final = "RetentionCancelledDays"
    RETENTION_COMPENSATED_DAYS: Final = "RetentionCompensatedDays"
    STEP_TIMEOUT_SECONDS: Final = "StepTimeoutSeconds"
    HIGH_PRIORITY_STEP_TIMEOUT_SECONDS: Final = "HighPriorityStepTimeoutSeconds"
    PENDING_TIMEOUT_SECONDS: Final = "PendingTimeoutSeconds"
    STEP_HEARTBEAT_SECONDS: Final = "StepHeartbeatSeconds"
    """How far one step heartbeat of a long call moves its step's complete-by."""
    STEP_MAX_SECONDS: Final = "StepMaxSeconds"
    """How long from its dispatch heartbeats may keep a step running; 0: heartbeats off."""
    CLOCK_SKEW_SECONDS: Final = "ClockSkewSeconds"
    """How long after its complete-by a request may still apply at its provider (network
    delay plus clock disagreement): a step's request is live until then (docs/in-doubt.md)."""
    INTAKE_MAX_PENDING_PER_CUSTOMER: Final = "IntakeMaxPendingPerCustomer"
    """Orders not at rest one customer may have; past it the intake answers 429 (0: no
    limit)."""
    FAIR_SHARE_RUNNING_PER_CUSTOMER: Final = "FairShareRunningPerCustomer"
    """Orders of one customer running at once while more of its orders wait in its line
    (0: off), so one customer's backlog cannot hold back another's (docs/fairness.md)."""
    MAX_FAILURE_COUNT: Final = "MaxFailureCount"
    EXHAUSTED_POLICY: Final = "ExhaustedPolicy"
    REPLY_TO_ALLOW_LIST: Final = "ReplyToAllowList"
    CATALOGUE_FILE: Final = "CatalogueFile"
    """The catalogue the app runs (default: catalogue.json beside function_app.py). Each
    agent's service URL setting is named in the catalogue (`serviceUrlSetting`)."""
    INSTANCE_ID: Final = "WEBSITE_INSTANCE_ID"
    EVENT_SIGNING_SECRET: Final = "EventSigningSecret"
    """When set, events must be signed with it (HMAC-SHA256); a Key Vault reference in Azure."""
    BULK_ACTIONS_PER_SECOND: Final = "BulkActionsPerSecond"
    """The pace of a bulk job's actions, per instance running the bulk timer."""
    OPERATOR_AUTH: Final = "OperatorAuth"
    """Where operator routes take a signed-in principal from: unset (keys only),
    `platform`, `dev-header` or `token` (docs/sign-in.md)."""
    OPERATOR_AUTH_ISSUER: Final = "OperatorAuthIssuer"
    OPERATOR_AUTH_AUDIENCE: Final = "OperatorAuthAudience"
    OPERATOR_AUTH_JWKS_URL: Final = "OperatorAuthJwksUrl"
    """Token mode: the issuer and audience a bearer token must name, and the tenant's
    published keys its signature is checked against."""
    SITE_NAME: Final = "WEBSITE_SITE_NAME"
    """Set by the platform in Azure: dev-header mode refuses to start where it is set."""
    TRACE_QUERY_URL: Final = "TraceQueryUrl"
    """Local only, never deployed: where the operator page reads an order's trace
    (`python -m devhost` points it at its OTLP receiver). Unset in Azure, where traces
    are in Application Insights."""


class AgentLimitSetting:
    """Optional overrides of a catalogue agent's limits, one pair per agent (`{agent}` is
    its name); unset: the catalogue's value, 0: no limit (docs/limits.md)."""

    MAX_CONCURRENT: Final = "AgentLimits__{agent}__maxConcurrent"
    CALLS_PER_SECOND: Final = "AgentLimits__{agent}__callsPerSecond"

    @staticmethod
    def names(agents: Iterable[str]) -> list[str]:
        return [
            pattern.format(agent=agent)
            for agent in agents
            for pattern in (AgentLimitSetting.MAX_CONCURRENT, AgentLimitSetting.CALLS_PER_SECOND)
        ]


class TelemetrySetting:
    """The standard telemetry variables the code reads (docs/contract.md#61-telemetry-settings),
    named as OpenTelemetry and Application Insights name them; the SDKs read the rest
    (`OTEL_TRACES_SAMPLER`, `OTEL_TRACES_SAMPLER_ARG`, `OTEL_METRIC_EXPORT_INTERVAL`)."""

    SDK_DISABLED: Final = "OTEL_SDK_DISABLED"
    SERVICE_NAME: Final = "OTEL_SERVICE_NAME"
    OTLP_ENDPOINT: Final = "OTEL_EXPORTER_OTLP_ENDPOINT"
    APPLICATIONINSIGHTS_CONNECTION_STRING: Final = "APPLICATIONINSIGHTS_CONNECTION_STRING"
    APPLICATIONINSIGHTS_AUTHENTICATION_STRING: Final = "APPLICATIONINSIGHTS_AUTHENTICATION_STRING"
    AZURE_CLIENT_ID: Final = "AZURE_CLIENT_ID"


class ChaosSetting:
    """Test-only settings (docs/contract.md#6-settings): read by the code, set only by
    chaos runs, never deployed, so absent from the Bicep and the local settings files."""

    FAULT_RATE: Final = "ChaosFaultRate"
    """The chance that a state-store or bus call crashes; 0 (off) unless a chaos run sets it."""


class DevhostSetting:
    """Local runtime only (docs/contract.md#73-local-front-door): read by
    `python -m devhost`, never by the app, never deployed. In Azure the platform checks
    the keys; locally they are checked only when asked, so that the auth levels can be
    tested end to end."""

    ENFORCE_KEYS: Final = "DevhostEnforceKeys"
    """`true`: HTTP routes need a key as in Azure; anything else: no keys, as Core Tools."""
    FUNCTION_KEY: Final = "DevhostFunctionKey"
    MASTER_KEY: Final = "DevhostMasterKey"


class Route:
    """HTTP routes below /api (docs/contract.md#2-http-api)."""

    ORDERS: Final = "orders"
    ORDER: Final = "orders/{orderId}"
    RESUBMIT: Final = "orders/{orderId}/resubmit"
    CANCEL: Final = "orders/{orderId}/cancel"
    SUSPEND: Final = "orders/{orderId}/suspend"
    RESUME: Final = "orders/{orderId}/resume"
    ORDER_EVENT: Final = "orders/{orderId}/events/{eventName}"
    """An event for an order's waiting step (an approval, a webhook)."""
    ORDER_APPROVAL: Final = "orders/{orderId}/approval"
    """An operator answers an order's approval (admin): the page's Approve and Reject."""
    HEALTH: Final = "health"
    OPENAPI: Final = "openapi.json"
    OPS_PAGE: Final = "ops"
    """The operator page (HTML); it polls OPS_DATA."""
    OPS_DATA: Final = "ops/data"
    OPS_ORDER: Final = "ops/orders/{orderId}"
    """One order as GET ORDER answers it, for the operator page: an operator route (a
    signed-in reader), where ORDER is the submitting application's (a function key)."""
    AGENTS: Final = "agents"
    AGENT_DRAIN: Final = "agents/{agent}/drain"
    """Drain or undrain one agent (a provider's maintenance window)."""
    FAILURES: Final = "failures"
    """The Error orders grouped by step and error code."""
    BULK: Final = "orders/bulk"
    """Resubmit, cancel, suspend or resume every order a filter matches (or preview it)."""
    BULK_JOB: Final = "bulk/{bulkId}"
    """A bulk job's progress."""
    WORKFLOWS: Final = "workflows"
    """The catalogue's workflows, each kept version with its steps."""
    RECONCILE: Final = "reconcile"
    """Run reconciliation now (admin), as the ReconcileSchedule timer does."""
    ARCHIVE: Final = "archive"
    """Run the archiver now (admin), as the ArchiveSchedule timer does."""
    ARCHIVE_DAY: Final = "archive/{day}"
    """The orders archived under one day (yyyy-mm-dd), a few pages at a time (admin)."""
