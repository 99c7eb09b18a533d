"""App settings read from the environment: numbers are checked, and a bad one is named;
ClockSkewSeconds reaches the process policy like the other numbers."""

from __future__ import annotations

from datetime import timedelta

import pytest
from pydantic import ValidationError

from shared.catalogue.schema import AgentModel
from shared.contract import Setting
from shared.domain.limits import AgentLimits
from shared.domain.machine.transition import ProcessPolicy
from shared.settings import ConfigurationError, Settings
from shared.usecases.flow.submission import submit_order
from tests.builders import World, an_order
from tests.workflows import CATALOGUE

LOCAL = {
    Setting.STORAGE: "UseDevelopmentStorage=true",
    Setting.SERVICE_BUS: "Endpoint=sb://127.0.0.1;SharedAccessKeyName=k;SharedAccessKey=v;",
}


@pytest.mark.parametrize("raw", ["nan", "inf", "-inf", "Infinity"])
def test_a_number_that_is_not_finite_names_the_setting(raw: str) -> None:
    """float() reads these; a NaN passes every comparison, so it is refused by name
    rather than failing later inside timedelta."""
    with pytest.raises(
        ConfigurationError, match=f"setting StepTimeoutSeconds must be a finite number, got '{raw}'"
    ):
        Settings.from_env({**LOCAL, Setting.STEP_TIMEOUT_SECONDS: raw}, catalogue=CATALOGUE)


def test_clock_skew_defaults_to_the_policys_margin() -> None:
    policy = Settings.from_env(LOCAL, catalogue=CATALOGUE).policy
    default = ProcessPolicy(timedelta(seconds=30), timedelta(seconds=60), 3).clock_skew
    assert policy.clock_skew == default == timedelta(seconds=5)


@pytest.mark.parametrize(("raw", "seconds"), [("12", 12), ("2.5", 2.5), ("0", 0), ("", 5)])
def test_clock_skew_is_read_into_the_policy(raw: str, seconds: float) -> None:
    settings = Settings.from_env({**LOCAL, Setting.CLOCK_SKEW_SECONDS: raw}, catalogue=CATALOGUE)
    assert settings.policy.clock_skew == timedelta(seconds=seconds)


@pytest.mark.parametrize(
    ("raw", "says"),
    [
        ("-1", "must be at least 0"),
        ("five", "must be a number"),
        ("nan", "must be a finite number"),
        ("inf", "must be a finite number"),
    ],
)
def test_a_clock_skew_that_is_not_a_non_negative_number_names_the_setting(
    raw: str, says: str
) -> None:
    with pytest.raises(ConfigurationError, match=f"setting ClockSkewSeconds {says}, got '{raw}'"):
        Settings.from_env({**LOCAL, Setting.CLOCK_SKEW_SECONDS: raw}, catalogue=CATALOGUE)


async def test_a_request_is_live_until_its_complete_by_plus_the_configured_skew() -> None:
    """The setting reaches the domain: a dispatched step's live time follows it."""
    policy = Settings.from_env(
        {**LOCAL, Setting.CLOCK_SKEW_SECONDS: "12"}, catalogue=CATALOGUE
    ).policy
    world = World(policy=policy)
    await submit_order(world.deps(), an_order("o-1", clock=world.clock))  # claimed at intake
    process = await world.store.load("o-1")
    assert process is not None
    step = process.steps[0]
    assert step.complete_by is not None
    assert step.live_until == step.complete_by + timedelta(seconds=12)


def test_per_customer_counts_are_whole_numbers_and_zero_turns_them_off() -> None:
    base = {Setting.STORAGE: "UseDevelopmentStorage=true", Setting.SERVICE_BUS: "Endpoint=sb://x/"}
    off = Settings.from_env(base, catalogue=CATALOGUE)
    assert off.max_pending_per_customer is None and off.fair_share is None
    assert not off.customer_policy.active
    on = Settings.from_env(
        {
            **base,
            Setting.INTAKE_MAX_PENDING_PER_CUSTOMER: "100",
            Setting.FAIR_SHARE_RUNNING_PER_CUSTOMER: "8",
        },
        catalogue=CATALOGUE,
    )
    assert (on.customer_policy.max_pending, on.customer_policy.fair_share) == (100, 8)
    for bad in ("2.5", "-1", "many"):
        with pytest.raises(ConfigurationError, match=Setting.INTAKE_MAX_PENDING_PER_CUSTOMER):
            Settings.from_env(
                {**base, Setting.INTAKE_MAX_PENDING_PER_CUSTOMER: bad}, catalogue=CATALOGUE
            )


