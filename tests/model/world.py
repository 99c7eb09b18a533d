"""One order and everything around it, as a model for tests/model/explorer.py.

The world holds the order's process (only tests/model/driver.py looks inside it), the
Scheduler's nudges, the agent requests on their way, the calls the agents are waiting
on, the replies on their way back, the services' ledger (tests/model/provider.py) and
the requests sent whose windows are still open. Its events are everything that can
happen next, ours and the environment's alike:

- the Scheduler consumes a due nudge (claim), or takes a reply (delivered once, twice,
  or lost), and its send may fail after the request went out or before, the use case
  then noting `undelivered` (a transition's agent request is its first message, so
  "failed after the first message" and "all delivered, the ack lost" are one case);
- a request reaches its service (up to complete-by + skew), the service applies or
  rejects a running key, or serves a request at once (arrival, apply and reply in one:
  a shortcut for the common case that keeps the happy path shallow);
- the Supervisor sweeps a due order, with every answer the service could truthfully
  give at that moment about the key in doubt, and "no answer";
- an operator cancels, suspends, resumes, resubmits, migrates the order to the other
  version of its workflow (driver.later_version), drains or undrains an agent;
- an outside system sends an event the workflow waits for (an approval approved or
  rejected), early, late or twice;
- a service without abandon applies a request after its live time (the residual risk);
- an agent's call beats (a step heartbeat), or a limit holds a request before it starts;
- a sweep finds a deadline that passed in an outage of our own broker or store;
- time jumps to the next instant at which something changes (a deadline, an ask-at, a
  complete-by, a window's end, a delayed nudge), not tick by tick;
- a deploy drops the order's workflow version from the catalogue (and an operator puts
  it back); a bulk job acts on the order (cancel, suspend, resume, resubmit, migrate);
- reconciliation runs over the order at rest (finished, or held in Error or Suspended,
  as the product samples them) once nothing sent can apply any more (its runs are
  hourly, a complete-by is seconds), asking the services, alerting and undoing;
- the finished order is archived (its retention long past: no request can apply any
  more, even late), and its id is sent to the intake again, with its body or another;
- with `Bounds.intake`, the submission itself: stored claimed (within the intake's
  burst) or nudged (past it), for a client of every status or of the final one only,
  and the intake dying between its claimed insert and its sends; the Supervisor looks
  first at the watch entry's first look, and each of its checks sends the outbox of an
  order still as the intake stored it.
- the customer POSTs its next orders while this one lives (the intake's quota: refused
  with a Retry-After, or admitted to wait in its line or to run);
- a service answers with a result too large for the order to keep, on time or late;
- with `Bounds.refusals`, a service refuses for good a key the saga counts on (a
  retriable step's do, an undo), and an operator mends it once the order is held.

A second order of another customer (`driver.NEIGHBOUR`), finished at the same services,
is in the ledger from the start where the bound says so: nothing this order does may
touch its keys.

A lost request is one that never arrives: arrival is optional at every step and a
request drops off the wire when its window ends.

The workflow, the policy and the services come from the setup (tests/model/setups.py):
every shipped workflow, both ExhaustedPolicy values, services with and without abandon,
and two services sharing one key space (the ledger is kept per key space).

Not modelled: a crash between a save and its sends (but the intake's insert), and a
second order whose steps run at the same time as this one's (the neighbour is finished;
the customer's other order is seen only as it ends). Time is absolute (ticks from t0),
so a story that starts late (a nudge held back until the Pending deadline) is explored
again, shifted.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterator
from dataclasses import dataclass, field, replace
from typing import TypeVar

from shared.contract import QUEUE_PROPERTIES
from shared.domain.in_doubt import RemoteOutcome
from shared.domain.model import Notify, OrderProcess
from shared.domain.workflow import StepKind
from tests.model import driver
from tests.model.driver import Domain
from tests.model.provider import Entry, KeyStatus, Provider
from tests.model.setups import DEFAULT, Setup
from tests.model.wire import Answer, Effects, Large, Question, Reply, Request, operation_of

_ANSWER_OF = {
    KeyStatus.NEVER_SEEN: Answer.NEVER_SEEN,
    KeyStatus.RUNNING: Answer.IN_PROGRESS,
    KeyStatus.NOT_APPLIED: Answer.NOT_APPLIED,
    KeyStatus.REJECTED: Answer.NOT_APPLIED,
    KeyStatus.APPLIED: Answer.APPLIED,
    KeyStatus.ABANDONED: Answer.ABANDONED,
}
"""What a service answers `GET /operations/{key}` with, for each state of the key."""


def _undid(entry: Entry) -> bool | None:
    """What an applied undo's reply says it did (None for a do): the agent passes on the
    service's answer, `{"undone": false, ...}` when it found nothing to undo."""
    if entry.undoes is None or entry.status is not KeyStatus.APPLIED:
        return None
    return entry.undone


def _truth(world: World, agent: str, key: str) -> RemoteOutcome:
    """What `agent`'s service truthfully answers about `key` now."""
    entry = world.provider.get(world.space(agent), key)
    undone = entry.undone if entry.undoes is not None else None
    return driver.outcome(_ANSWER_OF[entry.status], key, undone)


@dataclass(frozen=True)
class Bounds:
    """What the world may do, besides the depth: each knob trades coverage for states."""

    rejectable: frozenset[str] = frozenset({"charge-payment"})
    """Operations whose service may refuse a do for good (a declined card)."""
    drainable: tuple[str, ...] = ("payment",)
    operator_actions: int = 2
    """At most this many operator moves (cancel, suspend, resubmit, drain, undrain) in
    one trace. A resume is free: its suspend was counted, and suspend, resume, cancel
    is a story worth two moves."""
    operator: frozenset[str] = frozenset(
        {"cancel", "suspend", "resume", "resubmit", "drain", "undrain"}
    )
    send_failures: bool = True
    duplicates: bool = True
    lost_replies: bool = True
    answers: bool = True
    """Does the Supervisor ask the service about a key in doubt?"""
    arrivals: bool = True
    """May a request reach its service and run there before it applies (False: it is
    served at once, or never arrives)?"""
    unanswered: bool = True
    """May the Supervisor's question go unanswered?"""
    late_applies: int = 1
    """How many requests a service without abandon may apply after their live time."""
    events: int = 2
    """Events an outside system may send in one trace (a repeat counts)."""
    heartbeats: bool = False
    """Step heartbeats from an agent whose call runs (needs the policy's step_max)."""
    holds: bool = False
    """A limit holding a request before its call starts (machine/hold.py)."""
    drops: bool = False
    """May a deploy drop the order's workflow version from the catalogue (once)?"""
    bulk: frozenset[str] = frozenset()
    """Bulk actions a job may take on the order (each counts as an operator move)."""
    reconcile: bool = False
    """Does reconciliation run over the order at rest (finished, or held)?"""
    archive: bool = False
    """Is the finished order archived, and its id sent to the intake again?"""
    neighbour: bool = False
    """Is a second, finished order's effect in the ledger at the same services?"""
    outages: bool = False
    """May a sweep find a deadline that passed in an outage of our own broker or store
    (recover's count=False: nothing asked, nothing counted)?"""
    fair_share: bool = False
    """Does the order start in its customer's line, behind another of its orders that
    runs (FairShareRunningPerCustomer=1), promoted when that one ends?"""
    large_results: bool = False
    """May a service answer a do with a result over the size the order keeps (a
    document beside its declared fields, or declared fields too large themselves)?"""
    others: int = 0
    """The customer's next orders POSTed while this one lives (the intake's quota,
    IntakeMaxPendingPerCustomer=2: refused with a Retry-After, admitted to wait in line
    or to run), each through the real intake with the customer ledger as the story left it."""
    operator_approvals: bool = False
    """May an operator answer an approval (the approval route), and are malformed
    events tried (each must be refused, changing nothing)?"""
    refusals: int = 0
    """How many keys a service may refuse for good although the saga counts on them
    succeeding in the end: a retriable step's do or an undo (`OrderWorld.refusable`).
    The order is then held for an operator, who mends the provider (`_menders`: it
    still refuses that key, and answers a fresh one afresh) and resubmits or cancels,
    which sends the operation under a fresh key (docs/in-doubt.md)."""
    lost_saves: bool = False
    """May a Supervisor's sweep lose its save to another's (two instances checking the
    order at once, `ConcurrencyConflict`) after its abandon went through at the service:
    the key is abandoned there and the order does not know it?"""
    intake: bool = False
    """Does the order start at the intake's choice (issue #39): stored already claimed
    (within the burst), claimed and the intake dying between its insert and its sends,
    or nudged (past the burst); each for a client that hears every status and for one
    that asked for the final one only (`notify: final`)? The client's notifications
    are then kept (`World.heard`)."""


