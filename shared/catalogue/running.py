"""The workflow an order runs on, as the catalogue this instance loaded has it."""

from __future__ import annotations

from shared.catalogue import catalogue
from shared.domain.machine.transition import InvalidTransition
from shared.domain.model import StateRecord
from shared.domain.workflow import Workflow


class UnknownWorkflow(InvalidTransition, LookupError):
    """The order pins a workflow version this catalogue no longer keeps: a refused move
    (409, skipped by a bulk job), never a crash: nothing can run the order here."""

    code = "version-gone"


def workflow_of(state: StateRecord) -> Workflow | None:
    return catalogue().get(state.workflow, state.workflow_version)


def pinned_workflow(state: StateRecord) -> Workflow:
    found = workflow_of(state)
    if found is None:
        raise UnknownWorkflow(
            f"order {state.order_id} runs on {state.workflow} v{state.workflow_version}, "
            "which the catalogue no longer keeps"
        )
    return found
