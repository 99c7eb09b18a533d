"""Adding a step with its own agent is one catalogue edit: every derived artefact follows.

A copy of catalogue.json gains an agent `loyalty` and a retriable step `award-points` in
`express-delivery`; the queues, the Bicep's queues and app settings (evaluated with the
copy in place of catalogue.json), the emulator config and the local settings all pick it
up without another file changing. (The function triggers are registered from the
catalogue by the app, and docs/contract.md is checked against ALL_QUEUES by
test_contract_doc.py: neither is generated from a copy here.)
"""

from __future__ import annotations

from typing import Any

import pytest

from shared.catalogue import catalogue
from shared.catalogue.derive import all_queues, local_service_urls, service_url_settings
from shared.catalogue.emit import LOCAL_SETTINGS, emulator_config, local_settings
from shared.contract import agent_queue
from shared.domain.workflow import Catalogue
from tests.infra import catalogues
from tests.infra.bicep import Index, Ref
from tests.infra.deployment import deployed_app_settings, deployed_queues, load_json

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
    before = all_queues(catalogue())
    assert all_queues(cat) == (*before, *NEW_QUEUES)


def test_the_bicep_creates_the_new_queues(edited: dict[str, Any], cat: Catalogue) -> None:
    deployed = deployed_queues(edited)
    assert set(deployed) == set(all_queues(cat))
    assert deployed[NEW_QUEUES[0]] == deployed[agent_queue("inventory")], "same properties"
    assert set(deployed_queues()) == set(all_queues(catalogue())), "the real file is unchanged"


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
