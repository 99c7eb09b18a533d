"""The files generated from the catalogue are committed as generated, and the derivations
follow the catalogue they are given.

A failure here means catalogue.json (or shared/contract.py QUEUE_PROPERTIES) changed and
the committed file did not: run the command the message names.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from shared.catalogue import ROOT, catalogue
from shared.catalogue.derive import all_queues, local_service_urls, service_url_settings
from shared.catalogue.emit import (
    EMULATOR_CONFIG,
    EMULATOR_MAX_ENTITIES,
    LOCAL_SETTINGS,
    emulator_config,
    iso_duration,
    local_settings,
    main,
    render,
)
from shared.contract import ALL_QUEUES, CORE_QUEUES, agent_queue
from shared.contract import service_url_settings as contract_service_url_settings
from tests.infra import catalogues


@pytest.mark.parametrize(
    ("kind", "path"), [("emulator", EMULATOR_CONFIG), ("local-settings", LOCAL_SETTINGS)]
)
def test_committed_file_is_what_the_catalogue_generates(kind: str, path: Path) -> None:
    assert path.read_text(encoding="utf-8") == render(kind, catalogue()), (
        f"{path.name} is stale: python -m shared.catalogue.emit {kind} > {path.relative_to(ROOT)}"
    )


def test_contract_queues_and_settings_are_the_catalogue_derivations() -> None:
    assert all_queues(catalogue()) == ALL_QUEUES
    assert ALL_QUEUES[: len(CORE_QUEUES)] == CORE_QUEUES
    assert service_url_settings(catalogue()) == contract_service_url_settings()
    assert agent_queue("notifications") in ALL_QUEUES
    assert agent_queue("notifications", high=True) == "agent-notifications-high"
    assert len(set(ALL_QUEUES)) == len(ALL_QUEUES)


def test_the_emulator_config_fits_the_emulator_entity_limit() -> None:
    namespace = emulator_config(catalogue())["UserConfig"]["Namespaces"][0]
    assert len(namespace["Queues"]) + len(namespace["Topics"]) <= EMULATOR_MAX_ENTITIES


def test_a_catalogue_too_big_for_the_emulator_is_refused() -> None:
    doc = catalogues.document()
    for i in range(30):
        doc = catalogues.with_agent(doc, f"extra{i}", f"Extra{i}ServiceUrl")
    with pytest.raises(ValueError, match="at most 50"):
        emulator_config(catalogues.build(doc))


def test_local_settings_keep_other_settings_and_drop_stale_agent_urls() -> None:
    current = {
        "IsEncrypted": False,
        "Values": {
            "A": "1",
            "InventoryServiceUrl": "http://elsewhere/inventory",
            "RetiredServiceUrl": "http://127.0.0.1:7072/retired",
            "B": "2",
        },
    }
    values = local_settings(catalogue(), current)["Values"]
    wanted = local_service_urls(catalogue())
    assert list(values) == ["A", *wanted, "B"]
    assert values["InventoryServiceUrl"] == wanted["InventoryServiceUrl"]
    assert "RetiredServiceUrl" not in values


def test_iso_durations() -> None:
    assert [iso_duration(s) for s in (60, 300, 3600, 90, 5)] == [
        "PT1M",
        "PT5M",
        "PT1H",
        "PT1M30S",
        "PT5S",
    ]
    with pytest.raises(ValueError):
        iso_duration(0)


def test_the_command_writes_the_generated_file(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["emulator"]) == 0
    assert json.loads(capsys.readouterr().out) == emulator_config(catalogue())
