"""Adding a step with its own agent is one catalogue edit: every derived artefact follows.

A copy of catalogue.json gains an agent `loyalty` and a retriable step `award-points` in
`express-delivery`; the queues, the Bicep's queues and app settings (evaluated with the
copy in place of catalogue.json), the emulator config and the local settings all pick it
up without another file changing, and so do the app's triggers (the app indexed with the
copy as its catalogue), the simulator's services and GET /api/workflows. docs/contract.md
is checked against the queues the catalogue derives by test_contract_doc.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from devhost.simulator.services import services_from
from shared.catalogue import FILE_SETTING, ROOT
from shared.catalogue.derive import all_queues, local_service_urls, service_url_settings
from shared.catalogue.emit import LOCAL_SETTINGS, emulator_config, local_settings
from shared.contract import agent_queue
from shared.domain.workflow import Catalogue
from shared.functions.workflows import workflows_view
from tests.app_functions import registered_functions
from tests.infra import catalogues
from tests.infra.bicep import Index, Ref
from tests.infra.deployment import deployed_app_settings, deployed_queues, load_json
from tests.workflows import CATALOGUE

AGENT, SETTING, STEP, WORKFLOW = "loyalty", "LoyaltyServiceUrl", "award-points", "express-delivery"
NEW_QUEUES = (agent_queue(AGENT), agent_queue(AGENT, high=True))


@pytest.fixture(scope="module")
def edited() -> dict[str, Any]:
    doc = catalogues.with_agent(catalogues.document(), AGENT, SETTING)
    return catalogues.with_retriable_step(doc, WORKFLOW, STEP, AGENT, ["pointsId"])


@pytest.fixture(scope="module")
def cat(edited: dict[str, Any]) -> Catalogue:
    return catalogues.build(edited)


def test_the_edited_catalogue_is_valid_and_has_the_step(cat: Catalogue) -> None:
    workflow = cat.get(WORKFLOW)
    assert workflow is not None
    assert AGENT in cat.agents
    assert [s.agent for s in workflow.steps if s.name == STEP] == [AGENT]


def test_the_queues_gain_the_agents_two_and_nothing_else(cat: Catalogue) -> None:
    before = all_queues(CATALOGUE)
    assert all_queues(cat) == (*before, *NEW_QUEUES)


def test_the_bicep_creates_the_new_queues(edited: dict[str, Any], cat: Catalogue) -> None:
    deployed = deployed_queues(edited)
    assert set(deployed) == set(all_queues(cat))
    assert deployed[NEW_QUEUES[0]] == deployed[agent_queue("inventory")], "same properties"
    assert set(deployed_queues()) == set(all_queues(CATALOGUE)), "the real file is unchanged"


def test_the_bicep_sets_the_new_agents_service_url(edited: dict[str, Any], cat: Catalogue) -> None:
    settings = deployed_app_settings(edited)
    assert settings[SETTING] == Index(Ref(("serviceUrls",)), SETTING)
    urls = {name for name, value in settings.items() if isinstance(value, Index)}
    assert urls == set(service_url_settings(cat))
    assert SETTING not in deployed_app_settings()


def test_the_emulator_config_declares_the_new_queues(cat: Catalogue) -> None:
    namespace = emulator_config(cat)["UserConfig"]["Namespaces"][0]
    assert [q["Name"] for q in namespace["Queues"]] == list(all_queues(cat))


def test_the_local_settings_point_the_new_agent_at_its_local_url(cat: Catalogue) -> None:
    values = local_settings(cat, load_json(LOCAL_SETTINGS))["Values"]
    assert values[SETTING] == "http://127.0.0.1:7072/loyalty" == local_service_urls(cat)[SETTING]
    current = load_json(LOCAL_SETTINGS)["Values"]
    assert {k: v for k, v in values.items() if k != SETTING} == current, "others unchanged"


def test_the_app_registers_the_new_agents_triggers_on_its_queues(
    edited: dict[str, Any], tmp_path: Path
) -> None:
    """The app as the Functions host indexes it, started with the copy as its catalogue."""
    path = tmp_path / "catalogue.json"
    path.write_text(json.dumps(edited), encoding="utf-8")
    listed = subprocess.run(
        [sys.executable, "-m", "shared.cli", "workflows", "functions", "--json"],
        env={**os.environ, FILE_SETTING: str(path)},
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
    )
    names = set(json.loads(listed.stdout)["functions"])
    assert {"loyalty_agent", "loyalty_agent_high"} <= names
    assert "loyalty_agent" not in {f.name for f in registered_functions()}


def test_the_simulator_serves_the_new_agent(cat: Catalogue) -> None:
    services = services_from(cat)
    assert set(services) == set(cat.agents)
    assert STEP in services[AGENT].operations


def test_the_workflows_route_shows_the_new_step(cat: Catalogue) -> None:
    flows = workflows_view(cat)["workflows"]
    (express,) = [w for w in flows if w["name"] == WORKFLOW]
    assert express["steps"][-1] == {
        "name": STEP,
        "agent": AGENT,
        "kind": "retriable",
        "undo": None,
        "inputs": [],
    }
