"""`AzureWebJobs.<name>.Disabled`: the host runs the other functions and not this one."""

from __future__ import annotations

import aiohttp
import pytest

from devhost.host import LocalHost, functions_of
from devhost.host.runtime import enabled
from tests.devhost.conftest import HostFactory, Recorder, build_app

pytestmark = pytest.mark.e2e


def test_disabled_by_either_spelling_and_only_when_true() -> None:
    specs = functions_of(build_app(Recorder()))
    names = {spec.name for spec in specs}
    assert {"get_item", "create_item", "tick", "consume"} <= names
    settings = {
        "AzureWebJobs.get_item.Disabled": "true",
        "AzureWebJobs_tick_Disabled": "1",
        "AzureWebJobs.create_item.Disabled": "false",
        "AzureWebJobs.consume.Disabled": "",
    }
    kept = {spec.name for spec in enabled(specs, settings)}
    assert kept == names - {"get_item", "tick"}


async def test_a_disabled_function_gets_no_request_and_no_listener(
    make_host: HostFactory,
) -> None:
    settings = {
        "AzureWebJobs.get_item.Disabled": "True",
        "AzureWebJobs.consume.Disabled": "true",
    }
    host: LocalHost = make_host(build_app(Recorder(), timer=False), settings)
    await host.start()
    assert host.queues == []
    assert [row.name for row in host.rows()].count("get_item") == 0
    async with aiohttp.ClientSession() as session:
        async with session.get(f"{host.api_url}/items/a") as response:
            assert response.status == 404
        async with session.post(f"{host.api_url}/items", json={"sku": "A-1"}) as response:
            assert response.status == 201
