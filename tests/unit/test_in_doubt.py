"""In-doubt steps: the Supervisor asks the service that holds the key, then acts on it."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace

from shared.adapters.memory.store import InMemoryHealthStore, Sent
from shared.adapters.queues import queue_of
from shared.contract import Queue, agent_queue
from shared.domain.health import AgentDrain
from shared.domain.in_doubt import (
    ABANDONED,
    IN_PROGRESS,
    NEVER_SEEN,
    NOT_APPLIED,
    NOT_SUPPORTED,
    RemoteOutcome,
)
from shared.domain.machine.forward import claim
from shared.domain.machine.operator import cancel
from shared.domain.machine.recovery import recover
from shared.domain.messages import AgentReply
from shared.domain.model import (
    ErrorInfo,
    ExhaustedPolicy,
    JsonObject,
    KeyState,
    OrderProcess,
    Outcome,
    Outgoing,
    Phase,
    ProcessState,
    StepStatus,
)
from shared.ports import RemoteCall, TransientRemoteError
from shared.resilience import CircuitBreaker
from shared.usecases.flow import scheduler
from shared.usecases.flow.deps import ProcessDeps
from shared.usecases.flow.outcomes import Asked, OutcomeQueries
from shared.usecases.flow.routing import RoutingSource
from shared.usecases.flow.submission import submit_order
from shared.usecases.flow.supervisor import SweepReport, sweep
from shared.usecases.operations.operator import cancel_order
from tests.builders import World, a_policy, a_reply, an_order
from tests.unit.test_routing import BOTH_HEALTHY, health
from tests.workflows import ORDER_FULFILMENT

CHARGE_KEY = "o-1:charge-payment"
REFUND_KEY = "o-1:refund-payment"
RESULT = {"chargeId": "ch-1", "amount": 25.0}
PAST_DEADLINE = 31  # step timeout 30 s plus the 1 s settle margin


@dataclass
class Remote:
    """A service's read API: scripted answers per key, and the keys it was asked about."""

    answers: dict[str, RemoteOutcome | Exception] = field(default_factory=dict)
    asked: list[str] = field(default_factory=list)
    abandons: dict[str, RemoteOutcome | Exception] = field(default_factory=dict)
    abandoned: list[str] = field(default_factory=list)
    meanwhile: Callable[[], Awaitable[None]] | None = None
    """Runs while the query is out (the order moves on meanwhile)."""

    async def invoke(self, call: RemoteCall, timeout: float) -> JsonObject:
        raise AssertionError("the Supervisor never calls an operation")

    async def probe(self, timeout: float) -> None:
        return None

    async def outcome(self, key: str, timeout: float) -> RemoteOutcome:
        self.asked.append(key)
        if self.meanwhile is not None:
            await self.meanwhile()
        answer = self.answers.get(key, NEVER_SEEN)
        if isinstance(answer, Exception):
            raise answer
        return answer

    async def abandon(self, key: str, timeout: float) -> RemoteOutcome:
        """Scripted per key; a key not scripted is abandoned, like a never-seen key."""
        self.abandoned.append(key)
        answer = self.abandons.get(key, ABANDONED)
        if isinstance(answer, Exception):
            raise answer
        return answer


@dataclass
class Setup:
    world: World
    deps: ProcessDeps
    health: InMemoryHealthStore
    payment: Remote
    breakers: dict[str, CircuitBreaker]
    charge: Outgoing | None = None
    """The payment request that went unanswered."""

    def charge_reply(self) -> AgentReply:
        assert self.charge is not None
        return a_reply(self.charge)

    def queries(self) -> OutcomeQueries:
        services = {
            "payment": Asked(self.payment, self.breakers["payment"]),
            "payment-secondary": Asked(Remote(), self.breakers["payment-secondary"]),
        }
        return OutcomeQueries(services, self.world.clock)

    async def sweep(self) -> SweepReport:
        return await sweep(self.deps, queries=self.queries())

    def requests(self, queue: str) -> list[Sent]:
        return self.world.bus.take(queue)

    async def history(self) -> list[str]:
        return [h.detail for h in await self.world.store.history("o-1")]

    async def healthy(self, *agents: str) -> None:
        for agent in agents:
            await self.health.publish_health(health(agent, at=self.world.clock.now()))


