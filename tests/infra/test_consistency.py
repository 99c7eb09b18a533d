"""One source of truth: the deployment files agree with the code.

The code (shared/contract.py, shared/settings.py, the registered functions) is the truth;
the Bicep, the Service Bus emulator config, local.settings.sample.json and host.json are
checked against it. Each test names what drifted.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping

import pytest

from shared.bootstrap import AGENT_CAPACITY
from shared.contract import (
    NOTIFICATION_QUEUES,
    QUEUE_PROPERTIES,
    AgentLimitSetting,
    ChaosSetting,
    Setting,
    queue_properties,
)
from shared.domain.model import ExhaustedPolicy
from shared.settings import Settings
from tests.app_functions import registered_functions
from tests.infra.bicep import Call, Interpolation, Ref
from tests.infra.deployment import (
    EMULATOR_AMQP_PORT,
    INFRA,
    ROOT,
    as_environment,
    bound,
    deployed_app_settings,
    deployed_queues,
    function_module,
    grants,
    identity_output,
    iso_seconds,
    load_json,
    main,
    only_call,
    service_bus_emulator_port,
    timespan_seconds,
)
from tests.workflows import ALL_QUEUES, CATALOGUE, SERVICE_URL_SETTINGS

# The Setting constants, and each catalogue agent's service URL setting.
CODE_SETTINGS = frozenset(
    value for name, value in vars(Setting).items() if name.isupper() and isinstance(value, str)
) | frozenset(SERVICE_URL_SETTINGS)
# Set by the platform on every instance: a deployment must never pin it.
PLATFORM_SETTINGS = frozenset({Setting.INSTANCE_ID, Setting.SITE_NAME})
# Connection-string forms: for the local emulators only, never deployed.
CONNECTION_STRING_SETTINGS = frozenset({Setting.STORAGE, Setting.SERVICE_BUS})
# Test-only (chaos runs): read by the code, never deployed.
TEST_ONLY_SETTINGS = frozenset(
    value for name, value in vars(ChaosSetting).items() if name.isupper() and isinstance(value, str)
)
# Local only: the operator page's link to devhost's trace receiver; Azure has Application Insights.
LOCAL_ONLY_SETTINGS = frozenset({Setting.TRACE_QUERY_URL})
# Optional, with a default that is right in Azure (the deployed catalogue.json).
OPTIONAL_SETTINGS = frozenset({Setting.CATALOGUE_FILE, Setting.EVENT_SIGNING_SECRET}) | frozenset(
    AgentLimitSetting.names(CATALOGUE.agents)
)
PLAIN_SETTINGS = (
    CODE_SETTINGS
    - PLATFORM_SETTINGS
    - CONNECTION_STRING_SETTINGS
    - LOCAL_ONLY_SETTINGS
    - OPTIONAL_SETTINGS
)

# The Service Bus emulator's documented limits (its config schema, Config-schema.json in
# Azure/azure-service-bus-emulator-installer): entity properties outside them are rejected.
EMULATOR_NAMESPACE = "sbemulatorns"
EMULATOR_MAX_ENTITIES = 50
EMULATOR_LOCK_DURATION = (5, 300)
EMULATOR_DUPLICATE_WINDOW = (5, 300)
EMULATOR_MESSAGE_TTL = (300, 3600)
EMULATOR_MAX_DELIVERY_COUNT = (1, 10)
EMULATOR_ENTITY_NAME = re.compile(r"^[A-Za-z0-9]$|^[A-Za-z0-9][\w.\-/]*[A-Za-z0-9]$")
EMULATOR_LOGGING = {"File", "Console", "File,Console", "Console,File"}

EMULATOR_CONFIG = ROOT / "emulator" / "servicebus-config.json"
LOCAL_SETTINGS = ROOT / "local.settings.sample.json"
HOST_JSON = ROOT / "host.json"


class RecordingEnv(Mapping[str, str]):
    """An environment that remembers every name the code looks up."""

    def __init__(self, values: Mapping[str, str]) -> None:
        self._values = dict(values)
        self.read: set[str] = set()

    def __getitem__(self, key: str) -> str:
        self.read.add(key)
        return self._values[key]

    def __contains__(self, key: object) -> bool:
        if isinstance(key, str):
            self.read.add(key)
        return key in self._values

    def __iter__(self) -> Iterator[str]:
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)


def _csv(value: str) -> list[str]:
    return [part.strip() for part in value.split(",") if part.strip()]


# ---------------------------------------------------------------------------
# Queues: Bicep
# ---------------------------------------------------------------------------


def test_bicep_creates_exactly_the_contract_queues() -> None:
    queues = deployed_queues()
    missing = sorted(set(ALL_QUEUES) - set(queues))
    unknown = sorted(set(queues) - set(ALL_QUEUES))
    assert not missing, f"queues in shared/contract.py ALL_QUEUES but not in the Bicep: {missing}"
    assert not unknown, f"queues in the Bicep that the code does not know: {unknown}"


@pytest.mark.parametrize("queue", ALL_QUEUES)
def test_bicep_queue_properties_match_the_contract(queue: str) -> None:
    properties = deployed_queues()[queue]
    expected = queue_properties(queue)
    assert iso_seconds(properties.get("lockDuration")) == expected.lock_duration_seconds
    assert properties.get("maxDeliveryCount") == expected.max_delivery_count
    assert properties.get("requiresDuplicateDetection") is expected.requires_duplicate_detection
    assert (
        iso_seconds(properties.get("duplicateDetectionHistoryTimeWindow"))
        == expected.duplicate_detection_window_seconds
    )
    assert (
        properties.get("deadLetteringOnMessageExpiration")
        is expected.dead_lettering_on_message_expiration
    )
    assert properties.get("requiresSession") in (None, False), "the code sends no session ids"


def _triggered_queues() -> set[str]:
    return {
        str(f.trigger["queueName"])
        for f in registered_functions()
        if f.trigger["type"] == "serviceBusTrigger"
    }


def test_the_notification_queues_are_the_ones_no_trigger_reads() -> None:
    """A queue the app only writes has its reader outside the app: it is a notification
    queue, and gets the time-to-live that keeps an absent reader from filling it."""
    assert set(ALL_QUEUES) - _triggered_queues() == set(NOTIFICATION_QUEUES)


@pytest.mark.parametrize("queue", NOTIFICATION_QUEUES)
def test_a_notification_queue_drops_what_nobody_read_within_its_time_to_live(queue: str) -> None:
    properties = deployed_queues()[queue]
    ttl = properties.get("defaultMessageTimeToLive")
    assert isinstance(ttl, str), f"{queue}: no time-to-live set from a parameter default: {ttl!r}"
    assert 3600 <= iso_seconds(ttl) <= 14 * 24 * 3600, f"{queue}: {ttl} is not a sane default"
    assert properties.get("deadLetteringOnMessageExpiration") is False


def test_notification_time_to_live_comes_from_a_main_parameter_per_queue() -> None:
    passed = main().resolve(
        bound("app/servicebus.bicep").call.params["notificationQueues"], defaults=False
    )
    assert isinstance(passed, list)
    by_queue = {item["name"]: item["timeToLive"] for item in passed if isinstance(item, dict)}
    assert set(by_queue) == set(NOTIFICATION_QUEUES)
    for queue, ttl in by_queue.items():
        assert isinstance(ttl, Ref) and ttl.name in main().params, f"{queue}: not a parameter"
        assert ttl.name in load_json(INFRA / "main.parameters.json")["parameters"], queue


@pytest.mark.parametrize("queue", sorted(set(ALL_QUEUES) - set(NOTIFICATION_QUEUES)))
def test_a_work_queue_keeps_its_messages_until_they_are_processed(queue: str) -> None:
    assert "defaultMessageTimeToLive" not in deployed_queues()[queue]


def test_every_triggered_queue_is_deployed() -> None:
    triggered = _triggered_queues()
    assert triggered, "no Service Bus trigger found: did the app stop indexing?"
    assert triggered <= set(deployed_queues()), "a trigger listens on a queue the Bicep lacks"


# ---------------------------------------------------------------------------
# Queues: the Service Bus emulator config
# ---------------------------------------------------------------------------


def _emulator_namespace() -> dict[str, object]:
    config = load_json(EMULATOR_CONFIG)
    user = config["UserConfig"]
    assert user["Logging"]["Type"] in EMULATOR_LOGGING
    namespaces = user["Namespaces"]
    assert len(namespaces) == 1, "the emulator hosts exactly one namespace"
    namespace: dict[str, object] = namespaces[0]
    assert namespace["Name"] == EMULATOR_NAMESPACE, "the emulator only accepts sbemulatorns"
    assert isinstance(namespace.get("Queues"), list) and isinstance(namespace.get("Topics"), list)
    return namespace


def _emulator_queues() -> dict[str, dict[str, object]]:
    queues: dict[str, dict[str, object]] = {}
    raw = _emulator_namespace()["Queues"]
    assert isinstance(raw, list)
    for queue in raw:
        name = queue["Name"]
        assert name not in queues, f"emulator config declares {name} twice"
        queues[name] = queue.get("Properties", {})
    return queues


def test_emulator_config_declares_exactly_the_contract_queues() -> None:
    queues = _emulator_queues()
    missing = sorted(set(ALL_QUEUES) - set(queues))
    unknown = sorted(set(queues) - set(ALL_QUEUES))
    assert not missing, f"queues missing from {EMULATOR_CONFIG.name}: {missing}"
    assert not unknown, f"queues in {EMULATOR_CONFIG.name} the code does not know: {unknown}"


def test_emulator_config_stays_within_the_emulator_limits() -> None:
    namespace = _emulator_namespace()
    topics = namespace["Topics"]
    assert isinstance(topics, list)
    assert len(_emulator_queues()) + len(topics) <= EMULATOR_MAX_ENTITIES
    for name, properties in _emulator_queues().items():
        assert EMULATOR_ENTITY_NAME.match(name), f"{name}: not a valid emulator entity name"
        for key, (low, high) in (
            ("LockDuration", EMULATOR_LOCK_DURATION),
            ("DuplicateDetectionHistoryTimeWindow", EMULATOR_DUPLICATE_WINDOW),
            ("DefaultMessageTimeToLive", EMULATOR_MESSAGE_TTL),
        ):
            if key in properties:
                seconds = iso_seconds(properties[key])
                assert low <= seconds <= high, f"{name}.{key}={properties[key]} outside the limits"
        count = properties.get("MaxDeliveryCount", 3)
        assert isinstance(count, int)
        assert EMULATOR_MAX_DELIVERY_COUNT[0] <= count <= EMULATOR_MAX_DELIVERY_COUNT[1]


@pytest.mark.parametrize("queue", ALL_QUEUES)
def test_emulator_queue_properties_match_the_contract_as_far_as_the_emulator_allows(
    queue: str,
) -> None:
    """Equal to the contract, or clamped to the emulator's bound where the contract exceeds it.

    Today that is one clamp: duplicate detection keeps 5 minutes locally instead of 10.
    """
    properties = _emulator_queues()[queue]
    expected = queue_properties(queue)

    def clamp(seconds: int, bounds: tuple[int, int]) -> int:
        return max(bounds[0], min(bounds[1], seconds))

    assert iso_seconds(properties.get("LockDuration")) == clamp(
        expected.lock_duration_seconds, EMULATOR_LOCK_DURATION
    )
    assert properties.get("MaxDeliveryCount") == clamp(
        expected.max_delivery_count, EMULATOR_MAX_DELIVERY_COUNT
    )
    assert properties.get("RequiresDuplicateDetection") is expected.requires_duplicate_detection
    assert iso_seconds(properties.get("DuplicateDetectionHistoryTimeWindow")) == clamp(
        expected.duplicate_detection_window_seconds, EMULATOR_DUPLICATE_WINDOW
    )
    assert (
        properties.get("DeadLetteringOnMessageExpiration")
        is expected.dead_lettering_on_message_expiration
    )
    assert properties.get("RequiresSession") in (None, False)


# ---------------------------------------------------------------------------
# Settings: what the deployed app reads
# ---------------------------------------------------------------------------


def test_bicep_sets_every_plain_setting_the_code_reads() -> None:
    missing = sorted(PLAIN_SETTINGS - set(deployed_app_settings()))
    assert not missing, (
        f"settings the code reads (shared/contract.py Setting) but the Bicep never sets: {missing}"
    )


def test_bicep_sets_no_connection_string_and_leaves_platform_settings_alone() -> None:
    settings = deployed_app_settings()
    assert not CONNECTION_STRING_SETTINGS & set(settings), (
        "a connection-string setting is deployed; use the identity-based forms"
    )
    assert not PLATFORM_SETTINGS & set(settings), "WEBSITE_* settings belong to the platform"


@pytest.mark.parametrize("connection", sorted(CONNECTION_STRING_SETTINGS))
def test_bicep_connections_are_identity_based(connection: str) -> None:
    settings = deployed_app_settings()
    assert settings.get(f"{connection}__credential") == "managedidentity"
    assert settings.get(f"{connection}__clientId") == identity_output("clientId"), (
        f"{connection}__clientId must be the client id of the identity the app runs as"
    )


def test_bicep_storage_settings_serve_both_the_host_and_the_code() -> None:
    settings = deployed_app_settings()
    prefix = Setting.STORAGE
    # The Functions host: the account name, or its blob and queue endpoints.
    assert f"{prefix}__accountName" in settings or {
        f"{prefix}__blobServiceUri",
        f"{prefix}__queueServiceUri",
    } <= set(settings), "the Functions host cannot find its storage"
    # The code's state store (shared/settings.py): the table endpoint or the account name.
    assert {f"{prefix}__tableServiceUri", f"{prefix}__accountName"} & set(settings)


def test_bicep_service_bus_settings_serve_the_triggers_and_the_sender() -> None:
    settings = deployed_app_settings()
    connections = {
        str(f.trigger["connection"])
        for f in registered_functions()
        if f.trigger["type"] == "serviceBusTrigger"
    }
    assert connections == {Setting.SERVICE_BUS}
    for connection in connections:
        assert f"{connection}__fullyQualifiedNamespace" in settings


def test_timer_schedules_come_from_deployed_settings() -> None:
    settings = deployed_app_settings()
    for function in registered_functions():
        schedule = str(function.trigger.get("schedule", ""))
        if function.trigger["type"] == "timerTrigger" and schedule.startswith("%"):
            assert schedule.strip("%") in settings, f"{function.name}: {schedule} is never set"


def test_deployed_settings_parse_and_every_name_the_code_reads_is_deployed() -> None:
    """Run the real settings parser on the Bicep's app settings and watch what it reads."""
    env = RecordingEnv(as_environment(deployed_app_settings()))
    settings = Settings.from_env(env, catalogue=CATALOGUE)
    not_deployed = (
        env.read
        - set(env)
        - CONNECTION_STRING_SETTINGS
        - PLATFORM_SETTINGS
        - TEST_ONLY_SETTINGS
        - LOCAL_ONLY_SETTINGS
        - OPTIONAL_SETTINGS
    )
    assert not not_deployed, f"the code reads settings the Bicep never sets: {sorted(not_deployed)}"
    assert settings.storage.connection_string is None and settings.storage.client_id
    assert settings.service_bus.connection_string is None and settings.service_bus.client_id
    assert settings.storage.endpoint and settings.service_bus.endpoint


