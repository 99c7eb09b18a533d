"""The catalogue's workflows as the API shows them (contract section 12)."""

from __future__ import annotations

from typing import Any

import azure.functions as func

from shared.contract import Route
from shared.domain.principal import Role
from shared.domain.workflow import Catalogue, StepDefinition, Workflow
from shared.functions import composition
from shared.functions.http import json_response
from shared.functions.signin import route_level

bp = func.Blueprint()


def workflow_view(workflow: Workflow, default: bool) -> dict[str, Any]:
    return {
        "name": workflow.name,
        "version": workflow.version,
        "default": default,
        "steps": [step_view(s) for s in workflow.steps],
    }


def step_view(step: StepDefinition) -> dict[str, Any]:
    view: dict[str, Any] = {
        "name": step.name,
        "agent": step.agent or None,
        "kind": step.kind.value,
        "undo": step.compensation,
        "inputs": list(step.inputs),
    }
    if step.event is not None:
        view["event"] = step.event
        view["approval"] = step.approval
    if step.waits:
        view["onDeadline"] = step.on_deadline.value
    if step.until is not None:
        view["until"] = step.until
    return view


def workflows_view(known: Catalogue) -> dict[str, Any]:
    """Every kept version, newest first within a name: new orders start on the newest,
    older ones stay while orders still run on them."""
    ordered = sorted(known.workflows, key=lambda w: (known.names.index(w.name), -w.version))
    newest = {w.name: w.version for w in known.latest()}
    return {
        "workflows": [
            workflow_view(w, w.name == known.default and newest[w.name] == w.version)
            for w in ordered
        ]
    }


@bp.route(route=Route.WORKFLOWS, methods=["GET"], auth_level=route_level())
async def workflows_http(req: func.HttpRequest) -> func.HttpResponse:
    h = await composition.workflows()
    actor = await h.gate.admit(req, Role.READ)
    if isinstance(actor, func.HttpResponse):
        return actor
    return json_response(workflows_view(h.catalogue))