MIGRATING = frozenset({"cancel", "suspend", "resume", "resubmit", "drain", "undrain", "migrate"})
BULK = frozenset({"cancel", "suspend", "resume", "resubmit", "migrate"})
BOUNDS = {
    "core": Bounds(duplicates=False, lost_replies=False, send_failures=False, operator=MIGRATING),
    "failed-sends": Bounds(duplicates=False, lost_replies=False, rejectable=frozenset()),
    "everything": Bounds(heartbeats=True, holds=True),
    "ops": Bounds(
        rejectable=frozenset(),
        duplicates=False,
        lost_replies=False,
        send_failures=False,
        operator=MIGRATING | {"restore"},
        events=1,
        drops=True,
        bulk=BULK,
        reconcile=True,
        archive=True,
        neighbour=True,
        operator_approvals=True,
        outages=True,
    ),
    "fair": Bounds(
        rejectable=frozenset(),
        drainable=(),
        duplicates=False,
        lost_replies=False,
        send_failures=False,
        operator_actions=1,
        events=1,
        fair_share=True,
        others=2,
    ),
    "late": Bounds(
        drainable=(),
        operator_actions=1,
        operator=frozenset({"cancel", "suspend", "resume"}),
        duplicates=False,
        lost_replies=False,
        send_failures=False,
        events=0,
        reconcile=True,
    ),
    "late-far": Bounds(
        rejectable=frozenset(),
        drainable=(),
        operator_actions=0,
        duplicates=False,
        lost_replies=False,
        send_failures=False,
        events=0,
        unanswered=False,
        reconcile=True,
    ),
    "large": Bounds(
        rejectable=frozenset(),
        drainable=(),
        operator_actions=0,
        duplicates=False,
        lost_replies=False,
        send_failures=False,
        events=0,
        unanswered=False,
        reconcile=True,
        large_results=True,
    ),
    "intake": Bounds(
        duplicates=False,
        lost_replies=False,
        send_failures=False,
        operator_actions=1,
        events=1,
        intake=True,
    ),
    "pivot": Bounds(
        rejectable=frozenset(),
        drainable=("shipping",),
        operator=frozenset({"cancel", "drain", "undrain"}),
        duplicates=False,
        lost_replies=False,
        send_failures=False,
        events=0,
        late_applies=0,
    ),
    "lost-saves": Bounds(
        rejectable=frozenset(),
        drainable=(),
        operator_actions=0,
        duplicates=False,
        lost_replies=False,
        send_failures=False,
        events=0,
        late_applies=0,
        lost_saves=True,
        outages=True,
    ),
    "early-event": Bounds(
        rejectable=frozenset(),
        drainable=("payment",),
        operator=frozenset({"drain"}),
        operator_actions=1,
        duplicates=False,
        lost_replies=False,
        send_failures=False,
        events=1,
        late_applies=0,
    ),
    "lean": Bounds(
        rejectable=frozenset(),
        drainable=(),
        operator_actions=0,
        duplicates=False,
        lost_replies=False,
        send_failures=False,
        late_applies=0,
        events=1,
    ),
    "refusals": Bounds(
        drainable=(),
        operator_actions=1,
        operator=frozenset({"cancel", "resubmit"}),
        duplicates=False,
        lost_replies=False,
        send_failures=False,
        late_applies=0,
        events=1,
        arrivals=False,
        unanswered=False,
        refusals=1,
    ),
    "rekey-late": Bounds(
        rejectable=frozenset(),
        drainable=(),
        operator_actions=1,
        operator=frozenset({"resubmit", "cancel"}),
        duplicates=False,
        lost_replies=False,
        send_failures=False,
        events=0,
        unanswered=False,
        refusals=1,
        reconcile=True,
    ),
    "deep": Bounds(
        rejectable=frozenset(),
        drainable=(),
        operator_actions=0,
        duplicates=False,
        lost_replies=False,
        send_failures=False,
        late_applies=0,
        events=0,
        arrivals=False,
        unanswered=False,
    ),
}
"""The named bounds the tests and `python -m tests.model` explore. `ops` adds what
operators and deploys do around an order (a dropped version, bulk actions,
reconciliation, archive and the id sent again, a neighbour order); `fair` starts the
order in its customer's line; `intake` starts it at the intake's choice (claimed at
intake, the intake dying before its sends, or nudged) for either client. `late` keeps
what a late answer needs (a service without abandon applying after its live time, its
reply still coming, a declined charge, a sweep left unanswered, one operator move,
reconciliation) and drops the rest, so it reaches the Scheduler's late-answer rules in
a few thousand states; `late-far` drops the declines, the unanswered sweeps and the
operator too, to follow a late reply past the retry at the other provider; `large` is
`late-far` with results too large to keep, on time and late. `lean` leaves the
environment only timeouts, the Supervisor's answers and one event, so it reaches deep
(the last step of a four-step workflow, exhausted) where liveness brings in the
operator. `deep` leaves it less still (a request is served at once or lost, every
question is answered), to reach the end of every workflow's retries. `refusals` is
`deep` with a declined charge, one event, one cancel or resubmit, and a service that
refuses a retriable step or an undo for good, then is mended once the order is held.
`rekey-late` holds a refusal for good, its mend and one resubmit or cancel, a late
apply and reconciliation: an earlier round of a moved key applying late (from
`starts.BACKUP_DUE`). Three more are meant for a walked start (tests/model/starts.py):
`pivot` (a cancel once the pivot runs, the next step's agent drained when a reply
dispatches it), `lost-saves` (a sweep that abandoned a key and lost its save, then an
uncounted sweep in our outage: the order meets the abandon with its next request) and
`early-event` (an event kept before its wait starts, the Supervisor taking it when the
wait's nudge is late, the next step's agent drained)."""


