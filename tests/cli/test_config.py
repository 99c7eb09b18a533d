"""Where the CLI finds the API and the bus, and what it may print about them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from shared.cli.app import redact
from shared.cli.config import (
    api_config,
    bus_config,
    find_settings,
    normalise_namespace,
    normalise_url,
)
from shared.cli.errors import Exit, Usage
from tests.cli.conftest import cli

EMULATOR = (
    "Endpoint=sb://127.0.0.1:5672;SharedAccessKeyName=RootManageSharedAccessKey;"
    "SharedAccessKey=SECRET-VALUE;UseDevelopmentEmulator=true;"
)


def settings_in(root: Path, values: dict[str, str], host: dict[str, object] | None = None) -> Path:
    path = root / "local.settings.json"
    path.write_text(json.dumps({"Values": values, "Host": host or {}}), encoding="utf-8")
    return path


@pytest.mark.parametrize(
    ("raw", "url"),
    [
        ("http://127.0.0.1:7071", "http://127.0.0.1:7071"),
        ("http://127.0.0.1:7071/", "http://127.0.0.1:7071"),
        ("https://app.example.net/api/", "https://app.example.net"),
    ],
)
def test_urls_are_normalised_to_the_app_root(raw: str, url: str) -> None:
    assert normalise_url(raw) == url


def test_a_url_without_scheme_is_a_usage_error() -> None:
    with pytest.raises(Usage, match="http"):
        normalise_url("127.0.0.1:7071")


def test_api_flags_beat_environment_which_beats_the_settings_port(tmp_path: Path) -> None:
    settings = find_settings([tmp_path])
    env = {"ORDERS_API_URL": "http://env:1", "ORDERS_API_KEY": "k-env", "USER": "ann"}
    assert api_config("http://flag:2", "k-flag", None, 5, env, settings).url == "http://flag:2"
    config = api_config(None, None, None, 5, env, settings)
    assert (config.url, config.key, config.operator) == ("http://env:1", "k-env", "ann")
    settings_in(tmp_path, {}, {"LocalHttpPort": 7081})
    local = api_config(None, None, "bob", 5, {}, find_settings([tmp_path]))
    assert (local.url, local.key, local.operator, local.api) == (
        "http://127.0.0.1:7081",
        None,
        "bob",
        "http://127.0.0.1:7081/api",
    )


def test_bus_comes_from_flags_then_environment_then_the_settings_file(tmp_path: Path) -> None:
    settings_in(tmp_path, {"ServiceBusConnection": EMULATOR})
    settings = find_settings([tmp_path])
    from_file = bus_config(None, None, {}, settings)
    assert (from_file.connection_string, from_file.source) == (EMULATOR, str(settings.path))
    env = {
        "ServiceBusConnection__fullyQualifiedNamespace": "prod-sb",
        "ServiceBusConnection__clientId": "cid",
    }
    from_env = bus_config(None, None, env, settings)
    assert (from_env.namespace, from_env.client_id, from_env.connection_string) == (
        "prod-sb.servicebus.windows.net",
        "cid",
        None,
    )
    from_flag = bus_config(EMULATOR, None, env, settings)
    assert from_flag.connection_string == EMULATOR
    assert bus_config(None, "sb://other.servicebus.windows.net/", {}, settings).namespace == (
        "other.servicebus.windows.net"
    )


def test_the_sample_file_is_used_when_there_is_no_private_copy(tmp_path: Path) -> None:
    sample = tmp_path / "local.settings.sample.json"
    sample.write_text(json.dumps({"Values": {"ServiceBusConnection": EMULATOR}}))
    assert bus_config(None, None, {}, find_settings([tmp_path])).connection_string == EMULATOR


def test_no_bus_anywhere_and_conflicting_flags_are_usage_errors(tmp_path: Path) -> None:
    with pytest.raises(Usage, match="no Service Bus configured"):
        bus_config(None, None, {}, find_settings([tmp_path]))
    with pytest.raises(Usage, match="not both"):
        bus_config(EMULATOR, "ns", {}, find_settings([tmp_path]))


def test_a_broken_settings_file_is_named(tmp_path: Path) -> None:
    (tmp_path / "local.settings.json").write_text("{not json")
    with pytest.raises(Usage, match=r"cannot read .*local\.settings\.json"):
        find_settings([tmp_path])


def test_only_the_host_of_a_connection_string_is_printable() -> None:
    config = bus_config(EMULATOR, None, {}, find_settings([]))
    assert config.host == "127.0.0.1:5672"
    assert "SECRET-VALUE" in config.secrets
    message = f"failed with {EMULATOR} and SECRET-VALUE"
    assert "SECRET-VALUE" not in redact(message, config.secrets)
    assert normalise_namespace("ns") == "ns.servicebus.windows.net"


async def test_a_usage_error_never_echoes_a_secret_flag() -> None:
    result = await cli("orders", "list", "--key=abc-secret", "--bogus", "abc-secret")
    assert result.code == Exit.USAGE
    assert "abc-secret" not in result.err and "***" in result.err
