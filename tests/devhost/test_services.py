"""Which services the settings call for, and the start/reuse/stop rules for children."""

from __future__ import annotations

import socket
import sys
from pathlib import Path

import pytest

from devhost.harness.ports import free_port, port_open
from devhost.services import (
    Services,
    ServiceSpec,
    ServiceStartError,
    broker_port,
    plan,
    telemetry_settings,
    wipe_state,
)

EMULATOR = "Endpoint=sb://localhost:5680;SharedAccessKeyName=k;SharedAccessKey=v;UseDevelopmentEmulator=true"

FAKE_SERVICE = """
import signal, socket, sys, time
sock = socket.socket()
sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
sock.bind(("127.0.0.1", int(sys.argv[1])))
sock.listen()
print("fake listening on", sys.argv[1])
if sys.argv[2] == "ignore-term":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
time.sleep(60)
"""


def fake_spec(port: int, *, mode: str = "normal", ready: str = "fake listening on") -> ServiceSpec:
    return ServiceSpec(
        name="fake",
        command=(sys.executable, "-c", FAKE_SERVICE, str(port), mode),
        ports=(port,),
        endpoint=f"tcp://127.0.0.1:{port}",
        ready_line=ready,
        startup_timeout=10,
    )


def test_plan_follows_the_settings(tmp_path: Path) -> None:
    settings = {
        "AzureWebJobsStorage": "UseDevelopmentStorage=true",
        "ServiceBusConnection": EMULATOR,
        "InventoryServiceUrl": "http://127.0.0.1:7080/inventory",
        "PaymentServiceUrl": "http://127.0.0.1:7080/payment",
    }
    specs = {spec.name: spec for spec in plan(settings, tmp_path, tmp_path / "state", "py")}
    assert set(specs) == {"azurite", "broker", "simulator"}
    azurite = specs["azurite"].command
    assert azurite[0] == str(tmp_path / "node_modules" / ".bin" / "azurite")
    where = azurite.index("--location")
    assert azurite[where + 1] == str(tmp_path / "state" / "azurite")
    assert "--silent" in azurite and "--loose" in azurite and "--skipApiVersionCheck" in azurite
    # Azurite otherwise reports every request to its makers' telemetry endpoint.
    assert "--disableTelemetry" in azurite
    assert specs["azurite"].ports == (10000, 10001, 10002)
    broker_db = str(tmp_path / "state" / "broker.sqlite3")
    assert specs["broker"].command == (
        "py", "-m", "devhost.broker", "--port", "5680", "--control-port", "7073", "--db", broker_db,
        "--log-level", "INFO",
    )  # fmt: skip
    assert specs["simulator"].ports == (7080,)


def test_plan_skips_remote_services(tmp_path: Path) -> None:
    settings = {
        "AzureWebJobsStorage": "DefaultEndpointsProtocol=https;AccountName=x;AccountKey=y",
        "ServiceBusConnection": "Endpoint=sb://prod.servicebus.windows.net/;SharedAccessKeyName=k;SharedAccessKey=v",
        "InventoryServiceUrl": "https://inventory.example.com",
    }
    assert plan(settings, tmp_path, tmp_path / "state") == []


def test_broker_port_defaults_to_5672() -> None:
    assert broker_port("Endpoint=sb://localhost;UseDevelopmentEmulator=true") == 5672
    assert broker_port("Endpoint=sb://localhost:5673;usedevelopmentemulator=TRUE") == 5673
    assert broker_port("Endpoint=sb://ns.servicebus.windows.net/;SharedAccessKey=x") is None


def test_starts_waits_for_ready_and_stops(tmp_path: Path) -> None:
    port = free_port()
    services = Services(tmp_path, tmp_path / "state")
    services.ensure(fake_spec(port))
    try:
        assert port_open(port)
        assert services.endpoints[0].status == "started"
        assert (tmp_path / "state" / "logs" / "fake.log").read_text().startswith("fake listening")
    finally:
        services.stop()
    assert services.children == []
    assert not port_open(port)


def test_child_ignoring_sigterm_is_killed(tmp_path: Path) -> None:
    port = free_port()
    services = Services(tmp_path, tmp_path / "state")
    services.ensure(fake_spec(port, mode="ignore-term"))
    child = services.children[0]
    services.stop(timeout=0.5)
    assert child.returncode is not None


