"""The shipped catalogue as the tests name it."""

from __future__ import annotations

import dataclasses

import pytest

import shared.catalogue
from shared.catalogue import catalogue
from shared.domain.workflow import Workflow

CATALOGUE = catalogue()
AGENTS = CATALOGUE.agents


def _workflow(name: str, version: int) -> Workflow:
    found = CATALOGUE.get(name, version)
    assert found is not None, f"the catalogue lost {name} v{version}"
    return found


ORDER_FULFILMENT = _workflow("order-fulfilment", 1)
EXPRESS_DELIVERY = _workflow("express-delivery", 1)
WORKFLOWS = {ORDER_FULFILMENT.name: ORDER_FULFILMENT, EXPRESS_DELIVERY.name: EXPRESS_DELIVERY}
AgentName = str


def run_on(monkeypatch: pytest.MonkeyPatch, *workflows: Workflow) -> None:
    """The app runs a catalogue whose named workflows are these (same name and version
    replaced, new ones added) for the rest of the test."""
    kept = [
        w
        for w in CATALOGUE.workflows
        if (w.name, w.version) not in {(n.name, n.version) for n in workflows}
    ]
    changed = dataclasses.replace(CATALOGUE, workflows=(*kept, *workflows))
    monkeypatch.setattr(shared.catalogue, "_loaded", changed)


REVIEWED_ORDER = _workflow("reviewed-order", 1)
SCHEDULED_DELIVERY = _workflow("scheduled-delivery", 1)