def test_bicep_defaults_equal_the_code_defaults() -> None:
    """A default changed in shared/settings.py alone (or in main.bicep alone) fails here."""
    code = Settings.from_env(
        {Setting.STORAGE: "UseDevelopmentStorage=true", Setting.SERVICE_BUS: "Endpoint=sb://x/"},
        catalogue=CATALOGUE,
    )
    settings = deployed_app_settings()
    assert settings[Setting.STATE_TABLE] == code.state_table
    for name, kept in (
        (Setting.RETENTION_PROCESSED_DAYS, code.retention.processed),
        (Setting.RETENTION_CANCELLED_DAYS, code.retention.cancelled),
        (Setting.RETENTION_COMPENSATED_DAYS, code.retention.compensated),
    ):
        assert settings[name] == str(kept.days if kept else 0), name
    assert settings[Setting.STEP_TIMEOUT_SECONDS] == str(int(code.step_timeout.total_seconds()))
    assert settings[Setting.PENDING_TIMEOUT_SECONDS] == str(
        int(code.pending_timeout.total_seconds())
    )
    assert settings[Setting.MAX_FAILURE_COUNT] == str(code.max_failure_count)
    assert settings[Setting.EXHAUSTED_POLICY] == code.exhausted_policy.value
    assert settings[Setting.BULK_ACTIONS_PER_SECOND] == str(int(code.bulk_actions_per_second))
    assert settings[Setting.CLOCK_SKEW_SECONDS] == str(int(code.clock_skew.total_seconds()))
    assert settings[Setting.INTAKE_MAX_PENDING_PER_CUSTOMER] == str(
        code.max_pending_per_customer or 0
    )
    assert settings[Setting.FAIR_SHARE_RUNNING_PER_CUSTOMER] == str(code.fair_share or 0)


