"""The shipped catalogue as the tests name it."""

from __future__ import annotations

import dataclasses

from shared.catalogue import catalogue_file, load
from shared.catalogue.derive import all_queues, service_url_settings
from shared.contract import agent_queue
from shared.domain.workflow import Catalogue, Workflow

CATALOGUE = load(catalogue_file())
AGENTS = CATALOGUE.agents
ALL_QUEUES = all_queues(CATALOGUE)
"""Every queue the app uses with the shipped catalogue: the core ones, then each agent's two."""
AGENT_QUEUES = tuple(agent_queue(name) for name in AGENTS)
"""The agents' normal lanes."""
SERVICE_URL_SETTINGS = service_url_settings(CATALOGUE)


def _workflow(name: str, version: int) -> Workflow:
    found = CATALOGUE.get(name, version)
    assert found is not None, f"the catalogue lost {name} v{version}"
    return found


ORDER_FULFILMENT = _workflow("order-fulfilment", 1)
EXPRESS_DELIVERY = _workflow("express-delivery", 1)
WORKFLOWS = {ORDER_FULFILMENT.name: ORDER_FULFILMENT, EXPRESS_DELIVERY.name: EXPRESS_DELIVERY}
AgentName = str


def running(*workflows: Workflow) -> Catalogue:
    """The shipped catalogue with these workflows (same name and version replaced, new
    ones added), for a test to hand the app in its place."""
    kept = [
        w
        for w in CATALOGUE.workflows
        if (w.name, w.version) not in {(n.name, n.version) for n in workflows}
    ]
    return dataclasses.replace(CATALOGUE, workflows=(*kept, *workflows))


def without(name: str) -> Catalogue:
    """The shipped catalogue once it has dropped every version of workflow `name`."""
    return dataclasses.replace(
        CATALOGUE, workflows=tuple(w for w in CATALOGUE.workflows if w.name != name)
    )


REVIEWED_ORDER = _workflow("reviewed-order", 1)
SCHEDULED_DELIVERY = _workflow("scheduled-delivery", 1)
