"""What must hold in every reachable state of tests/model/world.py, named before the code.

1. undo-while-live: no undo request is sent while a do request of that step may still
   apply at the undo's service (its window open, its key not settled there). Undone
   earlier, the undo finds nothing to undo, and the do applies after it: an effect left
   in force. A do live at another key space is no such hazard: the undo names its own
   service's do (a late success undone at the provider the order left, while the retry
   runs at the other).
2. second-provider: no do goes to a second service while the step's do at another is
   live and unsettled, or in force there: the step would take effect twice.
3. watched: an order that is not held or finished has a next check, and the watch
   entry the store holds (as the real writes leave it, not the row's view of it) is due
   no later than that: its deadline, or the ask-at of a step in doubt; an order promoted
   in its customer's line, the promotion's check.
4. net-effect: once the order is final and no request sent for it can apply any more,
   the services agree with it: Processed has each step in force at exactly one service;
   Compensated and Cancelled have nothing in force anywhere. A late apply whose success
   reply reached the Scheduler counts too: the order knew of it, so the order heals it
   (machine/forward.py `_late_do`), not reconciliation's sample.
5. pointless-undo: no undo is sent for a do its service has, for good, told the order
   it never applied (a failure reply, or a sweep's answer once no request of the key was
   inside its window, which is what the order can know: a "not applied" inside the
   window may precede the request's arrival). It is recorded as "nothing-to-undo" and
   settles the undo's key, so it can never undo that do later.
6. healed: a request that applied after its live time (a service without abandon) is
   healed once the order is quiet: an order held for an operator with an effect its
   record does not account for has alerted the operator since the late apply. A late
   apply is outside what the order can know, so 2, and 4 until its reply comes, leave
   its effect to this, and to liveness, which must reach a right end (reconciliation
   undoes it).
7. told-late: when the Scheduler takes the success reply of a late apply whose effect
   is in force where the order does not hold the step (another provider, a key it
   settled as not applied, or a step it compensated: the undo found nothing and the do
   applied after it), and the order is not held, it sends the undo there at once
   (machine/forward.py `_undo_extra`): it knows of the effect, so it is not left to
   reconciliation's sample.
8. neighbour: nothing this order sends names another order's key, and the neighbour's
   effects at the shared services stay in force: keys never collide.
9. archived-id: once the order is archived its id stays taken (the intake never
   creates a new order under it) and none of its keys is sent again.
9. intake-resend: an order claimed at intake whose intake died before its sends is
   not counted a timeout for the request it never sent: the Supervisor's check sends
   the outbox of an order still as the intake stored it before it decides anything.
10. final-only: a client that asked for the final status only hears exactly one, and
   only once the order is at that final state.
11. one-id-one-message: the broker's duplicate detection drops only a message sent
   again, never another message that shares its id on its queue (a request or reply the
   order waits for would be lost without a trace).
12. refused-held: when the Scheduler takes a service's refusal for good of an operation
   the saga counts on (a retriable step's do, an undo: `Bounds.refusals`), the order is
   held at once: Error, with an alert (`retriable-step-failed`, `compensation-failed`)
   whose words name the step, the operation, the provider and the reason, nothing sent
   in that transition (no money moves, no other step, no undo past the pivot), and a do
   refused stays forward, so a resubmit sends it again. Never Processing, Pending or
   Compensating waiting for an answer that will not change. A Suspended order keeps the
   refusal for its resume; a do refused while a cancel runs is the cancel's to undo.

Liveness (every state can still reach a right end) is checked apart, on whole
situations: tests/model/liveness.py.

Key spaces: two agents sharing one (`retryElsewhere`) are one ledger, so "in force at
exactly one service" counts key spaces.
"""

from __future__ import annotations

from collections.abc import Hashable

from shared.domain.model import FINAL_NOTIFICATIONS, Notify, Phase, ProcessState, StepRecord
from tests.model import driver
from tests.model.explorer import Invariant
from tests.model.provider import KeyStatus
from tests.model.wire import first_round
from tests.model.world import World


def undo_while_live(world: World) -> str | None:
    for undo in world.just_sent:
        if not undo.undo:
            continue
        for sent in world.sent:
            do = sent.request
            if do.undo or do.step != undo.step or not world.live(do.agent, do.key):
                continue
            if world.space(do.agent) != world.space(undo.agent):
                continue  # the undo names its own service's do: another's cannot meet it
            status = world.provider.get(world.space(do.agent), do.key).status.value
            return (
                f"undo {undo.describe()} sent at t={world.now} while the do "
                f"{do.describe()} can still apply until t={sent.live_until} "
                f"(its service: {status})"
            )
    return None


