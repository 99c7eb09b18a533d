"""A late success of an earlier round of a step's key (docs/in-doubt.md, "An operation
refused for good"), driven through the real transitions.

The sequence needs three things together: a step that may go to another provider, a
provider without `abandon`, and a refusal for good. The step's first request to
`notifications` is held on the network past its live time; the Supervisor hears "never
seen" and settles the key not applied there; the retry goes to `notifications-backup`
under the same key, which refuses it for good; the order is held, the operator mends
the backup and resubmits, and the step goes under its next round
(`o-1:notify-customer:r2`), back to `notifications`, where it applies. Then the first
request arrives and applies too: two notifications in force at one provider, under two
keys. Nothing the order sent names the first key again, and reconciliation used to ask
the current round only.

A step held on a refused do is retriable or past the pivot, and neither has an undo in a
catalogue that loads (shared/catalogue/load.py), so the product's answer is an alert and
the order held for an operator where it is not at rest. The domain takes any workflow,
and where the step has an undo, the effect is undone where it landed, under a key of
that round (`dispatch.round_heal_key`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta

from devhost.simulator.judge import LedgerEntry, OrderToJudge, Problem, Step, judge
from shared.domain import reconcile as rules
from shared.domain.destination import Destination
from shared.domain.in_doubt import NEVER_SEEN, RemoteOutcome
from shared.domain.machine.forward import apply_reply, claim, start
from shared.domain.machine.operator import resubmit
from shared.domain.machine.recovery import recover
from shared.domain.machine.transition import Transition
from shared.domain.messages import AgentReply
from shared.domain.model import (
    Action,
    ErrorInfo,
    KeyState,
    OrderProcess,
    Outcome,
    Outgoing,
    ProcessState,
    StepStatus,
)
from shared.domain.routing import AgentView, Availability, Routing
from shared.domain.workflow import StepDefinition, StepKind, Workflow
from tests.builders import a_policy, an_order

PRIMARY, BACKUP = "notifications", "notifications-backup"
ROUTING = Routing(
    views={a: AgentView(a, Availability.HEALTHY, "healthy") for a in (PRIMARY, BACKUP)}
)
POLICY = a_policy()
T0 = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)
PAST_LIVE_TIME = timedelta(seconds=36)
"""The step timeout (30 s) and the clock-skew margin (5 s), and a second."""
FIRST, SECOND = "o-1:notify-customer", "o-1:notify-customer:r2"


def notify_workflow(undo: str | None = None) -> Workflow:
    """One retriable step at a provider with an alternative; `undo` gives it an undo,
    which a catalogue that loads refuses on a retriable step but the domain must take."""
    step = StepDefinition(
        name="notify-customer",
        agent=PRIMARY,
        compensation=undo,
        alternatives=(BACKUP,),
        kind=StepKind.RETRIABLE,
    )
    return Workflow(name="notify", steps=(step,))


@dataclass
class Story:
    workflow: Workflow
    process: OrderProcess
    now: datetime
    outgoing: list[Outgoing]

    def state(self) -> ProcessState:
        return self.process.state.process_state

    def take(self, change: Transition | None) -> Transition | None:
        if change is not None:
            self.process = change.process
            self.outgoing.extend(change.outgoing)
        return change

    def claim(self) -> Outgoing:
        self.take(claim(self.process, self.workflow, POLICY, "s-1", self.now, routing=ROUTING))
        (request,) = self.requests()
        return request

    def requests(self) -> list[Outgoing]:
        found = [m for m in self.outgoing if "step" in m.body and "action" in m.body]
        self.outgoing = [m for m in self.outgoing if m not in found]
        return found

    def alerts(self) -> list[str]:
        operators = Destination.to_operators()
        return [str(m.body["reason"]) for m in self.outgoing if m.destination == operators]

    def reply(
        self, request: Outgoing, agent: str, error: ErrorInfo | None = None
    ) -> Transition | None:
        body = request.body
        answer = AgentReply(
            order_id=body["orderId"],
            step=body["step"],
            action=Action(body["action"]),
            attempt=body["attempt"],
            outcome=Outcome.FAILED if error else Outcome.SUCCEEDED,
            result=None if error else {"ref": body["idempotencyKey"]},
            error=error,
            agent=agent,
        )
        return self.take(
            apply_reply(self.process, self.workflow, POLICY, answer, self.now, routing=ROUTING)
        )


def lost_then_refused_then_resubmitted(
    workflow: Workflow,
) -> tuple[Story, Outgoing, Outgoing]:
    """The story up to the order Processed under the second round at `notifications`;
    returns it, the first request, still on the network, and the second round's."""
    story = Story(workflow, start(an_order("o-1"), workflow, T0).process, T0, [])
    first = story.claim()
    assert (first.destination.agent, first.body["idempotencyKey"]) == (PRIMARY, FIRST)
    story.now += PAST_LIVE_TIME
    story.take(
        recover(story.process, workflow, POLICY, story.now, outcome=NEVER_SEEN, routing=ROUTING)
    )
    retry = story.claim()
    assert (retry.destination.agent, retry.body["idempotencyKey"]) == (BACKUP, FIRST)
    story.reply(retry, BACKUP, ErrorInfo("rejected", "account closed"))
    assert story.state() is ProcessState.ERROR
    story.take(resubmit(story.process, POLICY, story.now, "op", workflow=workflow))
    again = story.claim()
    assert (again.destination.agent, again.body["idempotencyKey"]) == (PRIMARY, SECOND)
    story.reply(again, PRIMARY)
    assert story.state() is ProcessState.PROCESSED
    story.outgoing.clear()
    return story, first, again