async def at_payment(world: World | None = None, *healthy: str) -> Setup:
    """Order o-1 submitted, inventory reserved, its charge sent to payment and unanswered."""
    world = world or World()
    store = InMemoryHealthStore()
    deps = replace(world.deps(), routing=RoutingSource(store, world.clock))
    breakers = {a: CircuitBreaker(a, world.clock) for a in ("payment", "payment-secondary")}
    setup = Setup(world, deps, store, Remote(), breakers)
    await setup.healthy(*healthy)
    await submit_order(deps, an_order("o-1", clock=world.clock))
    world.bus.take(Queue.SCHEDULER)
    (reserve,) = setup.requests(agent_queue("inventory"))
    await scheduler.on_reply(deps, a_reply(reserve))
    (setup.charge,) = setup.requests(agent_queue("payment"))
    assert setup.charge.body["idempotencyKey"] == CHARGE_KEY
    return setup


async def next_claim(setup: Setup) -> None:
    setup.world.clock.advance(2)
    await setup.healthy(*(h.agent for h in BOTH_HEALTHY))
    await scheduler.on_nudge(setup.deps, "o-1")


async def test_an_applied_charge_is_recorded_completed_and_the_order_goes_on() -> None:
    setup = await at_payment()
    setup.payment.answers[CHARGE_KEY] = RemoteOutcome.applied(RESULT)
    setup.world.clock.advance(PAST_DEADLINE)

    report = await setup.sweep()

    assert (report.in_doubt_applied, report.requeued) == (1, 1)
    process = await setup.world.store.load("o-1")
    assert process is not None
    assert process.state.failure_count == 0
    assert process.state.process_state is ProcessState.PENDING
    assert (process.steps[1].status, process.steps[1].result) == (StepStatus.COMPLETED, RESULT)
    assert any(
        "payment had applied key o-1:charge-payment" in d and "without calling again" in d
        for d in await setup.history()
    )
    await next_claim(setup)
    assert setup.requests(agent_queue("payment")) == []
    (ship,) = setup.requests(agent_queue("shipping"))
    await scheduler.on_reply(setup.deps, a_reply(ship))
    final = await setup.world.store.load("o-1")
    assert final is not None and final.state.process_state is ProcessState.PROCESSED


async def test_an_applied_refund_is_recorded_compensated_and_the_undo_goes_on() -> None:
    setup = await at_payment()
    await scheduler.on_reply(setup.deps, setup.charge_reply())
    (ship,) = setup.requests(agent_queue("shipping"))
    await scheduler.on_reply(setup.deps, a_reply(ship, Outcome.FAILED))
    (refund,) = setup.requests(agent_queue("payment"))
    assert (refund.body["action"], refund.body["idempotencyKey"]) == ("compensate", REFUND_KEY)
    setup.payment.answers[REFUND_KEY] = RemoteOutcome.applied({"refundId": "r-1"})
    setup.world.clock.advance(PAST_DEADLINE)

    report = await setup.sweep()

    assert report.in_doubt_applied == 1
    assert setup.payment.asked == [REFUND_KEY]
    process = await setup.world.store.load("o-1")
    assert process is not None and process.state.failure_count == 0
    assert process.steps[1].status is StepStatus.COMPENSATED
    await next_claim(setup)
    assert setup.requests(agent_queue("payment")) == []
    (release,) = setup.requests(agent_queue("inventory"))
    assert (release.body["step"], release.body["action"]) == ("reserve-inventory", "compensate")


async def test_not_applied_while_a_request_may_still_apply_keeps_the_retry_with_its_key() -> None:
    setup = await at_payment(None, "payment", "payment-secondary")
    setup.payment.answers[CHARGE_KEY] = NOT_APPLIED
    setup.payment.abandons[CHARGE_KEY] = NOT_SUPPORTED  # a provider without abandon
    setup.world.clock.advance(PAST_DEADLINE)  # live until T0+35: a request may be on the wire

    report = await setup.sweep()

    assert (report.in_doubt_not_applied, report.requeued) == (1, 1)
    process = await setup.world.store.load("o-1")
    assert process is not None and process.state.failure_count == 1
    assert process.steps[1].suspect is None
    await next_claim(setup)
    assert setup.requests(agent_queue("payment-secondary")) == []
    (retry,) = setup.requests(agent_queue("payment"))
    assert retry.body["idempotencyKey"] == CHARGE_KEY
    assert any("a request may still apply" in d for d in await setup.history())


