"""Where telemetry goes, decided once per process from the standard settings.

* `OTEL_SDK_DISABLED=true`: nothing at all (how the tracing overhead is measured).
* `APPLICATIONINSIGHTS_CONNECTION_STRING` set (Azure): the Azure Monitor distro, its
  ingestion authenticated with the app's managed identity (`AZURE_CLIENT_ID`, or the
  `ClientId` of `APPLICATIONINSIGHTS_AUTHENTICATION_STRING`); no key in code.
* else `OTEL_EXPORTER_OTLP_ENDPOINT` set: the SDK's batch span processor and periodic
  metric reader with the OTLP/HTTP exporters (the local receiver, any collector).
* else nothing: the OpenTelemetry API's no-op default.

Sampling is the SDK's, from `OTEL_TRACES_SAMPLER`/`OTEL_TRACES_SAMPLER_ARG`, wrapped so
that errors and orders in trouble are always kept (`sampling.py`).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum

from opentelemetry import metrics, trace
from opentelemetry.sdk.trace import TracerProvider

from shared.contract import TelemetrySetting
from shared.telemetry import logs
from shared.telemetry.logsafe import app_logger
from shared.telemetry.sampling import KeepMarked

log = app_logger("orders.telemetry")

DEFAULT_SERVICE_NAME = "orders"


class Export(StrEnum):
    OFF = "off"
    AZURE_MONITOR = "azure-monitor"
    OTLP = "otlp"


@dataclass(frozen=True)
class TelemetryConfig:
    export: Export
    service_name: str = DEFAULT_SERVICE_NAME
    connection_string: str | None = None
    client_id: str | None = None
    """The managed identity Application Insights ingestion authenticates with."""

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> TelemetryConfig:
        values = os.environ if env is None else env
        name = values.get(TelemetrySetting.SERVICE_NAME) or DEFAULT_SERVICE_NAME
        if values.get(TelemetrySetting.SDK_DISABLED, "").strip().lower() == "true":
            return cls(Export.OFF, name)
        connection = values.get(TelemetrySetting.APPLICATIONINSIGHTS_CONNECTION_STRING)
        if connection:
            return cls(Export.AZURE_MONITOR, name, connection, _client_id(values))
        if values.get(TelemetrySetting.OTLP_ENDPOINT):
            return cls(Export.OTLP, name)
        return cls(Export.OFF, name)


def _client_id(values: Mapping[str, str]) -> str | None:
    """The identity to ingest with: AZURE_CLIENT_ID, else the ClientId the Functions
    host's own ingestion uses (`ClientId=<id>;Authorization=AAD`)."""
    if client_id := values.get(TelemetrySetting.AZURE_CLIENT_ID):
        return client_id
    auth = values.get(TelemetrySetting.APPLICATIONINSIGHTS_AUTHENTICATION_STRING, "")
    parts = dict(p.split("=", 1) for p in auth.split(";") if "=" in p)
    return parts.get("ClientId") or None


_lock = threading.Lock()
_configured: TelemetryConfig | None = None
_tracing = False
_test_provider: TracerProvider | None = None


def tracing() -> bool:
    """Whether spans are recorded: the wrappers are installed only then."""
    return _tracing


def configured() -> bool:
    return _configured is not None


def configure(config: TelemetryConfig | None = None) -> bool:
    """Install the providers once per process; later calls change nothing. Returns
    whether tracing is on."""
    global _configured, _tracing
    with _lock:
        if _configured is not None:
            return _tracing
        config = config or TelemetryConfig.from_env()
        if config.export is Export.AZURE_MONITOR:
            _azure_monitor(config)
        elif config.export is Export.OTLP:
            _otlp(config)
        if config.export is not Export.OFF:
            _keep_marked_spans()
            logs.install()
            log.info("telemetry: %s export, service %s", config.export, config.service_name)
        _configured, _tracing = config, config.export is not Export.OFF
        return _tracing


def use_provider(provider: TracerProvider) -> None:
    """Tests: record into `provider` (an in-memory exporter) from now on, every wrapper
    on, as if configured. The global provider can be set once per process only."""
    global _configured, _tracing, _test_provider
    provider.sampler = KeepMarked(provider.sampler)
    _test_provider = provider
    logs.install()
    _configured, _tracing = TelemetryConfig(Export.OTLP), True


def forget() -> None:
    """Tests: back to unconfigured (the providers set stay set)."""
    global _configured, _tracing, _test_provider
    _test_provider = None
    _configured, _tracing = None, False


def test_provider() -> TracerProvider | None:
    """The provider `use_provider` set for tests; None: the global one."""
    return _test_provider


def _resource(config: TelemetryConfig) -> object:
    from opentelemetry.sdk.resources import SERVICE_NAME, Resource  # noqa: PLC0415

    return Resource.create({SERVICE_NAME: config.service_name})


def _azure_monitor(config: TelemetryConfig) -> None:
    from azure.identity import ManagedIdentityCredential  # noqa: PLC0415
    from azure.monitor.opentelemetry import configure_azure_monitor  # noqa: PLC0415

    credential = ManagedIdentityCredential(client_id=config.client_id) if config.client_id else None
    configure_azure_monitor(
        connection_string=config.connection_string,
        credential=credential,
        resource=_resource(config),
        logger_name="orders",
        # The ports are traced here (ports.py); the SDKs' own spans would double them.
        disable_azure_core_tracing=True,
    )


def _otlp(config: TelemetryConfig) -> None:
    from opentelemetry.exporter.otlp.proto.http.metric_exporter import (  # noqa: PLC0415
        OTLPMetricExporter,
    )
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import (  # noqa: PLC0415
        OTLPSpanExporter,
    )
    from opentelemetry.sdk.metrics import MeterProvider  # noqa: PLC0415
    from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader  # noqa: PLC0415
    from opentelemetry.sdk.resources import Resource  # noqa: PLC0415
    from opentelemetry.sdk.trace.export import BatchSpanProcessor  # noqa: PLC0415

    resource = _resource(config)
    assert isinstance(resource, Resource)
    provider = TracerProvider(resource=resource)  # the sampler from OTEL_TRACES_SAMPLER
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    trace.set_tracer_provider(provider)
    reader = PeriodicExportingMetricReader(OTLPMetricExporter())
    metrics.set_meter_provider(MeterProvider(resource=resource, metric_readers=[reader]))


def _keep_marked_spans() -> None:
    """Wrap whichever sampler the provider chose (the distro's too) before any tracer
    is created: tracers copy the provider's sampler when they are made."""
    provider = trace.get_tracer_provider()
    if isinstance(provider, TracerProvider) and not isinstance(provider.sampler, KeepMarked):
        provider.sampler = KeepMarked(provider.sampler)