def second_provider(world: World) -> str | None:
    for do in world.just_sent:
        if do.undo:
            continue
        for sent in world.sent:
            other = sent.request
            if other.undo or other.step != do.step:
                continue
            if world.space(other.agent) == world.space(do.agent):
                continue
            if world.live(other.agent, other.key):
                return (
                    f"do {do.describe()} sent at t={world.now} while {other.describe()} "
                    f"can still apply until t={sent.live_until}"
                )
        for step in world.domain.steps:
            if step.name != do.step or step.do_key is None:
                continue
            for space in _spaces(world, step):
                late = (space, step.do_key) in world.late_applied
                if late or space == world.space(do.agent):
                    continue
                if world.provider.in_force(space, step.do_key):
                    return f"do {do.describe()} sent at t={world.now}: in force at {space}"
    return None


def _spaces(world: World, step: driver.Step) -> tuple[str, ...]:
    return tuple(dict.fromkeys(world.space(a) for a in step.agents))


def in_force(world: World, step: driver.Step) -> list[str]:
    """The key spaces where the step's do is in force, one entry per round of its key in
    force there: two rounds applied at one space are two effects."""
    return [space for space, _ in effects(world, step)]


def effects(world: World, step: driver.Step) -> list[tuple[str, str]]:
    """Each (key space, key) where a round of the step's do key is in force."""
    if step.do_key is None:
        return []
    return [
        (space, key)
        for space in _spaces(world, step)
        for key in world.provider.rounds_in_force(space, step.do_key)
    ]


def current_key(do_key: str, record: StepRecord) -> str:
    """The round of the step's do key the order holds (`messages.idempotency_key`)."""
    return first_round(do_key) if not record.do_round else f"{do_key}:r{record.do_round + 1}"


def watched(world: World) -> str | None:
    process = world.process
    if not world.domain.watched(process, world.now):
        return f"not watched at t={world.now}: {driver.describe(process)}"
    if process.state.process_state.is_at_rest or world.deciding:
        return None  # held or finished; or not yet stored
    if world.watch is None:
        return f"off the watch list at t={world.now}: {driver.describe(process)}"
    due = _due_by(world)
    if due is None or world.watch <= due:
        return None
    return f"watched at t={world.watch}, after its check at t={due}: {driver.describe(process)}"


def _due_by(world: World) -> int | None:
    """The latest the order's watch entry may say: its deadline (or, its step in doubt,
    the moment the Supervisor may ask about it); an order still in its customer's line
    once promoted and not yet taken from it, the promotion's check (its nudge may be
    lost). None: any entry."""
    process = world.process
    domain = world.domain
    if driver.in_line(process):
        if not world.promoting or world.promoted_at is None:
            return None  # its turn has not come (its hold), or it was taken from the line
        return world.promoted_at + driver.RECHECK
    deadline = driver.deadline(process, domain.policy)
    asked = domain.question(process, world.drained)
    if deadline is not None and asked is not None:
        deadline = max(deadline, asked.ask_at)
    return deadline


def wrong_effects(world: World) -> list[str]:
    """What the services hold that a finished order says they do not."""
    return [words for _, words in _wrong(world)]


def _wrong(world: World) -> list[tuple[driver.Step, str]]:
    outcome = driver.finished(world.process)
    wrong = []
    for step in world.domain.steps:
        if step.do_key is None:
            continue
        where = in_force(world, step)
        if outcome == "processed" and len(where) != 1:
            wrong.append((step, f"{step.name} in force at {where or 'no service'}"))
        if outcome == "undone" and where:
            wrong.append((step, f"{step.name} still in force at {where}"))
    return wrong


def beyond_undo(world: World) -> bool:
    """Is every wrong effect of a finished order one of a step with no undo (a retriable
    step, a pivot), left by a request that applied after its live time, with an operator
    alerted since? Nothing can take it back: the alert is the product's whole answer
    (docs/in-doubt.md)."""
    wrong = _wrong(world)
    return (
        bool(wrong)
        and bool(world.late_applied)
        and bool(world.alerted)
        and all(step.undo_key is None for step, _ in wrong)
    )


