"""Reconciliation, the pure half: what an order at rest says each remote service did,
and whether the services' own answers for the keys agree.

A finished order is a claim about the world: `Processed` says every step's effect is
in force at exactly one provider, the one the order holds the step at (`agent`);
`Compensated` and `Cancelled` say none is left in force anywhere (each one that took
effect was undone). Asking the providers about the keys checks that claim after the
fact, when a lost reply, a request that applied after the order moved it elsewhere, an
operator's hand edit or a bug could have made the two disagree.

An order held at rest (`Error`, `Suspended`) may wait days for an operator, so it is
checked too, for the steps it is done with (`_expect`): a completed one in force at its
holder only, a compensated one nowhere. A request that reached a provider after the
order had moved the step elsewhere (docs/in-doubt.md, the residual risk) leaves an
effect there that nothing the order will still do takes back: a cancel undoes the step
at its holder only. What the order still owns (its current step, a step it may retry)
is left to it, but for the providers at which the order settled its key as not applied
(its holder, when so, and every provider it moved the step away from): an effect there
is a request that applied after its live time, which nothing the order knows of will
take back. It is alerted, never undone: a resubmit may still send the key there and
take that effect as the step's (`Expect.NOT_APPLIED`).

A step is asked about at every provider it may have reached: the one holding it, then
each other agent a do of it was sent to (`StepRecord.tried`), but for agents that share
the holder's key space (`retry_elsewhere`), which hold one effect between them. The keys
are the same at every provider (`idempotency_key`: order and operation, whatever the
attempt or agent; the step's current round). Each earlier round of a step whose key the
order moved after a refusal for good is a check of its own (`Expect.EARLIER`), at every
provider tried: a refusal is one provider's word, and a request of that round settled
not applied elsewhere only by time may have applied there late. At most two questions
per provider and round, but in one case three (the last item):

- The holder, `Processed`: the do-key. Applied is a match; not applied or never seen
  is an effect missing.
- The holder, `Compensated`, `Cancelled`: the undo key first (applied: undone, one
  question), otherwise the do-key: not applied or never seen is a match, applied is an
  effect still in force.
- Any other provider: the do-key first (not applied or never seen: nothing there, one
  question), then the undo key: applied is a match (undone there), not applied or never
  seen leaves the effect in force there. In a `Processed` order whose holder has it too,
  that is an effect at two providers (`applied-at-two-providers`); in a finished order
  with nothing in force it is an effect still applied.
- An undo key that applied but *found nothing to undo* (its do was not applied there
  yet: a request held on the network that applied after the undo, docs/in-doubt.md)
  undid nothing: the do-key is asked, and when it is applied, the heal key
  (`heal_key`): undone there is a match, anything else leaves the effect in force. That
  is the one case a provider is asked three questions.

An effect in force where the order says none should be is undone there (`heals`): the
provider applied the do and no undo, so the undo, naming that do, is what the order's
own compensation would have sent. Where the order's undo key is spent (it found nothing
to undo), a second undo with it would be answered from its record, nothing again: the
heal goes under a key of its own (`heal_key`), one per order and undo, so every run's
resend is the same request and the provider never undoes the effect twice. An effect
at another provider while the holder has none is left alone: undoing it would leave the
order's effect nowhere.

A step never dispatched (no agent) or without an undo (in a compensated order) asks
nothing. Any other answer (in progress, no answer) is unknown, never a mismatch: a
reconciliation that guessed would page an operator, or undo an effect, for a network
blip.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from datetime import datetime
from enum import StrEnum

from shared.domain.in_doubt import RemoteOutcome, RemoteOutcomeKind
from shared.domain.machine.dispatch import HEAL, heal_key, round_heal_key, undo_at
from shared.domain.machine.forward import APPLIED_AFTER_SETTLED
from shared.domain.machine.settle import key_state
from shared.domain.machine.transition import ProcessPolicy
from shared.domain.messages import OperatorAlert, do_key, idempotency_key, undo_key
from shared.domain.model import KeyState, OrderProcess, Outgoing, Phase, ProcessState, StepStatus
from shared.domain.workflow import StepDefinition, Workflow

FINISHED = (ProcessState.PROCESSED, ProcessState.COMPENSATED, ProcessState.CANCELLED)
"""The states whose claim about the world no later step changes."""
HELD = (ProcessState.ERROR, ProcessState.SUSPENDED)
"""At rest until an operator moves them on, which may take days: checked for the steps
they are done with, never for one they still own."""
CHECKED = (*FINISHED, *HELD)
"""The states reconciliation samples: every state at rest."""

MISMATCH_REASON = "reconciliation-mismatch"
"""The operator alert's reason, but for an effect at two providers."""
TWO_PROVIDERS_REASON = "applied-at-two-providers"
"""The reason a late success reply raises too (machine/forward.py): the same finding."""
SETTLED_REASON = APPLIED_AFTER_SETTLED
"""The reason the Scheduler raises for a late success of a key it settled as not applied:
the same finding, made by asking."""

