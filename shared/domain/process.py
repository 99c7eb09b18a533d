"""The order process state machine: pure functions from (process, event, now) to a Transition.

Every function either returns the next process plus the messages to send and the history
to append, or None when the event is stale or does not apply: a lost race, a late reply
from an older attempt, a duplicate. None is normal control flow, never an error.

The rules live in shared/domain/machine/, one module per concern: forward (submission,
claim, answers), dispatch (the moves every rule ends with), settle (when a step may be
undone or moved: the rule that keeps money from being left behind), recovery (the
Supervisor's moves), operator (cancel, suspend, resume, resubmit), waits (approvals,
events, timers), migrate (an order moved to another version of its workflow) and
heartbeat.
"""

from __future__ import annotations

from shared.domain.machine.dispatch import DRAIN_RECHECK
from shared.domain.machine.events import (
    InvalidEventData,
    NoApprovalWaiting,
    NotAnApproval,
    NotAwaited,
    TooManyEvents,
    answer_approval,
    receive_event,
)
from shared.domain.machine.forward import apply_reply, claim, start, start_claimed
from shared.domain.machine.heartbeat import extend_complete_by
from shared.domain.machine.hold import hold_complete_by
from shared.domain.machine.migrate import IncompatibleVersions, incompatibility, migrate
from shared.domain.machine.operator import PastPivot, cancel, resubmit, resume, suspend
from shared.domain.machine.recovery import (
    exhaustion_undoes,
    next_check,
    next_deadline,
    recover,
    undelivered,
    version_gone,
)
from shared.domain.machine.transition import InvalidTransition, ProcessPolicy, Transition
from shared.domain.machine.waits import wake

__all__ = [
    "DRAIN_RECHECK",
    "IncompatibleVersions",
    "InvalidEventData",
    "InvalidTransition",
    "NoApprovalWaiting",
    "NotAnApproval",
    "NotAwaited",
    "PastPivot",
    "ProcessPolicy",
    "TooManyEvents",
    "Transition",
    "answer_approval",
    "apply_reply",
    "cancel",
    "claim",
    "exhaustion_undoes",
    "extend_complete_by",
    "hold_complete_by",
    "incompatibility",
    "migrate",
    "next_check",
    "next_deadline",
    "receive_event",
    "recover",
    "resubmit",
    "resume",
    "start",
    "start_claimed",
    "suspend",
    "undelivered",
    "version_gone",
    "wake",
]
