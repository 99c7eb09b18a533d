"""Fixtures shared by every suite: the real Azurite, started once per session when needed."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from devhost.harness.stack import lone_azurite, lone_azurite_blob
from shared.telemetry import setup


@pytest.fixture(scope="session")
def azurite_table_port() -> Iterator[int]:
    with lone_azurite() as port:
        yield port


@pytest.fixture(scope="session")
def azurite_blob_port() -> Iterator[int]:
    """Azurite's blob service, for the order archive: started only by the tests that ask."""
    with lone_azurite_blob() as port:
        yield port


@pytest.fixture
def exporter() -> Iterator[InMemorySpanExporter]:
    """Every span recorded in memory, the ports traced as when telemetry is on."""
    recorded = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(recorded))
    setup.use_provider(provider)
    yield recorded
    setup.forget()