MAX_QUESTIONS_PER_PROVIDER = 3
"""Per check and provider asked: a step costs at most this times its providers, and its
rounds (two, but where the undo found nothing to undo and the do applied after it: then
the heal key)."""

Answers = Mapping[tuple[str, str], RemoteOutcome]
"""What each provider said of each key, by (agent, key)."""


class Expect(StrEnum):
    APPLIED = "applied"
    """The step's effect is in force at its holder (`Processed`)."""
    UNDONE = "not applied, or undone"
    """No effect left (`Compensated`, `Cancelled`)."""
    NOT_APPLIED = "not applied, as the order settled it"
    """The step a held order still owns, at each provider where it settled the key as
    not applied: the do-key only is asked; an effect there is alerted, never undone."""
    EARLIER = "not applied: a key the order moved on from"
    """An earlier round of the step's do key (the order sent the step again under a fresh
    key after a refusal for good), at every provider the step was sent to: the order
    owns no effect of it anywhere, so one in force is undone there, under that round's
    own key (`round_heal_key`), or alerted where nothing undoes it."""


class Verdict(StrEnum):
    MATCH = "match"
    MISMATCH = "mismatch"
    UNKNOWN = "unknown"


class _Held(StrEnum):
    """What one provider's answers say of the step's effect there."""

    IN_FORCE = "in force"
    NONE = "none"
    UNKNOWN = "unknown"


@dataclass(frozen=True)
class StepCheck:
    """What one step of a finished order should look like at each provider it reached."""

    order_id: str
    state: ProcessState
    step: str
    agent: str
    """The provider the order holds the step at (its compensation went there too)."""
    do_key: str
    undo_key: str | None
    expect: Expect
    others: tuple[str, ...] = ()
    """The other providers a do of the step was sent to, first first."""
    holder_asked: bool = True
    """False for a step the order still owns whose key its holder has not settled: the
    order's own retry or cancel answers for it there."""
    key_round: int | None = None
    """The round of the step's do key asked about when it is an earlier one
    (`Expect.EARLIER`); None for the current round."""

    @property
    def providers(self) -> tuple[str, ...]:
        return (self.agent, *self.others) if self.holder_asked else self.others

    @property
    def heal_key(self) -> str | None:
        return None if self.undo_key is None else heal_key(self.undo_key)


@dataclass(frozen=True)
class Mismatch:
    order_id: str
    state: ProcessState
    step: str
    agent: str
    """The provider whose answers disagree with the order."""
    key: str
    expected: str
    found: str
    reason: str = MISMATCH_REASON

    @property
    def message(self) -> str:
        return (
            f"{self.state.value} order {self.order_id}: {self.step} at {self.agent}: "
            f"key {self.key} {self.found}, expected {self.expected}"
        )

    def alert(self, failure_count: int, at: datetime) -> Outgoing:
        """One alert per order, provider and key while the broker's duplicate window
        lasts, so two runs (or two instances) finding the same mismatch page once."""
        alert = OperatorAlert(
            order_id=self.order_id,
            reason=self.reason,
            failure_count=failure_count,
            last_error=self.message,
            at=at,
        )
        return alert.outgoing(f"reconcile:{self.agent}:{self.key}")