def test_service_already_answering_is_left_alone(tmp_path: Path) -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        services = Services(tmp_path, tmp_path / "state")
        services.ensure(fake_spec(port))
        assert services.children == []
        assert services.endpoints[0].status == "already running"
        services.stop()
        assert port_open(port)


def test_child_dying_during_startup_reports_its_output(tmp_path: Path) -> None:
    spec = ServiceSpec(
        name="crashy",
        command=(sys.executable, "-c", "import sys; sys.exit('cannot open database: locked')"),
        ports=(free_port(),),
        endpoint="nowhere",
        ready_line="never",
    )
    services = Services(tmp_path, tmp_path / "state")
    with pytest.raises(
        ServiceStartError, match=r"crashy exited with code 1(.|\n)*database: locked"
    ):
        services.ensure(spec)
    services.stop()


def test_missing_azurite_says_run_npm_ci(tmp_path: Path) -> None:
    (spec,) = plan({"AzureWebJobsStorage": "UseDevelopmentStorage=true"}, tmp_path, tmp_path)
    if port_open(10000):
        pytest.skip("an Azurite is already running on this machine; it would be reused")
    with pytest.raises(ServiceStartError, match="run npm ci"):
        Services(tmp_path, tmp_path / "state").ensure(spec)


def test_fresh_removes_only_devhost_state(tmp_path: Path) -> None:
    (tmp_path / "azurite").mkdir()
    (tmp_path / "azurite" / "__azurite_db_table__.json").write_text("{}")
    names = ("broker.sqlite3", "broker.sqlite3-wal", "simulator.sqlite3", "traces.sqlite")
    for name in (*names, "notes.txt"):
        (tmp_path / name).write_text("x")
    wipe_state(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt"]


def test_a_local_run_sends_every_span_to_the_local_receiver(tmp_path: Path) -> None:
    telemetry = telemetry_settings({}, {}, 4400)
    assert telemetry == {
        "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4400",
        "OTEL_TRACES_SAMPLER": "always_on",
        "TraceQueryUrl": "http://127.0.0.1:4400/api/traces",
    }
    (spec,) = plan(telemetry, tmp_path, tmp_path / "state", "py")
    assert spec.name == "otlp" and spec.ports == (4400,)
    db = str(tmp_path / "state" / "traces.sqlite")
    assert spec.command == (
        "py", "-m", "devhost.otlp", "--port", "4400", "--db", db, "--log-level", "INFO",
    )  # fmt: skip


def test_what_the_user_set_wins_and_a_remote_endpoint_starts_no_receiver(tmp_path: Path) -> None:
    user = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://localhost:4500", "TraceQueryUrl": ""}
    from_env = {"OTEL_TRACES_SAMPLER": "parentbased_traceidratio"}
    telemetry = telemetry_settings(user, from_env, 4318)
    assert telemetry == {
        "OTEL_EXPORTER_OTLP_ENDPOINT": "http://localhost:4500",
        "OTEL_TRACES_SAMPLER": "parentbased_traceidratio",
        "TraceQueryUrl": "http://127.0.0.1:4500/api/traces",
    }
    remote = telemetry_settings({}, {"OTEL_EXPORTER_OTLP_ENDPOINT": "https://otel.example.com"})
    assert "TraceQueryUrl" not in remote
    assert plan(remote, tmp_path, tmp_path / "state") == []


def test_the_receiver_is_started_when_its_port_is_free_and_reused_when_it_answers(
    tmp_path: Path,
) -> None:
    port = free_port()
    (spec,) = plan(telemetry_settings({}, {}, port), tmp_path, tmp_path / "state")
    first = Services(tmp_path, tmp_path / "state")
    first.ensure(spec)
    try:
        assert first.endpoints[0].status == "started"
        assert (tmp_path / "state" / "traces.sqlite").exists()
        second = Services(tmp_path, tmp_path / "other")
        second.ensure(spec)
        assert second.children == []
        assert second.endpoints[0].status == "already running"
    finally:
        first.stop()
    assert not port_open(port)
