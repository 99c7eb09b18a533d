"""Indexing the app from its decorators, and the host.json knobs the runtime honours."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from devhost.host.loader import HostConfig, LoadError, functions_of, load_app
from tests.devhost.conftest import Recorder, build_app


def test_bindings_come_from_function_json() -> None:
    specs = {spec.name: spec for spec in functions_of(build_app(Recorder()))}
    assert set(specs) == {"get_item", "special_item", "create_item", "broken", "tick", "consume"}
    http = specs["get_item"].trigger
    assert (http["type"], http["route"], http["methods"], http["name"]) == (
        "httpTrigger",
        "items/{itemId}",
        ["GET"],
        "req",
    )
    assert specs["tick"].trigger["schedule"] == "*/1 * * * * *"
    bus = specs["consume"].trigger
    assert (bus["queueName"], bus["connection"], bus["name"]) == ("devhost-test", "TestBus", "msg")


def test_indexing_twice_reuses_the_first_result() -> None:
    app = build_app(Recorder())
    # A second app.get_functions() would raise; functions_of must not call it again.
    assert functions_of(app) is functions_of(app)


@pytest.fixture
def isolated_imports(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """``load_app`` edits sys.path and caches modules; keep both out of other tests."""
    monkeypatch.setattr(sys, "path", list(sys.path))
    before = set(sys.modules)
    yield
    for name in set(sys.modules) - before:
        del sys.modules[name]


@pytest.mark.usefixtures("isolated_imports")
def test_load_app_imports_the_module_from_root(tmp_path: Path) -> None:
    (tmp_path / "devhost_loader_app.py").write_text(
        "import azure.functions as func\n"
        "app = func.FunctionApp()\n"
        "@app.route(route='ping')\n"
        "def devhost_loader_ping(req: func.HttpRequest) -> func.HttpResponse:\n"
        "    return func.HttpResponse('pong')\n"
    )
    (spec,) = load_app(tmp_path, module_name="devhost_loader_app")
    assert spec.name == "devhost_loader_ping"
    assert spec.trigger["route"] == "ping"


@pytest.mark.usefixtures("isolated_imports")
def test_missing_or_broken_app_is_a_load_error(tmp_path: Path) -> None:
    with pytest.raises(LoadError, match=r"no devhost_absent\.py"):
        load_app(tmp_path, module_name="devhost_absent")
    (tmp_path / "devhost_broken_app.py").write_text("raise RuntimeError('bad import')\n")
    with pytest.raises(LoadError, match="bad import"):
        load_app(tmp_path, module_name="devhost_broken_app")


def test_host_json_knobs(tmp_path: Path) -> None:
    assert HostConfig.load(tmp_path) == HostConfig()
    (tmp_path / "host.json").write_text(
        json.dumps(
            {
                "version": "2.0",
                "extensions": {
                    "http": {"routePrefix": ""},
                    "serviceBus": {
                        "maxConcurrentCalls": 4,
                        "prefetchCount": 8,
                        "maxAutoLockRenewalDuration": "00:02:30",
                    },
                },
            }
        )
    )
    config = HostConfig.load(tmp_path)
    assert (config.route_prefix, config.max_concurrent_calls, config.prefetch_count) == ("", 4, 8)
    assert config.max_auto_lock_renewal_seconds == 150
    (tmp_path / "host.json").write_text('{"extensions": {"serviceBus": {"prefetchCount": "x"}}}')
    with pytest.raises(LoadError, match=r"host\.json"):
        HostConfig.load(tmp_path)


def test_app_settings_override_host_json(tmp_path: Path) -> None:
    """`AzureFunctionsJobHost__a__b` changes `a.b` of host.json, whatever the key's case,
    and adds what the file does not have; other settings leave it alone."""
    (tmp_path / "host.json").write_text(
        json.dumps({"extensions": {"serviceBus": {"maxConcurrentCalls": 16, "prefetchCount": 2}}})
    )
    settings = {
        "AzureFunctionsJobHost__extensions__serviceBus__maxConcurrentCalls": "32",
        "AzureFunctionsJobHost__Extensions__SERVICEBUS__prefetchcount": "4",
        "AzureFunctionsJobHost__extensions__http__routePrefix": "v1",
        "AzureFunctionsJobHost__": "ignored",
        "extensions__serviceBus__maxConcurrentCalls": "1",
    }
    config = HostConfig.load(tmp_path, settings)
    assert config.max_concurrent_calls == 32
    assert (config.prefetch_count, config.route_prefix) == (4, "v1")
    assert HostConfig.load(tmp_path).max_concurrent_calls == 16
    bad = {"AzureFunctionsJobHost__extensions__serviceBus__maxConcurrentCalls": "many"}
    with pytest.raises(LoadError, match="overrides"):
        HostConfig.load(tmp_path, bad)
