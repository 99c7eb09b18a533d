"""The files generated from the catalogue are committed as generated, and the derivations
follow the catalogue they are given.

A failure here means catalogue.json (or shared/contract.py QUEUE_PROPERTIES) changed and
the committed file did not: run the command the message names.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from shared.catalogue import ROOT
from shared.catalogue.derive import all_queues, local_service_urls
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
from shared.contract import CORE_QUEUES, agent_queue
from tests.infra import catalogues
from tests.workflows import CATALOGUE


@pytest.mark.parametrize(
    ("kind", "path"), [("emulator", EMULATOR_CONFIG), ("local-settings", LOCAL_SETTINGS)]
)
def test_committed_file_is_what_the_catalogue_generates(kind: str, path: Path) -> None:
    assert path.read_text(encoding="utf-8") == render(kind, CATALOGUE), (
        f"{path.name} is stale: python -m shared.catalogue.emit {kind} > {path.relative_to(ROOT)}"
    )


def test_the_queues_are_the_core_ones_then_each_agents_two() -> None:
    queues = all_queues(CATALOGUE)
    assert queues[: len(CORE_QUEUES)] == CORE_QUEUES
    assert agent_queue("notifications") in queues
    assert agent_queue("notifications", high=True) == "agent-notifications-high"
    assert len(set(queues)) == len(queues)


def test_the_emulator_config_fits_the_emulator_entity_limit() -> None:
    namespace = emulator_config(CATALOGUE)["UserConfig"]["Namespaces"][0]
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
    values = local_settings(CATALOGUE, current)["Values"]
    wanted = local_service_urls(CATALOGUE)
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
    assert json.loads(capsys.readouterr().out) == emulator_config(CATALOGUE)