def net_effect(world: World) -> str | None:
    if driver.finished(world.process) is None or not world.quiet():
        return None
    if world.late_applied - world.late_told:
        return None  # an effect the order cannot know of: healed and liveness judge it
    wrong = wrong_effects(world)
    if not wrong or beyond_undo(world):
        return None
    if world.late_applied and _reconciliation(world, alert=False):
        return None  # the Scheduler's undo of a late success is not awaited: see below
    state = world.process.state.process_state.value
    return f"{state} but {'; '.join(wrong)} ({world.provider.describe()})"


def pointless_undo(world: World) -> str | None:
    for undo in world.just_sent:
        told = (world.space(undo.agent), undo.undoes)
        if undo.undo and told in world.told_not_applied:
            return f"undo {undo.describe()} sent for a do {undo.agent} said it never applied"
    return None


IN_DOUBT = ("unsettled", "expired")
"""Key states of a step the order still holds in doubt at its agent, whatever the step's
status: a resubmit sends the same key there (a move needs a settled key), a cancel
undoes it there."""


def unaccounted(world: World) -> list[str]:
    """Effects in force that the order's record does not hold: a step in force where
    the order does not hold it done or in doubt (running at that agent, or waiting to be
    sent there again with its key unsettled or expired: a resubmit asks there, a cancel
    undoes it there), or at another key space."""
    found = []
    for step, record in zip(world.domain.steps, world.process.steps, strict=False):
        key = record.key_state.value
        doubted = key in IN_DOUBT and record.status.value != "Compensated"
        held = record.status.value in ("Completed", "Running") or doubted
        held = held and record.agent is not None and key != "not-applied"
        holder = world.space(record.agent) if held and record.agent else None
        own = None if step.do_key is None else current_key(step.do_key, record)
        extra = [s for s, k in effects(world, step) if (s, k) != (holder, own)]
        if extra:
            found.append(f"{step.name} in force at {extra}")
    return found


def _reconciliation(world: World, *, alert: bool) -> bool:
    """Does a reconciliation run over the order as it is now alert an operator (`alert`),
    or send an undo? The product samples every order at rest, held ones included, each
    hour: what such a run finds is healed by the product, whether or not the bound
    explores the run. A late success's undo the Scheduler sent (`_undo_extra`) is not
    awaited, so a lost one is left to this too."""
    if not driver.at_rest(world.process):
        return False
    run = world.domain.reconcile(world.process, world.now, world.asked)
    return run is not None and bool(run.alerts if alert else run.requests)


def healed(world: World) -> str | None:
    if not world.late_applied or not world.quiet() or not driver.held(world.process):
        return None
    if world.replies:
        return None  # the order hears of it first: told-late judges what it does then
    extra = unaccounted(world)
    if not extra or world.alerted or _reconciliation(world, alert=True):
        return None
    return (
        f"held after a late apply with {'; '.join(extra)} and no alert since "
        f"({world.provider.describe()})"
    )


def told_late(world: World) -> str | None:
    for space, key in world.just_told:
        first = first_round(key)
        index, step = next((i, s) for i, s in enumerate(world.domain.steps) if s.do_key == first)
        record = world.process.steps[index]
        ours = record.agent is not None and world.space(record.agent) == space
        ours = ours and key == current_key(first, record)
        if (
            ours
            and record.key_state.value != "not-applied"
            and record.status.value != "Compensated"
        ):
            continue  # the order holds the key there (done, running, or a retry pinned to it)
        if not world.provider.key_in_force(space, key) or driver.held(world.process):
            continue
        if step.undo_key is None and world.just_alerted:
            continue  # nothing undoes it: alerted, in that transition
        undone = any(
            r.undo and r.undoes == key and world.space(r.agent) == space for r in world.just_sent
        )
        if not undone:
            return (
                f"the Scheduler took {step.name}@{space}'s late success, in force where the "
                f"order does not hold it, and sent no undo there ({world.provider.describe()})"
            )
    return None


def neighbour(world: World) -> str | None:
    own = f"{driver.ORDER.order_id}:"
    for request in world.just_sent:
        if not all(k.startswith(own) for k in (request.key, request.undoes or own)):
            return f"{request.describe()} names another order's key"
    if not world.domain.neighbour or driver.finished(world.process) is None:
        return None
    for space, key in world.domain.neighbour:
        entry = world.provider.get(space, key)
        if entry.status is not KeyStatus.NEVER_SEEN and not world.provider.in_force(space, key):
            return f"the neighbour's {key} at {space} is no longer in force"
    return None