WINDOW = QUEUE_PROPERTIES.duplicate_detection_window_seconds
"""Every queue's duplicate-detection window, in ticks (seconds)."""
REPLIES = "agent-replies"
"""The one queue every agent's replies share (its -high lane is not modelled: one
order has one priority)."""
_DUPLICATE = "its id was taken on that queue within the window"

M = TypeVar("M", Request, Reply)


@dataclass(frozen=True)
class Taken:
    """A message id the broker took on a queue at a tick, and what it carried."""

    queue: str
    message_id: str
    at: int
    message: Hashable
    """What makes two messages the same one (`_same`): a resend carries the same."""


def _same(message: Request | Reply) -> Hashable:
    """A message as a resend repeats it: an undo sent again for a late success redelivered
    is the same undo, its complete-by counted from the later send."""
    if isinstance(message, Request):
        return replace(message, complete_by=0)
    return replace(message, request=replace(message.request, complete_by=0), duplicate=False)


def _broker(
    world: World, messages: list[tuple[str, str, M]]
) -> tuple[tuple[M, ...], frozenset[Taken], tuple[M, ...], str | None]:
    """Service Bus duplicate detection: each (queue, message id, message) is taken, or
    dropped when its queue took that id within the window, whether or not it is the same
    message. Returns the messages taken, the ids now held, the messages dropped, and the
    first drop of a message other than the one its id was taken for (`one-id-one-message`)."""
    held = {(t.queue, t.message_id): t.message for t in world.taken}
    kept: list[M] = []
    dropped: list[M] = []
    added: set[Taken] = set()
    collision: str | None = None
    for queue, message_id, message in messages:
        same = _same(message)
        if (queue, message_id) in held:
            dropped.append(message)
            if held[(queue, message_id)] != same and collision is None:
                collision = f"{message.describe()} dropped on {queue}: {message_id} was another's"
            continue
        held[(queue, message_id)] = same
        added.add(Taken(queue, message_id, world.now, same))
        kept.append(message)
    return tuple(kept), world.taken | added, tuple(dropped), collision


def _forgotten(world: World) -> frozenset[Taken]:
    """The ids the broker still holds when a reconciliation run sends: a later run comes
    an hour after the last, past every window."""
    return frozenset() if world.reconciled else world.taken


@dataclass(frozen=True)
class Sent:
    """A request sent, on the judge's books until its window ends."""

    request: Request
    live_until: int


@dataclass(frozen=True)
class Refusal:
    """The Scheduler took a service's refusal for good of an operation the saga counts
    on (tests/model/invariants.py `refused_held`)."""

    operation: str
    agent: str
    step: str
    undo: bool
    cancelling: bool
    """The order was being cancelled: a do's refusal then ends in the cancel's undo."""


@dataclass(frozen=True)
class World:
    now: int
    process: OrderProcess
    process_key: Hashable
    """driver.key(process), computed once per transition rather than once per state."""
    domain: Domain
    """The setup's rules (not part of the state: one per model)."""
    due_nudges: int = 0
    """Nudges the Scheduler may consume now (at most 2 kept: a third adds nothing)."""
    later_nudges: frozenset[int] = frozenset()
    wire: frozenset[Request] = frozenset()
    """Requests sent and not yet at their service."""
    calls: frozenset[Request] = frozenset()
    """Requests at their service whose agent is still waiting for the answer."""
    replies: frozenset[Reply] = frozenset()
    provider: Provider = field(default_factory=Provider)
    sent: frozenset[Sent] = frozenset()
    """Every request sent whose window is still open."""
    drained: frozenset[str] = frozenset()
    operator_moves: int = 0
    told_not_applied: frozenset[tuple[str, str]] = frozenset()
    """(key space, do key) the order was told, once final, that the service never
    applied: a failure reply, or a sweep's answer with no request of the key still live."""
    late_applied: frozenset[tuple[str, str]] = frozenset()
    """(key space, do key) applied after its live time."""
    late_told: frozenset[tuple[str, str]] = frozenset()
    """Of those, the ones whose success reply the Scheduler took: the order knows of the
    effect, so healing it is the order's own job, not only reconciliation's."""
    alerted: frozenset[str] = frozenset()
    """Operator alerts raised since the first late apply (all of them before it)."""
    events_sent: int = 0
    gone: bool = False
    """The catalogue no longer keeps the order's workflow version."""
    dropped: bool = False
    """A deploy dropped it in this trace (at most once)."""
    archived: bool = False
    resent: int = 0
    """Times the archived order's id was sent to the intake again."""
    reused: bool = False
    """The intake created a new order under the archived id (finding H)."""
    in_line: bool = False
    """The customer ledger holds the order in its customer's line (not yet promoted)."""
    promoted_at: int | None = None
    """When the customer's other order ended and this one was promoted."""
    posts: driver.Intake = field(default_factory=driver.Intake)
    """The customer's next orders the intake was given (Bounds.others)."""
    deciding: bool = False
    """Not yet submitted: the intake's choice comes first (`Bounds.intake`)."""
    first_look: int | None = None
    """When the Supervisor first looks at an order claimed at intake (its watch entry)."""
    promoting: bool = False
    """Promoted, and neither claimed since nor released by the Supervisor: the promotion's
    check (`Customers.release`) is what finds it if its nudge is lost."""
    watch: int | None = None
    """The order's watch entry as the store holds it (None: not on the watch list): what
    the intake, a promotion, each change's unit of work and the Supervisor's reschedule
    wrote (`Effects.rewatch`), which may differ from what the row says."""
    unsent: Effects | None = None
    """The intake's insert, its outbox never sent (the intake died): the Supervisor's
    check sends it while the order is as the intake stored it. Any later change replaces
    the outbox, and sends its own."""
    heard: tuple[str, ...] = ()
    """The statuses the client heard, in order (kept with `Bounds.intake` only)."""
    taken: frozenset[Taken] = frozenset()
    """(queue, message id, tick) of every request and reply the broker took within its
    duplicate-detection window: a second message with one of these ids on that queue is
    dropped, whatever its body (`_broker`)."""
    reconciled: bool = False
    """A reconciliation run went over the order: the next one is an hour later, past
    every duplicate-detection window."""
    refused: frozenset[tuple[str, str]] = frozenset()
    """(key space, key) a service refused for good that the saga counts on succeeding
    (`Bounds.refusals`), not yet mended: it answers every request of it with that refusal."""
    mended: frozenset[tuple[str, str]] = frozenset()
    """Of those, the ones whose provider an operator mended: it keeps replaying the
    refusal to that key, as a real provider does, and answers a fresh key of the
    operation (a later round) afresh, never refusing that operation again."""
    # What the last event did; read by the invariants, left out of the key.
    just_sent: tuple[Request, ...] = ()
    just_told: tuple[tuple[str, str], ...] = ()
    """A late apply whose success reply the Scheduler just took (key space, do key)."""
    notes: tuple[str, ...] = ()
    collision: str | None = None
    """A message the last event's send lost to the broker's duplicate detection though
    it was not the message its id was taken for (two messages, one id)."""
    flaw: str | None = None
    """What the last event broke that the state itself does not show (the Supervisor
    counted a timeout against an order whose intake's outbox it never sent again)."""
    just_alerted: tuple[tuple[str, str], ...] = ()
    """The alerts the last transition raised: (reason, lastError)."""
    just_refused: Refusal | None = None
    """A refusal for good the Scheduler just took, from an order not already held."""

    def space(self, agent: str) -> str:
        return self.domain.setup.space(agent)

    def asked(self, agent: str, key: str) -> RemoteOutcome:
        """What `agent`'s service truthfully answers about `key` now."""
        return _truth(self, agent, key)

    def in_window(self, agent: str, key: str) -> bool:
        """Might a do request of `key` still apply in `agent`'s key space, as far as the
        order can know? Only time tells it: a service's "not applied" while a request of
        the key is inside its window is no final word (it may not have arrived yet)."""
        space = self.space(agent)
        return any(
            self.space(s.request.agent) == space
            and s.request.key == key
            and self.now < s.live_until
            for s in self.sent
            if not s.request.undo
        )

    def live(self, agent: str, key: str) -> bool:
        """Might a do request of `key` still apply in `agent`'s key space?"""
        space = self.space(agent)
        if self.provider.get(space, key).status.settled:
            return False
        return any(
            self.space(s.request.agent) == space
            and s.request.key == key
            and self.now < s.live_until
            for s in self.sent
        )

    def in_force(self, agent: str, do_key: str) -> bool:
        return self.provider.in_force(self.space(agent), do_key)

    def quiet(self) -> bool:
        """Nothing sent can apply any more: the services' ledger is the last word (but
        for a late apply)."""
        return not (self.sent or self.wire or self.provider.running())


