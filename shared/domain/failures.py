"""Why an order is in Error, as a (step, error code) pair operators can group by.

The state record keeps the last failure in words (`LastError`); its forms are fixed by the
state machine (shared/domain/machine/): `{step}: {code}: {message}` for an agent's
answer, `compensation of {step}: {code}: {message}` for a failed undo (an order held on
an answer refused for good adds `({operation} refused at {agent})`), and
`{what} not completed by {time}` when the Supervisor gave up on a complete-by, which is
the code `timeout`. A compensation's failure is named after its operation
(`refund-payment`), so an undo that fails is never mistaken for the step it undoes.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime
from typing import Final

from shared.domain.messages import iso
from shared.domain.model import Phase, StateRecord
from shared.domain.workflow import Workflow

TIMEOUT: Final = "timeout"
WAIT_EXPIRED: Final = "wait-expired"
"""An event step's complete-by passed with no event: its own code, not a timeout."""
UNKNOWN: Final = "unknown"
_TIMED_OUT = re.compile(r" not completed by (?P<complete_by>\S+)$")
_ANSWERED = re.compile(r"^(?:compensation of )?[^:]+: (?P<code>[^:\s]+): ")


@dataclass(frozen=True)
class Failure:
    step: str
    error_code: str


def failure_of(state: StateRecord, workflow: Workflow | None) -> Failure:
    """`workflow`: the one the order runs on (None when the catalogue lost it)."""
    return Failure(_step(state, workflow), _code(state.last_error or ""))


def timed_out(what: str, complete_by: datetime) -> str:
    """The words of a counted timeout (its history entry and `LastError`)."""
    return f"{what} not completed by {iso(complete_by)}"


def missed_complete_by(text: str) -> datetime | None:
    """The complete-by a counted timeout's words name; None for other words."""
    found = _TIMED_OUT.search(text)
    if found is None:
        return None
    try:
        return datetime.fromisoformat(found["complete_by"])
    except ValueError:
        return None


def _code(last_error: str) -> str:
    if _TIMED_OUT.search(last_error):
        return TIMEOUT
    answered = _ANSWERED.match(last_error)
    return answered["code"] if answered else UNKNOWN


def _step(state: StateRecord, workflow: Workflow | None) -> str:
    if workflow is None or not 0 <= state.current_step < len(workflow.steps):
        return str(state.current_step)
    definition = workflow.steps[state.current_step]
    if state.phase is Phase.COMPENSATE and definition.compensation:
        return definition.compensation
    return definition.name
