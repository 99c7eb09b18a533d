"""The workflow an order runs on, as a given catalogue has it.

The catalogue is handed in (the container's, or a test's own): nothing here reads a
file or keeps one.
"""

from __future__ import annotations

from shared.domain.machine.transition import InvalidTransition
from shared.domain.model import StateRecord
from shared.domain.workflow import Catalogue, Workflow


class UnknownWorkflow(InvalidTransition, LookupError):
    """The order pins a workflow version this catalogue no longer keeps: a refused move
    (409, skipped by a bulk job), never a crash: nothing can run the order here."""

    code = "version-gone"


def workflow_of(catalogue: Catalogue, state: StateRecord) -> Workflow | None:
    return catalogue.get(state.workflow, state.workflow_version)


def pinned_workflow(catalogue: Catalogue, state: StateRecord) -> Workflow:
    found = workflow_of(catalogue, state)
    if found is None:
        raise UnknownWorkflow(
            f"order {state.order_id} runs on {state.workflow} v{state.workflow_version}, "
            "which the catalogue no longer keeps"
        )
    return found