def test_a_late_success_of_the_first_round_at_the_holder_is_alerted() -> None:
    """Before the fix the success was taken for the step's own (same agent, same key
    space, step Completed) and dropped: two effects in force at `notifications`."""
    story, first, _ = lost_then_refused_then_resubmitted(notify_workflow())

    change = story.reply(first, PRIMARY)

    assert change is not None, "a second effect in force, dropped as a duplicate"
    assert story.alerts() == ["applied-after-settled"]
    process = story.process
    assert process.state.process_state is ProcessState.PROCESSED
    step = process.steps[0]
    assert (step.status, step.agent, step.do_round) == (StepStatus.COMPLETED, PRIMARY, 1)
    assert FIRST in (process.state.last_error or "")
    assert story.requests() == [], "nothing undoes a retriable step"


def test_a_late_success_of_the_first_round_is_undone_there_under_that_rounds_key() -> None:
    story, first, _ = lost_then_refused_then_resubmitted(notify_workflow(undo="retract-notice"))

    story.reply(first, PRIMARY)

    (undo,) = story.requests()
    assert undo.destination.agent == PRIMARY
    body = undo.body
    assert (body["action"], body["undoes"]) == ("compensate", FIRST)
    assert body["idempotencyKey"] == "o-1:retract-notice:heal-r1"
    assert body["idempotencyKey"] != "o-1:retract-notice", "the order's own undo key spent"
    assert story.alerts() == ["applied-after-settled"]


def test_a_late_success_of_the_first_round_while_the_second_runs_holds_the_order() -> None:
    """Nothing can take a retriable step's extra effect back: an order still moving is
    held for an operator, as for an extra effect at another provider."""
    workflow = notify_workflow()
    story = Story(workflow, start(an_order("o-1"), workflow, T0).process, T0, [])
    first = story.claim()
    story.now += PAST_LIVE_TIME
    story.take(
        recover(story.process, workflow, POLICY, story.now, outcome=NEVER_SEEN, routing=ROUTING)
    )
    retry = story.claim()
    story.reply(retry, BACKUP, ErrorInfo("rejected", "account closed"))
    story.take(resubmit(story.process, POLICY, story.now, "op", workflow=workflow))
    story.claim()
    story.outgoing.clear()

    story.reply(first, PRIMARY)

    assert story.process.state.process_state is ProcessState.ERROR
    assert story.alerts() == ["applied-after-settled"]


def test_a_late_refusal_of_the_first_round_is_not_the_second_rounds_answer() -> None:
    """The second round timed out at `notifications` and waits for its retry there; the
    first request, arriving at last, is refused. That refusal says nothing about the
    second key (it may still apply), so it must not hold the order as refused, which
    would settle the second key not applied and move the key once more."""
    workflow = notify_workflow()
    story = Story(workflow, start(an_order("o-1"), workflow, T0).process, T0, [])
    first = story.claim()
    story.now += PAST_LIVE_TIME
    story.take(
        recover(story.process, workflow, POLICY, story.now, outcome=NEVER_SEEN, routing=ROUTING)
    )
    retry = story.claim()
    story.reply(retry, BACKUP, ErrorInfo("rejected", "account closed"))
    story.take(resubmit(story.process, POLICY, story.now, "op", workflow=workflow))
    story.claim()
    story.now += timedelta(seconds=31)
    story.take(recover(story.process, workflow, POLICY, story.now, routing=ROUTING))
    assert story.process.state.process_state is ProcessState.PENDING

    story.reply(first, PRIMARY, ErrorInfo("rejected", "account closed"))

    step = story.process.steps[0]
    assert (story.process.state.process_state, step.refused) == (ProcessState.PENDING, None)
    assert step.key_state is KeyState.UNSETTLED


