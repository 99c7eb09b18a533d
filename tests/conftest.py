"""Fixtures shared by every suite: the real Azurite, started once per session when needed."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, settings
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from devhost.harness.stack import lone_azurite, lone_azurite_blob
from shared.telemetry import setup
from tests import schedule

settings.register_profile("load-proof", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("load-proof")
"""Hypothesis's deadline and its too-slow check time each example: on a loaded 2-core
machine (a CI run, the flake finder's hog) they failed tests whose logic held. What a
test checks is its property; time is measured by bench/."""


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """On an xdist worker (bin/test), the heaviest files first (tests/schedule.py); every
    worker sorts the same collection the same way, as xdist requires. A run in one
    process keeps the collection order."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        weights = schedule.load_weights()
        items[:] = schedule.ordered(items, lambda item: item.nodeid.split("::")[0], weights)


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