def test_exhausted_policy_choices_match_the_code() -> None:
    choices = {policy.value for policy in ExhaustedPolicy}
    for file in (main(), function_module().file):
        allowed = file.params["exhaustedPolicy"].allowed
        assert allowed is not None and set(allowed) == choices, f"{file.path.name}: {allowed}"


def test_reply_to_allow_lists_name_contract_queues() -> None:
    deployed = deployed_app_settings()[Setting.REPLY_TO_ALLOW_LIST]
    local = load_json(LOCAL_SETTINGS)["Values"][Setting.REPLY_TO_ALLOW_LIST]
    for value in (deployed, local):
        assert isinstance(value, str)
        unknown = set(_csv(value)) - set(ALL_QUEUES)
        assert not unknown, f"{Setting.REPLY_TO_ALLOW_LIST} names queues nobody creates: {unknown}"


def test_supervisor_schedule_default_is_a_six_field_ncrontab() -> None:
    from croniter import croniter  # noqa: PLC0415 - dev dependency, only this test needs it

    schedule = deployed_app_settings()[Setting.SUPERVISOR_SCHEDULE]
    assert isinstance(schedule, str) and len(schedule.split()) == 6, "NCRONTAB has a seconds field"
    assert croniter.is_valid(schedule, second_at_beginning=True)