class OrderWorld:
    """The model: one order, its agents, their services, the clock and an operator."""

    def __init__(self, bounds: Bounds | None = None, setup: Setup = DEFAULT) -> None:
        self.bounds = bounds or Bounds()
        self.setup = setup
        self.domain = Domain(setup)
        self._late = frozenset(setup.space(a) for a in setup.agents if not setup.abandons(a))
        self._refusable = self.refusable if self.bounds.refusals else frozenset()
        self._malformed: set[Hashable] = set()
        """Shapes of the order (state, step, events kept) malformed events were tried on."""
        self._shorter: set[Hashable] = set()
        """Shapes of the order (state, step statuses) a shorter version was refused on."""

    def initial(self) -> World:
        if self.bounds.intake:
            placeholder = self.domain.start_nudged(Notify.ALL).process
            return World(0, placeholder, driver.key(placeholder), self.domain, deciding=True)
        fair = self.bounds.fair_share
        effects = self.domain.start(in_line=fair)
        world = World(0, effects.process, driver.key(effects.process), self.domain, in_line=fair)
        if self.bounds.neighbour:
            done = [Entry(space, key, KeyStatus.APPLIED) for space, key in self.domain.neighbour]
            world = replace(world, provider=Provider(tuple(sorted(done))))
        return self._take(world, effects, ())

    def key(self, world: World) -> Hashable:
        return (
            world.now,
            world.process_key,
            world.due_nudges,
            world.later_nudges,
            world.wire,
            world.calls,
            world.replies,
            world.provider,
            world.sent,
            world.drained,
            world.operator_moves,
            world.told_not_applied,
            world.late_applied,
            world.late_told,
            world.alerted,
            world.events_sent,
            world.gone,
            world.dropped,
            world.archived,
            world.resent,
            world.reused,
            world.in_line,
            world.promoted_at,
            world.posts,
            world.deciding,
            world.first_look,
            world.watch,
            world.promoting,
            world.unsent is not None,
            world.heard,
            world.process.order.notify,
            world.taken,
            world.reconciled,
            world.refused,
            world.mended,
        )

    def successors(self, world: World) -> Iterator[tuple[str, World]]:
        world = replace(
            world,
            just_sent=(),
            just_told=(),
            notes=(),
            flaw=None,
            collision=None,
            just_alerted=(),
            just_refused=None,
        )
        if world.deciding:
            yield from self._intake(world)
            return
        yield from self._scheduler(world)
        yield from self._services(world)
        yield from self._replies(world)
        yield from self._supervisor(world)
        yield from self._operator(world)
        yield from self._menders(world)
        yield from self._outside(world)
        yield from self._agents(world)
        yield from self._deploys(world)
        yield from self._customers(world)
        yield from self._other_orders(world)
        yield from self._reconciler(world)
        yield from self._archiver(world)
        yield from self._clock(world)

    # --- the order's own moves ----------------------------------------------------

    def _take(self, world: World, effects: Effects, notes: tuple[str, ...]) -> World:
        """The world after a transition whose messages all went out."""
        return self._send(self._moved(world, effects), effects, notes, True)

    def _moved(self, world: World, effects: Effects) -> World:
        watch = effects.watched(world.watch)
        return replace(
            world,
            process=effects.process,
            process_key=driver.key(effects.process),
            unsent=None,
            watch=watch,
            promoting=world.promoting and driver.in_line(effects.process),
        )

    def _send(
        self, world: World, effects: Effects, notes: tuple[str, ...], requests_out: bool
    ) -> World:
        skew = driver.SKEW
        outgoing = effects.requests if requests_out else ()
        requests, taken, dropped, collision = _broker(
            world, [(r.agent, r.message_id, r) for r in outgoing]
        )
        due = world.due_nudges + sum(1 for t in effects.nudges if t <= world.now)
        later = world.later_nudges | {t for t in effects.nudges if t > world.now}
        told = world.told_not_applied - {
            (world.space(r.agent), r.key) for r in requests if not r.undo
        }
        alerted = world.alerted | set(effects.alerts)
        heard = world.heard + effects.statuses if self.bounds.intake else ()
        lines = [*notes, effects.summary]
        lines += [f"  sent {r.describe()}" for r in requests]
        lines += [f"  broker dropped {r.describe()}: {_DUPLICATE}" for r in dropped]
        lines += [f"  alert {a}" for a in effects.alerts]
        return replace(
            world,
            taken=taken,
            collision=world.collision or collision,
            due_nudges=min(due, 2),
            later_nudges=later,
            wire=world.wire | set(requests),
            sent=world.sent | {Sent(r, r.live_until(skew)) for r in requests},
            told_not_applied=told,
            alerted=alerted,
            heard=heard,
            just_sent=world.just_sent + requests,
            just_alerted=world.just_alerted
            + tuple(zip(effects.alerts, effects.alert_words, strict=True)),
            notes=tuple(lines),
        )

    def _sending(self, world: World, label: str, effects: Effects) -> Iterator[tuple[str, World]]:
        """A Scheduler transition: its send goes through, or fails after the request
        went out (the ack lost), or before; a failed send is followed by `undelivered`."""
        yield label, self._take(world, effects, ())
        if not (self.bounds.send_failures and effects.requests):
            return
        for out, how in ((True, "after the request went out"), (False, "before the request")):
            sent = self._send(self._moved(world, effects), effects, (), out)
            noted = self.domain.undelivered(sent.process, world.now)
            failed = f"  send failed {how}"
            if noted is None:
                yield f"{label} [send failed {how}]", replace(sent, notes=(*sent.notes, failed))
            else:
                after = self._take(sent, noted, (*sent.notes, failed))
                yield f"{label} [send failed {how}]", after

    def _scheduler(self, world: World) -> Iterator[tuple[str, World]]:
        if world.due_nudges == 0:
            return
        consumed = replace(world, due_nudges=world.due_nudges - 1, promoting=False)
        effects = self.domain.claim(world.process, world.now, world.drained, world.gone)
        if effects is None:
            yield "nudge (stale)", replace(consumed, notes=("claim: nothing to do",))
        else:
            yield from self._sending(consumed, "claim", effects)

    def _replies(self, world: World) -> Iterator[tuple[str, World]]:
        for reply in sorted(world.replies):
            rest = world.replies - {reply}
            copies: list[tuple[str, frozenset[Reply]]] = [("deliver", rest)]
            if self.bounds.duplicates and not reply.duplicate:
                copies.append(("deliver twice", rest | {replace(reply, duplicate=True)}))
            for verb, left in copies:
                label = f"{verb} {reply.describe()}"
                after = replace(world, replies=left)
                if not reply.succeeded and not reply.request.undo:
                    failed = (world.space(reply.request.agent), reply.request.key)
                    after = replace(after, told_not_applied=after.told_not_applied | {failed})
                after = self._told_late(after, reply)
                effects = self.domain.reply(
                    world.process, reply, world.now, world.drained, world.gone
                )
                if world.archived:
                    effects = None  # unknown order: dead-lettered
                if effects is None:
                    yield label, replace(after, notes=("reply: stale, ignored",))
                else:
                    after = replace(after, just_refused=self._refusal(world, reply))
                    yield from self._sending(after, label, effects)
            if self.bounds.lost_replies:
                yield f"lose {reply.describe()}", replace(world, replies=world.replies - {reply})

    def _refusal(self, world: World, reply: Reply) -> Refusal | None:
        """The reply is a refusal for good of a key the saga counts on, taken by an order
        not already held for an operator."""
        r = reply.request
        if reply.succeeded or (world.space(r.agent), r.key) not in world.refused:
            return None
        if driver.held(world.process):
            return None
        cancelling = world.process.state.cancel_requested
        return Refusal(r.operation, r.agent, r.step, r.undo, cancelling)

    def _told_late(self, world: World, reply: Reply) -> World:
        """A success reply for a key that applied after its live time: the Scheduler now
        knows of that effect (whether it takes the reply or drops it as stale)."""
        r = reply.request
        late = (world.space(r.agent), r.key)
        if world.archived or not reply.succeeded or r.undo or late not in world.late_applied:
            return world
        return replace(world, late_told=world.late_told | {late}, just_told=(late,))

    def _supervisor(self, world: World) -> Iterator[tuple[str, World]]:
        """The Supervisor's check of a due order, or its first look at one claimed at
        intake; either first sends the outbox of an order still as the intake stored it."""
        if world.archived:
            return
        due = self.domain.due(world.process, world.now)
        if not due:
            if world.first_look is not None and world.now >= world.first_look:
                yield "sweep: first look", self._looked(world)
            return
        looked = world if world.gone else self._looked(world)
        failures = world.process.state.failure_count
        for label, taken in self._sweeps(looked):
            swept = replace(taken, promoting=False)
            if looked.unsent is not None and swept.process.state.failure_count > failures:
                flaw = "a timeout counted against a request the intake never sent"
                yield label, replace(swept, flaw=flaw)
            else:
                yield label, swept

    def _sweeps(self, world: World) -> Iterator[tuple[str, World]]:
        domain = self.domain
        if world.archived or not domain.due(world.process, world.now):
            return
        if self.bounds.fair_share and not world.in_line and driver.in_line(world.process):
            # Promoted, its nudge lost: released and nudged (nothing asked).
            effects = domain.sweep(
                world.process, world.now, None, in_line=False, drained=world.drained
            )
            if effects is not None:
                yield "sweep: promoted", self._take(world, effects, ())
            return
        if world.in_line:
            # Its turn has not come: the check moves to its hold (later than now, even
            # once the hold passed), nothing changes.
            if driver.in_line(world.process):
                assert domain.sweep(world.process, world.now, None, in_line=True) is None
            return
        if world.gone:
            held = domain.sweep(world.process, world.now, None, gone=True)
            assert held is not None
            yield "sweep: version gone", self._take(world, held, ())
            return
        if self.bounds.outages:
            outage = domain.sweep(
                world.process, world.now, None, counted=False, drained=world.drained
            )
            if outage is not None:
                yield "sweep in our outage", self._take(world, outage, ())
        question = domain.question(world.process, world.drained) if self.bounds.answers else None
        if question is None:
            effects = domain.sweep(world.process, world.now, None, drained=world.drained)
            if effects is not None:
                yield "sweep", self._take(world, effects, ())
            return
        if world.now < question.ask_at:
            return  # rescheduled to its ask-at: asked earlier, "never seen" is a guess
        for answer, asked, said in self._settled(world, question):
            undone = _undid(asked.provider.get(world.space(question.agent), question.key))
            effects = domain.sweep(
                asked.process,
                world.now,
                answer,
                question.key,
                undone=undone,
                drained=world.drained,
            )
            if effects is None:
                continue
            if self.bounds.lost_saves and asked.provider != world.provider:
                lost = (said, "  its save lost to another Supervisor's: the order is unchanged")
                yield (
                    f"sweep: {answer.value}, save lost",
                    replace(world, provider=asked.provider, notes=lost),
                )
            told = asked.told_not_applied
            space = world.space(question.agent)
            final = not asked.in_window(question.agent, question.key)
            if answer is Answer.ABANDONED or (
                answer in (Answer.NEVER_SEEN, Answer.NOT_APPLIED) and final
            ):
                told = told | {(space, question.key)}
            after = replace(asked, told_not_applied=told)
            yield f"sweep: {answer.value}", self._take(after, effects, (said,))

    def _settled(self, world: World, question: Question) -> Iterator[tuple[Answer, World, str]]:
        """What the Supervisor's `_settle` concludes, for each way the service may
        answer: the truth (abandon where the question says so and the service has the
        route; a "not applied" that would move the step made final by an abandon), or
        no answer (the call failed and changed nothing)."""
        agent, key = question.agent, question.key
        space = world.space(agent)
        abandons = self.setup.abandons(agent)
        asked = world
        if question.abandon and abandons:
            provider, status = world.provider.abandon(space, key)
            asked = replace(world, provider=provider)
            answer = _ANSWER_OF[status]
            how = "abandon"
        else:
            answer = _ANSWER_OF[world.provider.get(space, key).status]
            how = "asked"
            if question.movable and answer in (Answer.NOT_APPLIED, Answer.NEVER_SEEN) and abandons:
                provider, status = world.provider.abandon(space, key)
                asked = replace(world, provider=provider)
                answer = _ANSWER_OF[status]
                how = "asked, then abandon"
        yield answer, asked, f"  {agent} ({how}) answers {answer.value} about {key}"
        if self.bounds.unanswered:
            yield Answer.UNKNOWN, world, f"  {agent} gives no answer about {key}"

    def _operator(self, world: World) -> Iterator[tuple[str, World]]:
        allowed = self.bounds.operator
        if world.gone and "restore" in allowed:
            # A deploy, not a move on the order: free, like a resume.
            back = ("the version is back in the catalogue",)
            yield "restore the version", replace(world, gone=False, notes=back)
        if "migrate" in allowed and not (world.gone or world.archived):
            state = world.process.state
            shape = (state.process_state, tuple(s.status for s in world.process.steps))
            if shape not in self._shorter:
                self._shorter.add(shape)
                assert self.domain.refuses_shorter(world.process, world.now), shape
        if world.operator_moves >= self.bounds.operator_actions or world.archived:
            return
        moved = replace(world, operator_moves=world.operator_moves + 1)
        domain = self.domain
        moves = (
            ("cancel", domain.cancel),
            ("suspend", domain.suspend),
            ("resume", domain.resume),
            ("resubmit", domain.resubmit),
            ("migrate", domain.migrate),
        )
        for name, move in moves:
            if name not in allowed:
                continue
            effects = move(world.process, world.now, world.gone)
            if effects is not None:
                yield name, self._take(world if name == "resume" else moved, effects, ())
        for action in sorted(self.bounds.bulk):
            # A migrate job moves its filter's orders to one version: one job per version,
            # so the order already there is the job's to skip.
            targets = sorted(domain.versions) if action == "migrate" else [None]
            for to in targets:
                effects = domain.bulk(world.process, action, world.now, world.gone, to)
                if effects is not None:
                    label = f"bulk {action}" if to is None else f"bulk {action} to v{to}"
                    yield label, self._take(moved, effects, ())
        if driver.finished(world.process) is not None:
            return
        for agent in self.bounds.drainable:
            if agent in world.drained and "undrain" in allowed:
                undrained = replace(moved, drained=world.drained - {agent})
                yield f"undrain {agent}", replace(undrained, notes=(f"{agent} undrained",))
            elif agent not in world.drained and "drain" in allowed:
                drained = replace(moved, drained=world.drained | {agent})
                yield f"drain {agent}", replace(drained, notes=(f"{agent} drained",))

    def _menders(self, world: World) -> Iterator[tuple[str, World]]:
        """An operator mends a service that refused a key for good (a card, an account,
        a configuration): only once the order is held, since nobody knows before. The
        service keeps the refused key's record and replays its refusal (no provider lets
        it be cleared), and answers a fresh key of the operation afresh; it is the
        operator's resubmit or cancel that sends one (shared/domain/machine/rekey.py;
        tests/model/liveness.py counts the mend as free)."""
        if not world.refused or not driver.held(world.process):
            return
        for space, key in sorted(world.refused):
            mended = (space, key)
            name = key.split(":", 1)[-1]
            note = f"  {space} mended: it still refuses {name}, answers a fresh key afresh"
            yield (
                f"mend {name}@{space}",
                replace(
                    world,
                    refused=world.refused - {mended},
                    mended=world.mended | {mended},
                    notes=(note,),
                ),
            )

    def _outside(self, world: World) -> Iterator[tuple[str, World]]:
        """An outside system's events: each event the workflow waits for (an approval
        approved or rejected), at any moment, early or late, and a repeat of the last
        one sent (same id)."""
        approvals = self.bounds.operator_approvals and self.domain.approvals
        if approvals and driver.finished(world.process) and not world.archived:
            # The approval route on a final order: refused (409), nothing changes.
            assert self.domain.approve(world.process, world.now, "x-5", True) is None
        if approvals and world.events_sent and not driver.finished(world.process):
            # The operator answers again under the first event's id (kept): changes
            # nothing (the first answer stands), whatever the event budget says.
            again = self.domain.approve(
                world.process, world.now, "e-1", True, world.gone, world.drained
            )
            if again is not None:
                yield "operator approves again (e-1)", self._take(world, again, ())
        if world.events_sent >= self.bounds.events or driver.finished(world.process):
            return
        gone = world.gone
        counted = replace(world, events_sent=world.events_sent + 1)
        fresh = f"e-{world.events_sent + 1}"
        for name in self.domain.events:
            choices: tuple[bool | None, ...] = (
                (True, False) if name in self.domain.approvals else (None,)
            )
            for approved in choices:
                effects = self.domain.event(
                    world.process, world.now, fresh, name, approved, gone, world.drained
                )
                if effects is None:
                    continue
                how = "" if approved is None else " approved" if approved else " rejected"
                yield f"event {name}{how} ({fresh})", self._take(counted, effects, ())
        if approvals:
            state = world.process.state
            shape = (state.process_state, state.current_step, len(state.events))
            if not gone and shape not in self._malformed:
                self._malformed.add(shape)
                assert self.domain.refuses_malformed(world.process, world.now), shape
            for approved in (True, False):
                effects = self.domain.approve(
                    world.process, world.now, fresh, approved, gone, world.drained
                )
                if effects is not None:
                    how = "approves" if approved else "rejects"
                    yield f"operator {how} ({fresh})", self._take(counted, effects, ())
        if world.events_sent:
            last = f"e-{world.events_sent}"
            for name in self.domain.events:
                again = self.domain.event(
                    world.process, world.now, last, name, True, gone, world.drained
                )
                if again is not None:  # a repeat must change nothing
                    yield f"event {name} again ({last})", self._take(counted, again, ())

    def _agents(self, world: World) -> Iterator[tuple[str, World]]:
        """An agent whose call runs beats (its step's complete-by moves with it); a limit
        holds a request before its call starts (its complete-by moves by the wait)."""
        if self.bounds.heartbeats and not world.archived:
            for request in sorted(world.calls):
                if request.undo:
                    continue
                effects = self.domain.heartbeat(world.process, request, world.now)
                if effects is not None:
                    moved = self._extend(world, request, effects, in_calls=True)
                    yield f"heartbeat {request.describe()}", moved
        if self.bounds.holds and not world.archived:
            for request in sorted(world.wire):
                waited = self.domain.limit_wait(request, world.now, concurrent=request.undo)
                effects = self.domain.hold(world.process, request, waited, world.now)
                if effects is not None:
                    moved = self._extend(world, request, effects, in_calls=False)
                    yield f"hold {request.describe()}", moved

    def _extend(self, world: World, request: Request, effects: Effects, *, in_calls: bool) -> World:
        """The agent's request now runs to the step's new complete-by."""
        until = self.domain.complete_by(effects.process, request.step)
        assert until is not None
        longer = replace(request, complete_by=until)
        skew = driver.SKEW
        moved = self._moved(world, effects)
        space = world.space(request.agent)
        provider = moved.provider
        if in_calls:
            until = longer.live_until(skew)
            provider = provider.register(space, request.key, until, request.undoes, request.attempt)
        return replace(
            moved,
            calls=(moved.calls - {request}) | {longer} if in_calls else moved.calls,
            wire=(moved.wire - {request}) | {longer} if not in_calls else moved.wire,
            sent=moved.sent | {Sent(longer, longer.live_until(skew))},
            provider=provider,
            notes=(effects.summary,),
        )

    def _deploys(self, world: World) -> Iterator[tuple[str, World]]:
        """A deploy whose catalogue no longer keeps the order's version (once a trace)."""
        if not self.bounds.drops or world.dropped or world.archived:
            return
        if driver.finished(world.process) is not None:
            return
        version = world.process.state.workflow_version
        dropped = replace(world, gone=True, dropped=True, notes=(f"v{version} dropped",))
        yield f"deploy without v{version}", dropped

    def _customers(self, world: World) -> Iterator[tuple[str, World]]:
        """The customer's other order comes to rest: this one is promoted, and its nudge
        sent, or lost (a crash between the ledger's leave and the send)."""
        if not world.in_line:
            return
        promoted = self.domain.promoted(world.process, world.now, world.watch)
        left = replace(world, in_line=False, promoted_at=world.now, promoting=True)
        yield "neighbour ends: promoted", self._take(left, promoted, ())
        # Its check moved up first (`Customers.release`), then the nudge lost.
        lost = replace(left, watch=promoted.watch, notes=("promoted, its nudge lost",))
        yield "neighbour ends: promoted, nudge lost", lost

    def _other_orders(self, world: World) -> Iterator[tuple[str, World]]:
        """The customer POSTs its next order: refused at its quota (nothing stored, a
        Retry-After given, the refusing instance remembering it a moment), or admitted.
        The client may come back at once or at its Retry-After; this order is untouched."""
        intake = world.posts
        if intake.posts >= self.bounds.others:
            return
        said, after = self.domain.submit_other(world.process, world.now, world.promoted_at, intake)
        name = driver.OTHERS[min(intake.posts, len(driver.OTHERS) - 1)]
        yield f"customer posts {name}: {said}", replace(world, posts=after, notes=(said,))

    def _reconciler(self, world: World) -> Iterator[tuple[str, World]]:
        """Reconciliation over the order at rest, finished or held for an operator (Error,
        Suspended), as the product's sample takes it, once nothing sent can apply (an
        hourly run, against complete-bys of seconds): the services' true answers."""
        if not self.bounds.reconcile or world.archived or not world.quiet():
            return
        if not driver.at_rest(world.process):
            return

        effects = self.domain.reconcile(
            world.process, world.now, lambda agent, key: _truth(world, agent, key)
        )
        if effects is not None:
            # A run may come minutes after the order's last sends; the next comes an hour
            # after this one, when the broker has forgotten every id.
            run = replace(world, reconciled=True, taken=_forgotten(world))
            yield "reconcile", self._take(run, effects, ())

    def _archiver(self, world: World) -> Iterator[tuple[str, World]]:
        """The archiver takes the finished order (its retention long past, so no request
        of it can apply any more, even late); then its id is sent to the intake again.
        Where reconciliation runs, the order is archived only once it finds nothing to
        say: the model assumes a run checked the order within its retention, which the
        real runs do only for a sample (docs/explorer.md)."""
        if not self.bounds.archive:
            return
        if not world.archived:
            if driver.finished(world.process) is None or not world.quiet():
                return
            if self.bounds.reconcile and self.domain.reconcile(
                world.process, world.now, lambda agent, key: _truth(world, agent, key)
            ):
                return  # reconciliation checks it before its retention passes (see below)
            settled = Provider(tuple(replace(e, late=False) for e in world.provider.entries))
            yield (
                "archive",
                replace(
                    world,
                    archived=True,
                    provider=settled,
                    due_nudges=0,
                    later_nudges=frozenset(),
                    replies=frozenset(),
                    notes=("archived: its mark holds the id",),
                ),
            )
            return
        if world.resent >= 1:
            return
        for same in (True, False):
            said = self.domain.submit_again(world.process, world.now, same)
            body = "its body" if same else "another body"
            after = replace(
                world, resent=world.resent + 1, reused=world.reused or said == "created"
            )
            yield (
                f"submit {driver.ORDER.order_id} again with {body}: {said}",
                replace(after, notes=(f"intake: {said}",)),
            )

    # --- the intake's claim (issue #39) ------------------------------------------------

    def _intake(self, world: World) -> Iterator[tuple[str, World]]:
        """The submission, for each client: stored claimed (within the burst), its sends
        going out or the intake dying first, or stored Pending and nudged (past it)."""
        domain = self.domain
        for notify in (Notify.ALL, Notify.FINAL):
            submitted = replace(world, deciding=False)
            claimed = domain.start_claimed(notify)
            looking = replace(submitted, first_look=domain.first_look(claimed.process))
            yield f"intake ({notify}): claimed", self._take(looking, claimed, ())
            died = replace(
                self._moved(looking, claimed),
                unsent=claimed,
                notes=(claimed.summary, "  the intake died before its sends"),
            )
            yield f"intake ({notify}): claimed, died before its sends", died
            nudged = domain.start_nudged(notify)
            yield f"intake ({notify}): nudged", self._take(submitted, nudged, ())

    def _looked(self, world: World) -> World:
        """The Supervisor's check: an order still as the intake stored it has its outbox
        sent again before anything is decided (the broker drops what already went)."""
        check = self.domain.next_check(world.process, world.now)
        watch = world.watch if check is None else check  # rescheduled to its next check
        looked = replace(world, first_look=None, watch=watch)
        unsent = world.unsent
        if unsent is None or not self.domain.as_stored_by_intake(world.process, world.now):
            return looked
        again = ("  the Supervisor sends the intake's outbox again",)
        return self._send(replace(looked, unsent=None), unsent, again, True)

    # --- the environment ------------------------------------------------------------

    def _services(self, world: World) -> Iterator[tuple[str, World]]:
        skew = driver.SKEW
        for request in sorted(world.wire):
            if world.now >= request.live_until(skew):
                continue
            arrived = self._arrive(world, request)
            if self.bounds.arrivals:
                yield f"arrive {request.describe()}", arrived
            waiting = request in arrived.calls
            space = world.space(request.agent)
            if not waiting or not arrived.provider.can_apply(space, request.key, world.now):
                continue
            for rejected in self._outcomes(arrived, space, request.key, request.undo):
                served = self._settle(arrived, space, request.key, rejected)
                how = "rejected" if rejected else "applied"
                yield f"serve {request.describe()}: {how}", served
            if self.bounds.large_results and not request.undo:
                served = self._settle(arrived, space, request.key, False)
                for large in Large:
                    sized = self._sized(served, request.key, large)
                    yield f"serve {request.describe()}: applied, {large.value}", sized
        for entry in world.provider.entries:
            if not world.provider.can_apply(entry.agent, entry.key, world.now):
                continue
            for rejected in self._outcomes(world, entry.agent, entry.key, entry.undoes is not None):
                how = "reject" if rejected else "apply"
                name = entry.key.split(":", 1)[-1]
                settled = self._settle(world, entry.agent, entry.key, rejected)
                yield f"{how} {name}@{entry.agent}", settled
        if len(world.late_applied) < self.bounds.late_applies:
            for entry in world.provider.stragglers():
                late = (entry.agent, entry.key)
                applied = world.provider.apply_late(*late)
                name = entry.key.split(":", 1)[-1]
                note = f"  ledger: {name}@{entry.agent} applied after its live time"
                after = replace(
                    world,
                    provider=applied,
                    late_applied=world.late_applied | {late},
                    told_not_applied=world.told_not_applied - {late},
                    alerted=frozenset(),
                    notes=(note,),
                )
                yield f"apply {name}@{entry.agent} late", after
                # The agent's clock was behind: it still waited, and its reply comes, with
                # the attempt its request carried (which round of the key it answers).
                step = operation_of(entry.key)
                request = Request(entry.agent, step, False, entry.key, entry.attempt, world.now)
                replied = self._replied(after, (Reply(request, True),))
                yield f"apply {name}@{entry.agent} late, reply comes", replied
                if self.bounds.large_results:
                    for large in Large:
                        sized = self._sized(replied, entry.key, large)
                        yield f"apply {name}@{entry.agent} late, reply comes ({large})", sized

    def _sized(self, world: World, key: str, large: Large) -> World:
        """The success replies just made for `key` carry a result too large to keep."""
        made = {r for r in world.replies if r.request.key == key and r.succeeded}
        sized = {replace(r, large=large.value) for r in made}
        return replace(world, replies=(world.replies - made) | sized)

    def _replied(self, world: World, answers: tuple[Reply, ...]) -> World:
        """The agents' replies, through the broker: all share `agent-replies`, so a reply
        whose id that queue took within the window is dropped."""
        ids = [(REPLIES, self.domain.reply_id(a), a) for a in answers]
        kept, taken, dropped, collision = _broker(world, ids)
        notes = world.notes + tuple(
            f"  broker dropped the reply {a.describe()}: {_DUPLICATE}" for a in dropped
        )
        return replace(
            world,
            replies=world.replies | set(kept),
            taken=taken,
            collision=world.collision or collision,
            notes=notes,
        )

    def _outcomes(self, world: World, space: str, key: str, undo: bool) -> tuple[bool, ...]:
        """False: apply; True: reject (a permanent failure, for rejectable dos, and for
        the keys the saga counts on while `Bounds.refusals` allows one more)."""
        operation = operation_of(key)
        if not undo and operation in self.bounds.rejectable:
            return (False, True)
        if self._may_refuse(world, space, key):
            return (False, True)
        return (False,)

    @property
    def refusable(self) -> frozenset[str]:
        """The operations the saga counts on succeeding in the end (docs/contract.md):
        each retriable step's do and each undo of the workflow."""
        steps = self.setup.workflow.steps
        retriable = {s.name for s in steps if s.kind is StepKind.RETRIABLE}
        return frozenset(retriable | {s.compensation for s in steps if s.compensation})

    def _may_refuse(self, world: World, space: str, key: str) -> bool:
        operation = operation_of(key)
        if operation not in self._refusable:
            return False
        if any(s == space and operation_of(k) == operation for s, k in world.mended):
            return False  # mended: it answers the operation's fresh keys afresh
        return len(world.refused | world.mended) < self.bounds.refusals

    def _arrive(self, world: World, request: Request) -> World:
        """The request reaches its service. A settled key answers at once (the agent
        replies if it is still within its complete-by); an unsettled one runs."""
        wire = world.wire - {request}
        space = world.space(request.agent)
        provider = world.provider.register(
            space, request.key, request.live_until(driver.SKEW), request.undoes, request.attempt
        )
        entry = provider.get(space, request.key)
        waiting = world.now < request.complete_by
        calls = world.calls
        answers: tuple[Reply, ...] = ()
        if entry.status is KeyStatus.RUNNING:
            if waiting:
                calls = calls | {request}
        elif waiting and entry.status in (KeyStatus.APPLIED, KeyStatus.REJECTED):
            answers = (Reply(request, entry.status is KeyStatus.APPLIED, undone=_undid(entry)),)
        elif waiting and entry.status is KeyStatus.ABANDONED:
            answers = (Reply(request, False, abandoned=True),)
        note = f"  {request.describe()} at its service: {entry.status.value}"
        arrived = replace(world, wire=wire, provider=provider, calls=calls, notes=(note,))
        return self._replied(arrived, answers)

    def _settle(self, world: World, space: str, key: str, rejected: bool) -> World:
        """The service applies (or rejects) a running key; every agent still waiting on
        it replies."""
        provider = (
            world.provider.reject(space, key) if rejected else world.provider.apply(space, key)
        )
        answered = {c for c in world.calls if world.space(c.agent) == space and c.key == key}
        entry = provider.get(space, key)
        what = entry.status.value
        if entry.undoes is not None and not rejected:
            what += " (undone)" if entry.undone else " (nothing-to-undo)"
        notes = (*world.notes, f"  ledger: {key.split(':', 1)[-1]}@{space} {what}")
        refused = world.refused
        if rejected and operation_of(key) in self._refusable:
            refused = refused | {(space, key)}
        settled = replace(
            world, provider=provider, calls=world.calls - answered, notes=notes, refused=refused
        )
        undone = _undid(entry)
        replies = tuple(Reply(c, not rejected, undone=undone) for c in sorted(answered))
        return self._replied(settled, replies)

    def _clock(self, world: World) -> Iterator[tuple[str, World]]:
        """Jump to the next instant at which anything can change."""
        skew = driver.SKEW
        instants = set(self.domain.wake_ups(world.process, world.drained))
        instants |= set(world.later_nudges)
        instants |= {t for t in (world.posts.come_back, world.posts.memo_until) if t}
        for request in world.wire | world.calls:
            instants |= {request.complete_by, request.live_until(skew)}
        instants |= {s.live_until for s in world.sent}
        instants |= {e.live_until for e in world.provider.entries}
        if world.first_look is not None:
            instants.add(world.first_look)
        if self.bounds.heartbeats:  # a beat moves a complete-by only once it is near
            instants |= {c.complete_by - driver.BEAT_LEAD for c in world.calls}
        ahead = [t for t in instants if t > world.now]
        if not ahead:
            return
        now = min(ahead)
        nudges = {t for t in world.later_nudges if t <= now}
        after = replace(
            world,
            now=now,
            due_nudges=min(world.due_nudges + len(nudges), 2),
            later_nudges=world.later_nudges - nudges,
            wire=frozenset(r for r in world.wire if now < r.live_until(skew)),
            calls=frozenset(c for c in world.calls if now < c.complete_by),
            sent=frozenset(s for s in world.sent if now < s.live_until),
            provider=world.provider.expire(now, self._late),
            taken=frozenset(t for t in world.taken if now < t.at + WINDOW),
            notes=(),
        )
        yield f"time -> t={now}", after