def ask(
    checks: tuple[rules.StepCheck, ...], world: Mapping[tuple[str, str], RemoteOutcome]
) -> list[rules.Mismatch]:
    found: list[rules.Mismatch] = []
    for check in checks:
        answers: dict[tuple[str, str], RemoteOutcome] = {}
        while (asked := rules.next_question(check, answers)) is not None:
            answers[asked] = world.get(asked, NEVER_SEEN)
        found.extend(rules.mismatches(check, answers))
    return found


APPLIED = RemoteOutcome.applied({"ref": "x"})


def test_reconciliation_asks_every_round_at_every_provider_it_tried() -> None:
    """The first round's reply never came: only reconciliation can see the effect."""
    story, _, _ = lost_then_refused_then_resubmitted(notify_workflow())
    checks = rules.checks(story.process, story.workflow)
    asked = {(a, c.do_key) for c in checks for a in c.providers}
    assert {(PRIMARY, FIRST), (BACKUP, FIRST), (PRIMARY, SECOND), (BACKUP, SECOND)} <= asked

    clean = ask(checks, {(PRIMARY, SECOND): APPLIED})
    assert clean == []
    (found,) = ask(checks, {(PRIMARY, SECOND): APPLIED, (PRIMARY, FIRST): APPLIED})
    assert (found.agent, found.key) == (PRIMARY, FIRST)
    assert "nothing undoes it" in found.found


def test_reconciliation_undoes_an_earlier_rounds_effect_under_that_rounds_key() -> None:
    story, _, _ = lost_then_refused_then_resubmitted(notify_workflow(undo="retract-notice"))
    world = {(PRIMARY, SECOND): APPLIED, (PRIMARY, FIRST): APPLIED}
    undos: list[Outgoing] = []
    for check in rules.checks(story.process, story.workflow):
        answers: dict[tuple[str, str], RemoteOutcome] = {}
        while (asked := rules.next_question(check, answers)) is not None:
            answers[asked] = world.get(asked, NEVER_SEEN)
        undos.extend(rules.heals(story.process, story.workflow, POLICY, check, answers, T0))
    (undo,) = undos
    assert undo.destination.agent == PRIMARY
    assert (undo.body["undoes"], undo.body["idempotencyKey"]) == (
        FIRST,
        "o-1:retract-notice:heal-r1",
    )


def test_an_order_rekeyed_before_rounds_were_dated_keeps_todays_reading() -> None:
    """A step stored with a later round and no `rekeyed_at` (written before the field):
    which round an earlier attempt carried is not known, so a success is read as the
    current round's, as before."""
    story, first, _ = lost_then_refused_then_resubmitted(notify_workflow())
    steps = (replace(story.process.steps[0], rekeyed_at=()),)
    story.process = replace(story.process, steps=steps)

    assert story.reply(first, PRIMARY) is None


def ledger_of(*applied: Outgoing) -> list[LedgerEntry]:
    """What the providers record for requests that applied, in that order, as the
    simulator's ledger says it (an undo undoes its do where that do applied)."""
    entries: list[LedgerEntry] = []
    for n, request in enumerate(applied):
        body = request.body
        undoes = body.get("undoes")
        undone = None
        if undoes is not None:
            undone = any(e.idempotency_key == undoes and e.applied for e in entries)
        entries.append(
            LedgerEntry(
                service=str(request.destination.agent),
                operation=str(body["operation"]),
                order_id=str(body["orderId"]),
                idempotency_key=str(body["idempotencyKey"]),
                applied=True,
                applied_at=T0 + timedelta(seconds=n),
                undoes=None if undoes is None else str(undoes),
                undone=undone,
            )
        )
    return entries


def test_as_a_provider_sees_it_the_earlier_rounds_effect_is_undone() -> None:
    """The simulator's net-effect judge over what the providers recorded: the first
    key and `:r2` applied at `notifications` is a step in force twice; the undo the
    Scheduler sends for the first key takes it back to once."""
    story, first, again = lost_then_refused_then_resubmitted(notify_workflow("retract-notice"))
    steps = [Step("notify-customer", "retract-notice")]
    processed = [OrderToJudge("o-1", "Processed")]

    before = judge(ledger_of(again, first), processed, steps)
    assert [v.problem for v in before.violations] == [Problem.IN_FORCE_TWICE]

    story.reply(first, PRIMARY)
    (undo,) = story.requests()
    after = judge(ledger_of(again, first, undo), processed, steps)
    assert after.passed, [str(v) for v in after.violations]