def test_app_insights_ingestion_is_identity_based() -> None:
    settings = deployed_app_settings()
    auth = settings.get("APPLICATIONINSIGHTS_AUTHENTICATION_STRING")
    assert isinstance(auth, Interpolation)
    assert auth.parts == ("ClientId=", identity_output("clientId"), ";Authorization=AAD")
    assert "APPLICATIONINSIGHTS_CONNECTION_STRING" in settings


# ---------------------------------------------------------------------------
# Roles: every access the code and the host make has its data-plane role
# ---------------------------------------------------------------------------

APP = "appPrincipalId"
# Access the app makes -> (roles that allow it, scope resource type).
REQUIRED_ACCESS = {
    # TableStateStore (shared/adapters/table/store.py), creating the table on first use.
    "state table": ({"Storage Table Data Contributor"}, "Microsoft.Storage/storageAccounts"),
    # The Functions host: leases, timer schedule monitor, keys; Flex reads its package.
    "host blobs": ({"Storage Blob Data Owner"}, "Microsoft.Storage/storageAccounts"),
    # The order archive (shared/adapters/blob_archive.py): its own container.
    "order archive": (
        {"Storage Blob Data Contributor"},
        "Microsoft.Storage/storageAccounts/blobServices/containers",
    ),
    # ServiceBusMessageBus (shared/adapters/servicebus_bus.py) sends to every queue.
    "send": (
        {"Azure Service Bus Data Sender", "Azure Service Bus Data Owner"},
        "Microsoft.ServiceBus/namespaces",
    ),
    # The Service Bus triggers receive.
    "receive": (
        {"Azure Service Bus Data Receiver", "Azure Service Bus Data Owner"},
        "Microsoft.ServiceBus/namespaces",
    ),
    # APPLICATIONINSIGHTS_AUTHENTICATION_STRING: Entra ID ingestion.
    "telemetry": ({"Monitoring Metrics Publisher"}, "Microsoft.Insights/components"),
}
# The only grant allowed beyond those, and only behind a switch.
OPTIONAL_APP_ROLES = {"Azure Service Bus Data Owner"}