def test_agent_limits_come_from_the_catalogue_and_app_settings_override_them() -> None:
    """The test catalogue declares none; a setting adds one, 0 lifts it, a fraction of a
    call at once is refused by name."""
    plain = Settings.from_env(LOCAL, catalogue=CATALOGUE).agent_limits
    assert not any(limits.limited for limits in plain.values())
    settings = Settings.from_env(
        {
            **LOCAL,
            "AgentLimits__payment__callsPerSecond": "5",
            "AgentLimits__payment__maxConcurrent": "8",
            "AgentLimits__shipping__callsPerSecond": "0",
        },
        catalogue=CATALOGUE,
    )
    assert settings.agent_limits["payment"] == AgentLimits(8, 5.0)
    assert not settings.agent_limits["shipping"].limited
    with pytest.raises(ConfigurationError, match="AgentLimits__payment__maxConcurrent"):
        Settings.from_env(
            {**LOCAL, "AgentLimits__payment__maxConcurrent": "2.5"}, catalogue=CATALOGUE
        )


def test_a_catalogue_limit_must_be_positive() -> None:
    with pytest.raises(ValidationError):
        AgentModel.model_validate(
            {"name": "payment", "serviceUrlSetting": "PaymentServiceUrl", "callsPerSecond": 0}
        )
    declared = AgentModel.model_validate(
        {"name": "payment", "serviceUrlSetting": "PaymentServiceUrl", "maxConcurrent": 4}
    )
    assert (declared.max_concurrent, declared.calls_per_second) == (4, None)


def test_retention_defaults_to_30_and_90_days() -> None:
    retention = Settings.from_env(LOCAL, catalogue=CATALOGUE).retention
    assert (retention.processed, retention.cancelled, retention.compensated) == (
        timedelta(days=30),
        timedelta(days=90),
        timedelta(days=90),
    )


@pytest.mark.parametrize(
    ("raw", "kept"),
    [("7", timedelta(days=7)), ("0.5", timedelta(hours=12)), ("0", None), ("", timedelta(days=30))],
)
def test_retention_days_are_read_and_0_keeps_forever(raw: str, kept: timedelta | None) -> None:
    assert (
        Settings.from_env(
            {**LOCAL, Setting.RETENTION_PROCESSED_DAYS: raw}, catalogue=CATALOGUE
        ).retention.processed
        == kept
    )


def test_a_negative_retention_names_the_setting() -> None:
    with pytest.raises(ConfigurationError, match="RetentionCancelledDays must be at least 0"):
        Settings.from_env({**LOCAL, Setting.RETENTION_CANCELLED_DAYS: "-1"}, catalogue=CATALOGUE)


@pytest.mark.parametrize(
    ("env", "archive"),
    [
        ({}, "BlobEndpoint=http://127.0.0.1:10000/devstoreaccount1;"),
        ({Setting.STORAGE: "AccountName=a;AccountKey=k;TableEndpoint=http://t/a;"}, None),
        (
            {
                Setting.STORAGE: "AccountName=a;AccountKey=k;TableEndpoint=http://t/a;BlobEndpoint=http://b/a;"
            },
            "BlobEndpoint=http://b/a;",
        ),
    ],
)
def test_the_archive_uses_the_storage_connections_blob_service(
    env: dict[str, str], archive: str | None
) -> None:
    """A table-only emulator leaves the archive off rather than point it at Azure."""
    found = Settings.from_env({**LOCAL, **env}, catalogue=CATALOGUE).archive_storage
    if archive is None:
        assert found is None
    else:
        assert found is not None and archive in str(found.connection_string)


def test_the_archive_in_azure_is_the_accounts_blob_endpoint_with_the_same_identity() -> None:
    found = Settings.from_env(
        {
            Setting.SERVICE_BUS: LOCAL[Setting.SERVICE_BUS],
            f"{Setting.STORAGE}__accountName": "acct",
            f"{Setting.STORAGE}__clientId": "cid",
        },
        catalogue=CATALOGUE,
    ).archive_storage
    assert found is not None
    assert (found.endpoint, found.client_id) == ("https://acct.blob.core.windows.net", "cid")