def checks(process: OrderProcess, workflow: Workflow) -> tuple[StepCheck, ...]:
    """The steps of an order at rest worth asking about; none for any other state."""
    state = process.state.process_state
    found: list[StepCheck] = []
    for index, (step, definition) in enumerate(zip(process.steps, workflow.steps, strict=False)):
        expect = _expect(process, index)
        if expect is None or step.agent is None:
            continue
        undo = definition.compensation
        others = _other_key_spaces(step.tried, step.agent, definition)
        if expect is not Expect.UNDONE or undo is not None:
            check = StepCheck(
                order_id=process.order_id,
                state=state,
                step=step.name,
                agent=step.agent,
                do_key=do_key(process.order_id, definition.name, step),
                undo_key=None if undo is None else undo_key(process.order_id, undo, step),
                expect=expect,
                others=others,
                holder_asked=expect is not Expect.NOT_APPLIED
                or key_state(step) is KeyState.NOT_APPLIED,
            )
            if check.providers:
                found.append(check)
        found.extend(
            StepCheck(
                order_id=process.order_id,
                state=state,
                step=step.name,
                agent=step.agent,
                do_key=idempotency_key(process.order_id, definition.name, earlier),
                undo_key=None if undo is None else round_heal_key(process.order_id, undo, earlier),
                expect=Expect.EARLIER,
                others=others,
                key_round=earlier,
            )
            for earlier in range(step.do_round)
        )
    return tuple(found)


def _expect(process: OrderProcess, index: int) -> Expect | None:
    """What the order claims of the step at `index`, or None when it claims nothing yet.

    A held order (Error, Suspended) claims what a finished one would, for each step it
    is done with: completed, in force at its holder only; compensated, in force nowhere.
    Any other step is still the order's: a resubmit retries a failed one (maybe with the
    same key at a provider it tried), a cancel waits for or undoes one in doubt. So is
    the current step of an order held while undoing: the undo it awaits there would be
    answered by an undo reconciliation sent (the reply names the step and the attempt).
    Of those, only the providers where the order settled the key as not applied are
    asked (`Expect.NOT_APPLIED`): a step the order skipped as not applied while undoing
    is one of them."""
    state = process.state
    if state.process_state is ProcessState.PROCESSED:
        return Expect.APPLIED
    if state.process_state in FINISHED:
        return Expect.UNDONE
    if state.process_state not in HELD:
        return None
    status = process.steps[index].status
    if index != state.current_step and status is StepStatus.COMPLETED:
        return Expect.APPLIED
    if index != state.current_step and status is StepStatus.COMPENSATED:
        return Expect.UNDONE
    return Expect.NOT_APPLIED


def _other_key_spaces(
    tried: tuple[str, ...], holder: str, definition: StepDefinition
) -> tuple[str, ...]:
    """The agents a do of the step went to whose keys are not the holder's: none when the
    candidates share one key space (`retry_elsewhere`, two regions of one provider),
    where every region answers for the one key, and a second region saying "applied" is
    the same effect, not a second one to undo."""
    if definition.retry_elsewhere and holder in definition.candidates:
        return tuple(a for a in tried if a != holder and a not in definition.candidates)
    return tuple(a for a in tried if a != holder)


def next_question(check: StepCheck, answers: Answers) -> tuple[str, str] | None:
    """The next (agent, key) to ask about, or None once the answers settle the step."""
    for agent in check.providers:
        key = _next_at(check, agent, answers)
        if key is not None:
            return agent, key
    return None


def _next_at(check: StepCheck, agent: str, answers: Answers) -> str | None:
    """The holder is asked first what it most likely says (applied, or undone); another
    provider most likely never saw the key, so its do-key comes first."""
    do, undo = answers.get((agent, check.do_key)), _undo(check, agent, answers)
    if check.expect is Expect.NOT_APPLIED or (
        agent == check.agent and check.expect is Expect.APPLIED
    ):
        return check.do_key if do is None else None
    holder_undone = agent == check.agent and check.expect is Expect.UNDONE
    if holder_undone and check.undo_key is not None and undo is None:
        return check.undo_key
    if _undid(undo):
        return None
    if do is None:
        return check.do_key
    if do.kind is not RemoteOutcomeKind.APPLIED or check.undo_key is None:
        return None
    if undo is None:
        return check.undo_key
    if undo.found_nothing_to_undo and _heal(check, agent, answers) is None:
        return check.heal_key
    return None