@pytest.mark.parametrize("access", sorted(REQUIRED_ACCESS))
def test_the_app_identity_has_a_role_for(access: str) -> None:
    roles, scope_type = REQUIRED_ACCESS[access]
    matching = [
        g
        for g in grants()
        if g.principal == APP
        and g.role in roles
        and g.scope_type == scope_type
        and not g.conditional
    ]
    assert matching, f"no unconditional {sorted(roles)} on {scope_type} for the app ({access})"


def test_the_app_identity_gets_nothing_beyond_what_it_uses() -> None:
    needed = set().union(*(roles for roles, _ in REQUIRED_ACCESS.values()))
    for grant in grants():
        if grant.principal != APP:
            continue
        assert grant.role in needed, f"{grant.symbol}: {grant.role} is more than the app needs"
        if grant.role in OPTIONAL_APP_ROLES:
            assert grant.conditional, f"{grant.symbol}: {grant.role} only behind its switch"
        assert grant.principal_type == "ServicePrincipal"


def test_role_assignment_names_are_guids_of_scope_principal_and_role() -> None:
    """Stable across redeployments, distinct for every (scope, principal, role)."""
    for grant in grants():
        name = grant.name
        assert isinstance(name, Call) and name.function == "guid", f"{grant.symbol}: not guid()"
        assert Ref((grant.scope, "id")) in name.args, f"{grant.symbol}: guid lacks the scope"
        assert Ref((grant.principal,)) in name.args, f"{grant.symbol}: guid lacks the principal"
        assert grant.role_id in name.args, f"{grant.symbol}: guid lacks the role"