async def test_not_applied_past_the_live_time_moves_the_retry_to_a_healthy_alternative() -> None:
    setup = await at_payment(None, "payment", "payment-secondary")
    setup.payment.answers[CHARGE_KEY] = NOT_APPLIED
    setup.payment.abandons[CHARGE_KEY] = NOT_SUPPORTED  # a provider without abandon
    setup.world.clock.advance(36)

    report = await setup.sweep()

    assert (report.in_doubt_not_applied, report.requeued) == (1, 1)
    process = await setup.world.store.load("o-1")
    assert process is not None and process.state.failure_count == 1
    assert process.steps[1].suspect == "payment"
    assert process.steps[1].key_state is KeyState.NOT_APPLIED
    await next_claim(setup)
    assert setup.requests(agent_queue("payment")) == []
    (retry,) = setup.requests(agent_queue("payment-secondary"))
    assert retry.body["idempotencyKey"] == CHARGE_KEY
    process = await setup.world.store.load("o-1")
    assert process is not None
    assert (process.steps[1].agent, process.steps[1].suspect) == ("payment-secondary", None)
    history = await setup.history()
    assert any("payment had not applied key o-1:charge-payment (settled" in d for d in history)
    assert any(
        "agent-payment-secondary (instead of payment: its attempt timed out and its key is "
        "settled not applied)" in d
        for d in history
    )


async def test_a_drained_primary_is_abandoned_and_the_retry_moves_to_the_secondary() -> None:
    """Finding 8: the primary said "not applied" and is drained; its key is abandoned,
    so the retry goes to the healthy secondary at once instead of waiting for undrain."""
    setup = await at_payment(None, "payment", "payment-secondary")
    drain = AgentDrain("payment", True, "maintenance", setup.world.clock.now())
    await setup.health.set_drain(drain)
    setup.world.clock.advance(PAST_DEADLINE)

    report = await setup.sweep()

    assert setup.payment.abandoned == [CHARGE_KEY]
    assert report.requeued == 1
    process = await setup.world.store.load("o-1")
    assert process is not None and process.steps[1].abandoned_at == ("payment",)
    await next_claim(setup)
    assert setup.requests(agent_queue("payment")) == []
    (retry,) = setup.requests(agent_queue("payment-secondary"))
    assert retry.body["idempotencyKey"] == CHARGE_KEY


async def test_never_seen_is_as_safe_as_not_applied() -> None:
    setup = await at_payment(None, "payment", "payment-secondary")
    setup.payment.answers[CHARGE_KEY] = NEVER_SEEN
    setup.payment.abandons[CHARGE_KEY] = NOT_SUPPORTED  # a provider without abandon
    setup.world.clock.advance(36)

    assert (await setup.sweep()).in_doubt_not_applied == 1

    await next_claim(setup)
    assert len(setup.requests(agent_queue("payment-secondary"))) == 1
    assert any("payment never saw key" in d for d in await setup.history())


async def test_not_applied_without_a_healthy_alternative_retries_at_the_same_agent() -> None:
    setup = await at_payment()
    setup.payment.answers[CHARGE_KEY] = NOT_APPLIED
    setup.payment.abandons[CHARGE_KEY] = NOT_SUPPORTED  # a provider without abandon
    setup.world.clock.advance(PAST_DEADLINE)
    await setup.sweep()
    setup.world.clock.advance(2)
    await setup.healthy("payment")  # the secondary was never heard from
    await scheduler.on_nudge(setup.deps, "o-1")
    assert len(setup.requests(agent_queue("payment"))) == 1
    assert setup.requests(agent_queue("payment-secondary")) == []


async def test_in_progress_and_no_answer_retry_where_the_key_lives() -> None:
    for answer, said in (
        (IN_PROGRESS, "payment still runs key"),
        (TransientRemoteError("http-503", "down"), "payment gave no answer"),
    ):
        setup = await at_payment(None, "payment", "payment-secondary")
        setup.payment.answers[CHARGE_KEY] = answer
        setup.world.clock.advance(PAST_DEADLINE)

        report = await setup.sweep()

        assert (report.in_doubt_unanswered, report.requeued) == (1, 1)
        process = await setup.world.store.load("o-1")
        assert process is not None and process.state.failure_count == 1
        await next_claim(setup)
        assert len(setup.requests(agent_queue("payment"))) == 1
        assert setup.requests(agent_queue("payment-secondary")) == []
        assert any(said in d for d in await setup.history())


async def test_nothing_is_asked_before_the_settle_margin_has_passed() -> None:
    setup = await at_payment()
    setup.payment.answers[CHARGE_KEY] = NOT_APPLIED
    setup.world.clock.advance(30.5)

    report = await setup.sweep()

    assert (report.recovered, report.rescheduled, setup.payment.asked) == (0, 1, [])
    setup.world.clock.advance(0.5)
    assert (await setup.sweep()).in_doubt_not_applied == 1


async def test_an_open_breaker_sends_no_query_and_keeps_todays_rule() -> None:
    setup = await at_payment(None, "payment", "payment-secondary")
    setup.world.clock.advance(PAST_DEADLINE)
    for _ in range(5):  # the agents' calls just tripped it
        setup.breakers["payment"].record_failure()

    report = await setup.sweep()

    assert (report.in_doubt_unanswered, setup.payment.asked) == (1, [])
    assert any("circuit open" in d for d in await setup.history())