def _undo(check: StepCheck, agent: str, answers: Answers) -> RemoteOutcome | None:
    return answers.get((agent, check.undo_key)) if check.undo_key else None


def _heal(check: StepCheck, agent: str, answers: Answers) -> RemoteOutcome | None:
    return answers.get((agent, check.heal_key)) if check.heal_key else None


def _undid(outcome: RemoteOutcome | None) -> bool:
    """An undo key applied against its do applied there: that do's effect is gone."""
    return (
        outcome is not None
        and outcome.kind is RemoteOutcomeKind.APPLIED
        and not outcome.found_nothing_to_undo
    )


def _none(outcome: RemoteOutcome) -> bool:
    """The key took no effect there and never will: abandoned counts, as it is what a
    provider the order moved away from usually says."""
    return outcome.safe_to_move or outcome.kind is RemoteOutcomeKind.ABANDONED


def _held(check: StepCheck, agent: str, answers: Answers) -> _Held:
    """Judged by net effect: a do applied and undone there is no effect there."""
    do, undo = answers.get((agent, check.do_key)), _undo(check, agent, answers)
    if _undid(undo):
        return _Held.NONE
    if do is None:
        return _Held.UNKNOWN
    if _none(do):
        return _Held.NONE
    if do.kind is not RemoteOutcomeKind.APPLIED:
        return _Held.UNKNOWN
    # The holder of a Processed order is asked its do-key only: applied is what it
    # almost always says, and a second question per step would double the usual cost.
    undo_asked = check.expect is not Expect.NOT_APPLIED and not (
        agent == check.agent and check.expect is Expect.APPLIED
    )
    if check.undo_key is None or not undo_asked or (undo is not None and _none(undo)):
        return _Held.IN_FORCE
    if undo is not None and undo.found_nothing_to_undo:
        # The do applied after its undo found nothing: only the heal key can undo it.
        heal = _heal(check, agent, answers)
        if _undid(heal):
            return _Held.NONE
        if heal is not None and (_none(heal) or heal.found_nothing_to_undo):
            return _Held.IN_FORCE
    return _Held.UNKNOWN


def verdict(check: StepCheck, answers: Answers) -> Verdict:
    """Mismatch when any provider disagrees; else unknown when any could not tell."""
    if mismatches(check, answers):
        return Verdict.MISMATCH
    if any(_settled(check, agent, answers) is None for agent in check.providers):
        return Verdict.UNKNOWN
    return Verdict.MATCH


def _settled(check: StepCheck, agent: str, answers: Answers) -> bool | None:
    """Does this provider agree with the order? None when it cannot tell, and for another
    provider of a `Processed` order that has the effect when the holder cannot tell:
    one effect is then not told from two."""
    held = _held(check, agent, answers)
    if held is _Held.UNKNOWN:
        return None
    if check.expect is not Expect.APPLIED:
        return held is _Held.NONE
    if agent == check.agent:
        return held is _Held.IN_FORCE
    if held is _Held.NONE:
        return True
    return None if _held(check, check.agent, answers) is _Held.UNKNOWN else False


def mismatches(check: StepCheck, answers: Answers) -> tuple[Mismatch, ...]:
    """Each provider's disagreement, worded for the operator."""
    return tuple(
        _mismatch(check, agent, answers)
        for agent in check.providers
        if _settled(check, agent, answers) is False
    )