def archived_id(world: World) -> str | None:
    if world.reused:
        return "the intake created a new order under the archived order's id"
    if world.archived and world.just_sent:
        return f"{world.just_sent[0].describe()} sent after the order was archived"
    return None


def intake_resend(world: World) -> str | None:
    return world.flaw


FINAL = frozenset(s.value for s in FINAL_NOTIFICATIONS)


def final_only(world: World) -> str | None:
    if world.process.order.notify is not Notify.FINAL:
        return None
    state = world.process.state.process_state.value
    for status in world.heard:
        if status not in FINAL:
            return f"a final-only client heard {status}"
    if len(world.heard) > 1:
        return f"a final-only client heard {', '.join(world.heard)}"
    if world.heard and world.heard[0] != state:
        return f"a final-only client heard {world.heard[0]} while the order is {state}"
    if driver.finished(world.process) is not None and not world.heard:
        return f"the order is {state} and its final-only client heard nothing"
    return None


def one_id_one_message(world: World) -> str | None:
    return world.collision


HELD_ON = {False: ("retriable-step-failed", "failed-past-pivot"), True: ("compensation-failed",)}
"""The alerts an order held on a refusal for good raises: a do's, an undo's."""


def refused_held(world: World) -> str | None:
    refusal = world.just_refused
    if refusal is None or (refusal.cancelling and not refusal.undo):
        return None
    what = f"{refusal.operation}@{refusal.agent} refused for good"
    if world.just_sent:
        return f"{what}, and {world.just_sent[0].describe()} sent in the same transition"
    state = world.process.state
    if state.process_state is ProcessState.SUSPENDED:
        return None
    if not driver.held(world.process):
        return f"{what}, and the order is {driver.describe(world.process)}: not held"
    if not refusal.undo and state.phase is not Phase.FORWARD:
        return f"{what}, and the order was turned to compensate: {driver.describe(world.process)}"
    named = (refusal.step, refusal.operation, refusal.agent, "declined")
    for reason, words in world.just_alerted:
        if reason in HELD_ON[refusal.undo] and all(n in words for n in named):
            return None
    return f"{what}, held without an alert naming {', '.join(named)}: {world.just_alerted}"


def drained(world: World) -> str | None:
    """A drained agent gets no new dispatch (docs/contract.md, the drain route): its
    steps go to an alternative or wait Pending; only undos still go to the agent that did
    the step."""
    for request in world.just_sent:
        if not request.undo and request.agent in world.drained:
            return f"{request.describe()} dispatched to {request.agent}, which is drained"
    return None


INVARIANTS: tuple[Invariant[World], ...] = (
    Invariant("undo-while-live", undo_while_live),
    Invariant("second-provider", second_provider),
    Invariant("watched", watched),
    Invariant("net-effect", net_effect),
    Invariant("pointless-undo", pointless_undo),
    Invariant("healed", healed),
    Invariant("told-late", told_late),
    Invariant("neighbour", neighbour),
    Invariant("archived-id", archived_id),
    Invariant("intake-resend", intake_resend),
    Invariant("final-only", final_only),
    Invariant("one-id-one-message", one_id_one_message),
    Invariant("refused-held", refused_held),
    Invariant("drained", drained),
)

_ROUTINE = ("claim", "deliver", "arrive", "serve", "apply", "time", "nudge")


def signature(trace: tuple[str, ...]) -> Hashable:
    """The kinds of unusual event a trace needs (operator moves, sweep answers, failed
    sends, duplicates, rejections): violations of one invariant that need different
    kinds are different bugs, and each gets its own shortest trace."""
    kinds: set[str] = set()
    for label in trace:
        if "[send failed" in label:
            kinds.add("send-failed " + label.split("[send failed ", 1)[1].rstrip("]"))
        if label.startswith("deliver twice"):
            kinds.add("duplicate")
        elif label.startswith("sweep"):
            kinds.add(label.replace(": ", ":"))
        elif label.endswith("rejected") or label.startswith("reject"):
            kinds.add("rejected")
        elif label.startswith("lose"):
            kinds.add("lost-reply")
        elif label.endswith(" late"):
            kinds.add("late-apply")
        elif label.endswith(" late, reply comes"):
            kinds.add("late-apply-replied")
        elif label.startswith("event"):
            kinds.add(label.split(" (", 1)[0])
        elif label.startswith("intake"):
            kinds.add(label)
        elif not label.startswith(_ROUTINE):
            kinds.add(label.split(" ", 1)[0])
    return frozenset(kinds)