async def test_a_reply_that_lands_while_asking_wins_and_the_answer_changes_nothing() -> None:
    setup = await at_payment()
    late = setup.charge_reply()

    async def reply_lands() -> None:
        await scheduler.on_reply(setup.deps, late)

    setup.payment.answers[CHARGE_KEY] = RemoteOutcome.applied(RESULT)
    setup.payment.meanwhile = reply_lands
    setup.world.clock.advance(PAST_DEADLINE)

    report = await setup.sweep()

    assert (report.lost_races, report.recovered, report.in_doubt) == (1, 0, 0)
    process = await setup.world.store.load("o-1")
    assert process is not None and process.state.process_state is ProcessState.PROCESSING
    assert process.steps[1].result == late.result
    assert len(setup.requests(agent_queue("shipping"))) == 1
    assert setup.world.bus.take(Queue.SCHEDULER) == []


async def test_exhausted_compensate_skips_undoing_a_step_known_not_applied() -> None:
    """Finding 10's rule under ExhaustedPolicy=compensate: the charge the service never saw
    is settled by abandoning its key, and a key abandoned (never applied) is not refunded."""
    world = World(policy=a_policy(max_failure_count=1, exhausted=ExhaustedPolicy.COMPENSATE))
    setup = await at_payment(world)
    setup.world.clock.advance(PAST_DEADLINE)

    assert (await setup.sweep()).compensating == 1
    assert setup.payment.abandoned == [CHARGE_KEY]

    await next_claim(setup)
    assert setup.requests(agent_queue("payment")) == []
    (undo,) = setup.requests(agent_queue("inventory"))
    assert (undo.body["step"], undo.body["action"]) == ("reserve-inventory", "compensate")


async def loaded(setup: Setup) -> OrderProcess:
    process = await setup.world.store.load("o-1")
    assert process is not None
    return process


async def test_recover_takes_an_applied_answer_only_once_the_deadline_passed() -> None:
    setup = await at_payment()
    policy, clock = setup.world.policy, setup.world.clock
    process = await loaded(setup)
    applied = RemoteOutcome.applied(RESULT)

    assert recover(process, ORDER_FULFILMENT, policy, clock.now(), outcome=applied) is None
    clock.advance(PAST_DEADLINE)
    # The system's own outage does not stop a known effect from being recorded.
    moved = recover(process, ORDER_FULFILMENT, policy, clock.now(), count=False, outcome=applied)

    assert moved is not None
    assert moved.process.steps[1].status is StepStatus.COMPLETED
    assert moved.process.state.failure_count == 0


async def test_a_cancelled_order_records_an_applied_charge_then_undoes_it() -> None:
    setup = await at_payment()
    policy, clock = setup.world.policy, setup.world.clock
    cancelling = cancel(await loaded(setup), ORDER_FULFILMENT, policy, clock.now())
    assert cancelling is not None
    assert cancelling.process.state.process_state is ProcessState.COMPENSATING
    clock.advance(PAST_DEADLINE)

    resolved = recover(
        cancelling.process,
        ORDER_FULFILMENT,
        policy,
        clock.now(),
        outcome=RemoteOutcome.applied(RESULT),
    )

    assert resolved is not None
    state = resolved.process.state
    assert (state.process_state, state.phase) == (ProcessState.PENDING, Phase.COMPENSATE)
    assert resolved.process.steps[1].status is StepStatus.COMPLETED
    claimed = claim(resolved.process, ORDER_FULFILMENT, policy, "s-1", clock.now())
    assert claimed is not None
    (refund,) = [m for m in claimed.outgoing if queue_of(m.destination) == agent_queue("payment")]
    assert (refund.body["action"], refund.body["idempotencyKey"]) == ("compensate", REFUND_KEY)