def _mismatch(check: StepCheck, agent: str, answers: Answers) -> Mismatch:
    do, undo = answers[(agent, check.do_key)], _undo(check, agent, answers)
    reason, expected = MISMATCH_REASON, check.expect.value
    if _held(check, agent, answers) is _Held.NONE:
        found = _said(do)
    else:
        found = "applied" + (f", its undo key {check.undo_key} {_said(undo)}" if undo else "")
        heal = _heal(check, agent, answers)
        if heal is not None:
            found += f", its heal key {check.heal_key} {_said(heal)}"
    if agent != check.agent and check.expect is Expect.APPLIED:
        expected = f"applied at {check.agent} only"
        if _held(check, check.agent, answers) is _Held.IN_FORCE:
            reason = TWO_PROVIDERS_REASON
            found += ", undoing it there" if check.undo_key else ", and nothing undoes it"
        else:
            found += f", while {check.agent} has none: left for an operator"
    elif check.expect is Expect.UNDONE:
        found += ", undoing it there"
    elif check.expect is Expect.EARLIER:
        found += ", undoing it there" if check.undo_key else ", and nothing undoes it"
    elif check.expect is Expect.NOT_APPLIED:
        reason = SETTLED_REASON
        found += ": the order may still take it as the step's, so it is left for an operator"
    return Mismatch(
        order_id=check.order_id,
        state=check.state,
        step=check.step,
        agent=agent,
        key=check.do_key,
        expected=expected,
        found=found,
        reason=reason,
    )


def heals(
    process: OrderProcess,
    workflow: Workflow,
    policy: ProcessPolicy,
    check: StepCheck,
    answers: Answers,
    now: datetime,
) -> tuple[Outgoing, ...]:
    """The undo, at each provider where the step's effect is in force and should not be:
    any, in an order that undid its steps; another than the holder, in a `Processed`
    order whose holder has it too. Each undoes only what that provider applied and
    nothing undid (the undo names the do), so sending it again, by another run, is
    answered from the undo key's record. Where the order's undo key found nothing to
    undo there (the do applied after it), the undo goes under the heal key."""
    index = workflow.index_of(check.step)
    if index is None or check.undo_key is None:
        return ()
    definition = workflow.steps[index]
    earlier = "" if check.key_round is None else f":{HEAL}-r{check.key_round + 1}"
    return tuple(
        # Its own message id: the order's compensation of the step may have gone out in
        # the same attempt, and the broker would drop this as its duplicate; an earlier
        # round's names the round, as the current one's may go to the same provider.
        replace(
            undo_at(
                process,
                definition,
                policy,
                m.agent,
                max(process.state.attempt, 1),  # 0 only by a hand edit: a poison request
                answers[(m.agent, check.do_key)].result,
                now,
                key=_heal_key_at(check, m.agent, answers),
                do_round=check.key_round,
            ),
            message_id=f"reconcile-undo:{check.order_id}:{check.step}:{m.agent}{earlier}",
        )
        for m in mismatches(check, answers)
        if m.reason == TWO_PROVIDERS_REASON
        or check.expect is Expect.UNDONE
        or (check.expect is Expect.EARLIER and not _awaits_undo(process, index, m.agent))
    )


def _awaits_undo(process: OrderProcess, index: int, agent: str) -> bool:
    """Would an undo's reply from `agent` at the order's attempt be taken for the undo
    the order awaits there (a Suspended order held while undoing this step at its
    holder)? Then an earlier round's effect is alerted and left for the next run."""
    state = process.state
    if state.process_state not in HELD or state.phase is not Phase.COMPENSATE:
        return False
    return state.current_step == index and agent == process.steps[index].agent


def _heal_key_at(check: StepCheck, agent: str, answers: Answers) -> str | None:
    """The heal key where the order's undo key is spent at `agent`, else None (the
    order's own undo key)."""
    undo = _undo(check, agent, answers)
    return check.heal_key if undo is not None and undo.found_nothing_to_undo else None


def _said(outcome: RemoteOutcome) -> str:
    if outcome.found_nothing_to_undo:
        return "found nothing to undo"
    if outcome.kind is RemoteOutcomeKind.NEVER_SEEN:
        return "never seen"
    if outcome.kind is RemoteOutcomeKind.NOT_APPLIED:
        return "not applied"
    return outcome.kind.value


@dataclass(frozen=True)
class ReconcileRun:
    """One reconciliation run, kept so the operator page can show the last few."""

    instance: str
    started_at: datetime
    finished_at: datetime
    orders: int
    """Orders at rest in the sample (finished, or held in Error or Suspended), each
    checked."""
    queries: int
    """Outcome queries sent (at most orders x steps x providers x 3, usually x 1)."""
    unknown: int
    """Step checks left unknown: no answer, or a call still running."""
    mismatches: tuple[Mismatch, ...]