def test_the_deploying_principal_is_optional_and_mirrors_the_app_data_access() -> None:
    deployer = [g for g in grants() if g.principal == "principalId"]
    assert deployer and all(g.conditional for g in deployer), "grants to the user: only if set"
    app_roles = {(g.role, g.scope_type) for g in grants() if g.principal == APP}
    assert {(g.role, g.scope_type) for g in deployer} <= app_roles


def test_the_identity_granted_is_the_identity_the_app_runs_as() -> None:
    assert only_call(main(), "app/rbac.bicep").params[APP] == identity_output("principalId")
    api = function_module().call.params
    assert api["identityId"] == identity_output("resourceId")
    assert api["identityClientId"] == identity_output("clientId")


# ---------------------------------------------------------------------------
# local.settings.sample.json
# ---------------------------------------------------------------------------

LOCAL_HOST_SETTINGS = frozenset({"FUNCTIONS_WORKER_RUNTIME", "AzureWebJobsFeatureFlags"})


def test_local_settings_set_every_setting_the_code_reads() -> None:
    values = load_json(LOCAL_SETTINGS)["Values"]
    missing = sorted((CODE_SETTINGS - PLATFORM_SETTINGS - OPTIONAL_SETTINGS) - set(values))
    assert not missing, f"{LOCAL_SETTINGS.name} lacks {missing}"
    unknown = sorted(set(values) - CODE_SETTINGS - LOCAL_HOST_SETTINGS)
    assert not unknown, f"{LOCAL_SETTINGS.name} sets what nothing reads: {unknown}"
    assert values["FUNCTIONS_WORKER_RUNTIME"] == "python"


def test_local_settings_point_at_the_emulators_and_parse() -> None:
    values = load_json(LOCAL_SETTINGS)["Values"]
    assert values[Setting.STORAGE] == "UseDevelopmentStorage=true"
    assert "UseDevelopmentEmulator=true" in values[Setting.SERVICE_BUS]
    assert service_bus_emulator_port() == EMULATOR_AMQP_PORT
    settings = Settings.from_env(values, catalogue=CATALOGUE)
    assert settings.storage.connection_string and settings.service_bus.connection_string


# ---------------------------------------------------------------------------
# host.json
# ---------------------------------------------------------------------------


def test_host_json_service_bus_options_fit_the_queues_and_the_code() -> None:
    host = load_json(HOST_JSON)
    assert host["version"] == "2.0"
    bundle = host["extensionBundle"]
    assert bundle["id"] == "Microsoft.Azure.Functions.ExtensionBundle"
    # Identity-based Service Bus connections need the 4.x bundle (Service Bus extension 5.x).
    assert bundle["version"].startswith("[4.")
    service_bus = host["extensions"]["serviceBus"]
    # The functions never settle messages themselves: returning completes, raising abandons.
    assert service_bus["autoCompleteMessages"] is True
    renewal = timespan_seconds(service_bus["maxAutoLockRenewalDuration"])
    assert renewal >= QUEUE_PROPERTIES.lock_duration_seconds
    step_timeout = deployed_app_settings()[Setting.STEP_TIMEOUT_SECONDS]
    assert isinstance(step_timeout, str)
    assert renewal >= int(step_timeout), "an agent step may outlive its message lock"


def test_agent_capacity_in_heartbeats_is_what_host_json_lets_one_instance_serve() -> None:
    host = load_json(HOST_JSON)
    assert host["extensions"]["serviceBus"]["maxConcurrentCalls"] == AGENT_CAPACITY