async def test_a_do_answered_abandoned_moves_to_another_provider_not_into_compensation() -> None:
    """A Supervisor abandoned the key at payment and lost its write to another's: the
    order did not learn it, and sent the retry there again. The answer itself is the
    evidence: the retry goes to the secondary provider with the same key."""
    world = World()
    deps = world.deps()
    await submit_order(deps, an_order("o-1", clock=world.clock))
    (reserve,) = world.bus.take(agent_queue("inventory"))
    await scheduler.on_reply(deps, a_reply(reserve))
    (charge,) = world.bus.take(agent_queue("payment"))
    abandoned = ErrorInfo("operation-abandoned", "the key was abandoned")
    await scheduler.on_reply(deps, a_reply(charge, Outcome.FAILED, error=abandoned))
    process = await world.store.load("o-1")
    assert process is not None
    assert process.state.process_state is ProcessState.PENDING
    assert process.steps[1].abandoned_at == ("payment",)
    for nudge in world.bus.take(Queue.SCHEDULER):
        await scheduler.on_nudge(deps, nudge.body["orderId"], nudge.message_id)
    assert world.bus.take(agent_queue("payment")) == []
    (retry,) = world.bus.take(agent_queue("payment-secondary"))
    assert retry.message_id != charge.message_id
    assert retry.body["idempotencyKey"] == charge.body["idempotencyKey"]
    assert world.bus.take(agent_queue("inventory")) == []


async def test_a_not_applied_key_is_not_abandoned_when_the_retry_would_stay_anyway() -> None:
    """Only the primary is healthy: the Supervisor's retry stays with it, so its key is
    asked about, never abandoned (an abandon would make the retry fail there)."""
    setup = await at_payment(None, "payment")
    setup.payment.answers[CHARGE_KEY] = NOT_APPLIED
    setup.world.clock.advance(PAST_DEADLINE)

    await setup.sweep()

    assert setup.payment.abandoned == []
    await setup.healthy("payment")
    setup.world.clock.advance(2)
    await scheduler.on_nudge(setup.deps, "o-1")
    (retry,) = setup.requests(agent_queue("payment"))
    assert retry.body["idempotencyKey"] == CHARGE_KEY


async def test_a_not_applied_key_is_abandoned_when_a_healthy_alternative_takes_the_retry() -> None:
    setup = await at_payment(None, "payment", "payment-secondary")
    setup.payment.answers[CHARGE_KEY] = NOT_APPLIED
    setup.world.clock.advance(PAST_DEADLINE)

    await setup.sweep()

    assert setup.payment.abandoned == [CHARGE_KEY]


async def test_the_secondarys_key_stays_when_routing_prefers_the_abandoned_primary() -> None:
    """Seed 11 of chaos: the charge moved to the secondary after its key was abandoned at
    the primary; the secondary timed out too. Routing still ranks the primary first, but
    the key can never go back there: the secondary's key must not be abandoned for a
    move that cannot happen (both abandoned left the order with no provider)."""
    setup = await at_payment(None, "payment", "payment-secondary")
    setup.payment.answers[CHARGE_KEY] = NOT_APPLIED
    setup.world.clock.advance(PAST_DEADLINE)
    await setup.sweep()
    assert setup.payment.abandoned == [CHARGE_KEY]
    await next_claim(setup)
    (moved,) = setup.requests(agent_queue("payment-secondary"))
    secondary = Remote()
    secondary.answers[CHARGE_KEY] = NOT_APPLIED
    setup.queries = lambda: OutcomeQueries(  # type: ignore[method-assign]
        {
            "payment": Asked(setup.payment, setup.breakers["payment"]),
            "payment-secondary": Asked(secondary, setup.breakers["payment-secondary"]),
        },
        setup.world.clock,
    )
    setup.world.clock.advance(PAST_DEADLINE)

    await setup.sweep()

    assert secondary.abandoned == []
    process = await loaded(setup)
    assert process.steps[1].abandoned_at == ("payment",)
    await next_claim(setup)
    (retry,) = setup.requests(agent_queue("payment-secondary"))
    assert retry.body["idempotencyKey"] == moved.body["idempotencyKey"]


async def test_a_settle_wait_answered_applied_says_so_in_the_history() -> None:
    """A cancel waits for the charge; payment says "in progress", then, past the live
    time, "applied": the history says payment had applied the key (not "no answer"),
    and the refund follows."""
    setup = await at_payment()
    clock = setup.world.clock
    await cancel_order(setup.deps, "o-1", "op")
    setup.payment.answers[CHARGE_KEY] = IN_PROGRESS
    setup.payment.abandons[CHARGE_KEY] = IN_PROGRESS
    clock.advance(PAST_DEADLINE)
    await setup.sweep()
    setup.payment.answers[CHARGE_KEY] = RemoteOutcome.applied(RESULT)
    setup.payment.abandons[CHARGE_KEY] = RemoteOutcome.applied(RESULT)
    clock.advance(6)  # past the live time the "in progress" answer extended

    await setup.sweep()

    history = await setup.history()
    assert any("payment had applied key o-1:charge-payment" in d for d in history)
    assert not any("gave no answer" in d for d in history)
    await next_claim(setup)
    (refund,) = setup.requests(agent_queue("payment"))
    assert refund.body["idempotencyKey"] == REFUND_KEY
