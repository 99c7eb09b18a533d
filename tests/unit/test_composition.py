"""What the composition root hands the blueprints: handlers built from the container the
running loop has, and the catalogue that container was built with."""

from __future__ import annotations

from collections.abc import Iterator
from typing import cast

import pytest

from shared import bootstrap
from shared.adapters.clock import FakeClock
from shared.adapters.memory.store import InMemoryBus, InMemoryStateStore
from shared.functions import composition
from shared.ports import RemoteService
from shared.settings import Settings
from tests.unit.test_bootstrap import LOCAL
from tests.workflows import CATALOGUE, without


def a_container(settings: Settings) -> bootstrap.Container:
    remotes = {name: cast(RemoteService, object()) for name in settings.catalogue.agents}
    return bootstrap.compose(settings, InMemoryStateStore(), InMemoryBus(), remotes, FakeClock())


@pytest.fixture(autouse=True)
def no_container() -> Iterator[None]:
    bootstrap.reset()
    yield
    bootstrap.reset()


async def test_a_handler_is_built_from_the_container_installed_at_the_call() -> None:
    first = a_container(Settings.from_env(LOCAL, catalogue=CATALOGUE))
    bootstrap.use(first)
    assert (await composition.scheduling()).process is first.process
    second = a_container(Settings.from_env(LOCAL, catalogue=CATALOGUE))
    bootstrap.use(second)
    assert (await composition.scheduling()).process is second.process


async def test_every_handler_gets_the_catalogue_its_container_was_built_with() -> None:
    dropped = without("express-delivery")
    bootstrap.use(a_container(Settings.from_env(LOCAL, catalogue=dropped)))
    assert (await composition.workflows()).catalogue is dropped
    assert (await composition.intake()).catalogue is dropped
    assert (await composition.intake()).process.catalogue is dropped
    assert (await composition.agent_work()).deps("payment").catalogue is dropped
    bulk = (await composition.bulk()).deps
    assert bulk is not None and bulk.process.catalogue is dropped


async def test_the_supervisor_is_handed_the_outage_its_bus_reports_to() -> None:
    container = a_container(Settings.from_env(LOCAL, catalogue=CATALOGUE))
    bootstrap.use(container)
    assert (await composition.supervising()).outage is container.outage
