"""App settings read from the environment: numbers are checked, and a bad one is named;
ClockSkewSeconds reaches the process policy like the other numbers."""

from __future__ import annotations

from datetime import timedelta

import pytest
from pydantic import ValidationError

from shared.catalogue.schema import AgentModel
from shared.contract import Queue, Setting
from shared.domain.limits import AgentLimits
from shared.domain.process import ProcessPolicy
from shared.settings import ConfigurationError, Settings
from shared.usecases import scheduler
from shared.usecases.submission import submit_order
from tests.builders import World, an_order

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
        Settings.from_env({**LOCAL, Setting.STEP_TIMEOUT_SECONDS: raw})


def test_clock_skew_defaults_to_the_policys_margin() -> None:
    policy = Settings.from_env(LOCAL).policy
    default = ProcessPolicy(timedelta(seconds=30), timedelta(seconds=60), 3).clock_skew
    assert policy.clock_skew == default == timedelta(seconds=5)


@pytest.mark.parametrize(("raw", "seconds"), [("12", 12), ("2.5", 2.5), ("0", 0), ("", 5)])
def test_clock_skew_is_read_into_the_policy(raw: str, seconds: float) -> None:
    settings = Settings.from_env({**LOCAL, Setting.CLOCK_SKEW_SECONDS: raw})
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
        Settings.from_env({**LOCAL, Setting.CLOCK_SKEW_SECONDS: raw})


async def test_a_request_is_live_until_its_complete_by_plus_the_configured_skew() -> None:
    """The setting reaches the domain: a dispatched step's live time follows it."""
    policy = Settings.from_env({**LOCAL, Setting.CLOCK_SKEW_SECONDS: "12"}).policy
    world = World(policy=policy)
    await submit_order(world.deps(), an_order("o-1", clock=world.clock))
    (nudge,) = world.bus.take(Queue.SCHEDULER)
    await scheduler.on_nudge(world.deps(), "o-1", nudge.message_id)
    process = await world.store.load("o-1")
    assert process is not None
    step = process.steps[0]
    assert step.complete_by is not None
    assert step.live_until == step.complete_by + timedelta(seconds=12)


def test_per_customer_counts_are_whole_numbers_and_zero_turns_them_off() -> None:
    base = {Setting.STORAGE: "UseDevelopmentStorage=true", Setting.SERVICE_BUS: "Endpoint=sb://x/"}
    off = Settings.from_env(base)
    assert off.max_pending_per_customer is None and off.fair_share is None
    assert not off.customer_policy.active
    on = Settings.from_env(
        {
            **base,
            Setting.INTAKE_MAX_PENDING_PER_CUSTOMER: "100",
            Setting.FAIR_SHARE_RUNNING_PER_CUSTOMER: "8",
        }
    )
    assert (on.customer_policy.max_pending, on.customer_policy.fair_share) == (100, 8)
    for bad in ("2.5", "-1", "many"):
        with pytest.raises(ConfigurationError, match=Setting.INTAKE_MAX_PENDING_PER_CUSTOMER):
            Settings.from_env({**base, Setting.INTAKE_MAX_PENDING_PER_CUSTOMER: bad})


def test_agent_limits_come_from_the_catalogue_and_app_settings_override_them() -> None:
    """The test catalogue declares none; a setting adds one, 0 lifts it, a fraction of a
    call at once is refused by name."""
    plain = Settings.from_env(LOCAL).agent_limits
    assert not any(limits.limited for limits in plain.values())
    settings = Settings.from_env(
        {
            **LOCAL,
            "AgentLimits__payment__callsPerSecond": "5",
            "AgentLimits__payment__maxConcurrent": "8",
            "AgentLimits__shipping__callsPerSecond": "0",
        }
    )
    assert settings.agent_limits["payment"] == AgentLimits(8, 5.0)
    assert not settings.agent_limits["shipping"].limited
    with pytest.raises(ConfigurationError, match="AgentLimits__payment__maxConcurrent"):
        Settings.from_env({**LOCAL, "AgentLimits__payment__maxConcurrent": "2.5"})


def test_a_catalogue_limit_must_be_positive() -> None:
    with pytest.raises(ValidationError):
        AgentModel.model_validate(
            {"name": "payment", "serviceUrlSetting": "PaymentServiceUrl", "callsPerSecond": 0}
        )
    declared = AgentModel.model_validate(
        {"name": "payment", "serviceUrlSetting": "PaymentServiceUrl", "maxConcurrent": 4}
    )
    assert (declared.max_concurrent, declared.calls_per_second) == (4, None)
