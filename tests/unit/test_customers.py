"""Fairness between customers and the intake quota through the use cases, on in-memory
adapters: a FIFO pump plays the broker, agents answer at once."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from datetime import timedelta

import pytest

from shared.adapters.memory.customers import InMemoryCustomerLedger
from shared.contract import Queue, agent_queue
from shared.domain.fairness import RETRY_AFTER_SECONDS, CustomerLoad, CustomerPolicy
from shared.domain.model import Order, Priority, ProcessState
from shared.usecases.flow import scheduler
from shared.usecases.flow.deps import ProcessDeps
from shared.usecases.flow.submission import OrderConflict, OverQuota, submit_order
from shared.usecases.flow.supervisor import sweep
from shared.usecases.limits.customers import Customers
from shared.usecases.operations.events import send_event
from shared.usecases.operations.operator import resume_order, suspend_order
from tests.builders import World, a_reply, an_order
from tests.unit.test_waits import APPROVED
from tests.workflows import REVIEWED_ORDER

AGENTS = {agent_queue(a) for a in ("inventory", "payment", "shipping")}
INVENTORY = agent_queue("inventory")


@dataclass
class Shop(World):
    ledger: InMemoryCustomerLedger = field(default_factory=InMemoryCustomerLedger)
    rules: CustomerPolicy | None = None
    claimed: list[str] = field(default_factory=list)
    _customers: Customers | None = None

    def deps(
        self, instance_id: str = "scheduler-1", *, claim_at_intake: bool = True
    ) -> ProcessDeps:
        """One Customers for the shop, as one instance builds it once."""
        if self._customers is None and self.rules is not None:
            self._customers = Customers(self.ledger, self.rules)
        deps = super().deps(instance_id, claim_at_intake=claim_at_intake)
        return replace(deps, customers=self._customers)

    async def submit(self, customer: str, order_id: str) -> None:
        submitted = await submit_order(self.deps(), order(customer, order_id))
        if submitted.created and submitted.process_state is ProcessState.PROCESSING:
            self.claimed.append(order_id)  # claimed at intake: its turn had come

    async def pump(self, limit: int = 10_000) -> None:
        """Deliver every message in the order it was sent, one at a time, like one lane of
        the broker; each agent answers its request with success at once."""
        for _ in range(limit):
            pending = [m for m in self.bus.sent if m.queue == Queue.SCHEDULER or m.queue in AGENTS]
            if not pending:
                return
            message = pending[0]
            self.bus.sent.remove(message)
            if message.queue == Queue.SCHEDULER:
                before = await self.store.load(message.body["orderId"])
                await scheduler.on_nudge(self.deps(), message.body["orderId"], message.message_id)
                after = await self.store.load(message.body["orderId"])
                assert before is not None and after is not None
                if after.state.attempt > before.state.attempt:
                    self.claimed.append(after.order_id)
            else:
                await scheduler.on_reply(self.deps(), a_reply(message))
        raise AssertionError("the pump did not drain")

    async def state(self, order_id: str) -> ProcessState:
        process = await self.store.load(order_id)
        assert process is not None
        return process.state.process_state


def order(customer: str, order_id: str) -> Order:
    return replace(an_order(order_id), customer_id=customer)


async def backlog_then_one(shop: Shop) -> None:
    for i in range(20):
        await shop.submit("A", f"a-{i}")
    await shop.submit("B", "b-0")
    await shop.pump()


async def test_with_a_fair_share_b_is_claimed_before_a_backlog_drains() -> None:
    shop = Shop(rules=CustomerPolicy(fair_share=2))
    await backlog_then_one(shop)
    assert shop.claimed.index("b-0") <= 2  # after A's two running orders at most
    assert len(shop.claimed) == 21  # every order of A still ran, promoted in turn
    assert shop.claimed[:2] + [c for c in shop.claimed if c.startswith("a-")][2:] == [
        f"a-{i}" for i in range(20)
    ]  # A's orders ran in the order A sent them
    for i in range(20):
        assert await shop.state(f"a-{i}") is ProcessState.PROCESSED
    assert await shop.ledger.loads(10) == ()  # every order left the ledger


async def test_without_the_mechanism_b_waits_behind_all_of_a() -> None:
    shop = Shop(rules=None)
    await backlog_then_one(shop)
    assert shop.claimed.index("b-0") == 20


async def test_an_order_waiting_in_line_is_not_checked_before_its_hold() -> None:
    shop = Shop(rules=CustomerPolicy(fair_share=1))
    await shop.submit("A", "a-0")
    await shop.submit("A", "a-1")
    waiting = await shop.store.load("a-1")
    assert waiting is not None
    assert [m.body["orderId"] for m in shop.bus.on(INVENTORY)] == ["a-0"]  # claimed at intake
    assert shop.bus.on(Queue.SCHEDULER) == []
    assert waiting.state.complete_by is not None
    shop.clock.advance(61)  # past the Pending timeout: still in line
    report = await sweep(shop.deps())
    assert "a-1" not in report.recovered_orders  # a-0 is, its request never answered
    assert await shop.state("a-1") is ProcessState.PENDING


async def test_a_lost_promotion_is_healed_by_the_supervisor_when_the_hold_passes() -> None:
    shop = Shop(rules=CustomerPolicy(fair_share=1))
    await shop.submit("A", "a-0")
    await shop.submit("A", "a-1")
    await shop.pump()
    assert await shop.state("a-0") is ProcessState.PROCESSED
    assert await shop.state("a-1") is ProcessState.PROCESSED
    # now lose one: the promotion nudge never arrives
    await shop.submit("A", "a-2")
    await shop.submit("A", "a-3")
    shop.bus.sent = [m for m in shop.bus.sent if m.message_id != "nudge:a-3:fair-share"]
    original_send = shop.bus.send

    async def drop_promotions(messages):  # type: ignore[no-untyped-def]
        await original_send([m for m in messages if not m.message_id.endswith(":fair-share")])

    shop.bus.send = drop_promotions  # type: ignore[method-assign]
    await shop.pump()
    assert await shop.state("a-2") is ProcessState.PROCESSED
    assert await shop.state("a-3") is ProcessState.PENDING
    shop.bus.send = original_send  # type: ignore[method-assign]
    shop.clock.advance(11 * 60)
    await sweep(shop.deps())
    await shop.pump()
    assert await shop.state("a-3") is ProcessState.PROCESSED


async def test_over_the_quota_nothing_is_stored_and_the_id_is_taken_once_below() -> None:
    shop = Shop(rules=CustomerPolicy(max_pending=2))
    await shop.submit("A", "a-0")
    await shop.submit("A", "a-1")
    sent = len(shop.bus.sent)
    with pytest.raises(OverQuota) as refused:
        await shop.submit("A", "a-2")
    assert refused.value.load == CustomerLoad(running=2) and refused.value.limit == 2
    assert refused.value.retry_after > 0
    assert await shop.store.load("a-2") is None
    assert "a-2" not in shop.store.watched()
    assert len(shop.bus.sent) == sent
    await shop.submit("B", "b-0")  # another customer is not held back by A's quota
    await shop.submit("A", "a-0")  # a repeat of a counted order is no new order
    await shop.pump()  # A's orders finish: the count goes down
    assert await shop.ledger.loads(10) == ()
    await shop.submit("A", "a-2")
    assert await shop.state("a-2") is ProcessState.PROCESSING


async def test_a_refused_customer_is_refused_again_from_memory_for_a_moment() -> None:
    """Under one customer's burst each refusal would cost a watch entry, a ledger
    transaction and a delete; for a moment after one, the instance refuses from memory."""
    shop = Shop(rules=CustomerPolicy(max_pending=2))
    entered: list[str] = []
    real_enter = shop.ledger.enter

    async def counting(customer, order_id, *args, **kwargs):  # type: ignore[no-untyped-def]
        entered.append(order_id)
        return await real_enter(customer, order_id, *args, **kwargs)

    shop.ledger.enter = counting  # type: ignore[method-assign]
    await shop.submit("A", "a-0")
    await shop.submit("A", "a-1")
    with pytest.raises(OverQuota):
        await shop.submit("A", "a-2")
    watched = shop.store.watched()
    with pytest.raises(OverQuota) as again:
        await shop.submit("A", "a-3")
    assert again.value.load == CustomerLoad(running=2) and again.value.retry_after > 0
    assert entered == ["a-0", "a-1", "a-2"]  # the ledger was not asked
    assert shop.store.watched() == watched and await shop.store.load("a-3") is None
    await shop.submit("A", "a-0")  # a repeat of a stored order still gets it back
    await shop.submit("B", "b-0")  # another customer is not held
    shop.clock.advance(1)
    with pytest.raises(OverQuota):
        await shop.submit("A", "a-4")
    assert entered[-1] == "a-4"  # the moment passed: the ledger is asked again
    await shop.pump()  # A's orders end here: this instance's leave forgets the refusal
    await shop.submit("A", "a-5")
    assert await shop.state("a-5") is ProcessState.PROCESSING


async def test_the_count_goes_down_when_an_order_rests_and_up_when_it_moves_again() -> None:
    shop = Shop(rules=CustomerPolicy(max_pending=5))
    await shop.submit("A", "a-0")  # claimed at intake
    assert await shop.ledger.loads(10) == (("A", CustomerLoad(running=1)),)
    await suspend_order(shop.deps(), "a-0", "ops")
    assert await shop.ledger.loads(10) == ()
    await resume_order(shop.deps(), "a-0", "ops")
    assert await shop.ledger.loads(10) == (("A", CustomerLoad(running=1)),)


async def test_an_order_finished_but_not_left_is_left_by_the_supervisor() -> None:
    """A crash between the terminal save and the leave: the order is still watched."""
    shop = Shop(rules=CustomerPolicy(max_pending=5))
    await shop.submit("A", "a-0")
    real = shop.ledger.leave
    crashed = []

    async def crash(*args, **kwargs):  # type: ignore[no-untyped-def]
        crashed.append(args)
        raise RuntimeError("died")

    shop.ledger.leave = crash  # type: ignore[method-assign]
    with pytest.raises(RuntimeError):
        await shop.pump()
    shop.ledger.leave = real  # type: ignore[method-assign]
    assert crashed and await shop.state("a-0") is ProcessState.PROCESSED
    assert await shop.ledger.loads(10) == (("A", CustomerLoad(running=1)),)
    shop.clock.advance(5 * 60)
    await sweep(shop.deps())
    assert await shop.ledger.loads(10) == ()


async def test_a_count_whose_order_was_never_created_is_released_by_the_supervisor() -> None:
    """A crash between the ledger entry and the create: the watch entry names the
    customer, so the Supervisor that finds the order missing gives the slot back and
    the next in line goes, long before that one's hold passes."""
    shop = Shop(rules=CustomerPolicy(fair_share=1, max_pending=2))
    real = shop.store.create

    async def crash(*args, **kwargs):  # type: ignore[no-untyped-def]
        raise RuntimeError("died")

    shop.store.create = crash  # type: ignore[method-assign]
    with pytest.raises(RuntimeError):
        await shop.submit("A", "a-0")
    shop.store.create = real  # type: ignore[method-assign]
    await shop.submit("A", "a-1")  # behind the count a-0 left
    assert await shop.ledger.loads(10) == (("A", CustomerLoad(running=1, waiting=1)),)
    shop.clock.advance(61)  # a-0's entry is due; a-1's hold is 10 minutes away
    await sweep(shop.deps())
    assert "a-0" not in shop.store.watched()
    assert await shop.ledger.loads(10) == (("A", CustomerLoad(running=1)),)
    await shop.pump()
    assert await shop.state("a-1") is ProcessState.PROCESSED
    assert await shop.ledger.loads(10) == ()


async def test_an_order_still_in_line_when_its_hold_passes_keeps_its_place() -> None:
    """Its turn has not come (its customer's running order runs long): nudging it would
    run it out of turn, so the Supervisor extends its hold instead."""
    shop = Shop(rules=CustomerPolicy(fair_share=1))
    await shop.submit("A", "a-0")
    await shop.submit("A", "a-1")
    shop.bus.take(Queue.SCHEDULER)
    await scheduler.on_nudge(shop.deps(), "a-0")  # claimed; its agent takes long
    shop.clock.advance(11 * 60)
    await sweep(shop.deps())
    assert not [m for m in shop.bus.on(Queue.SCHEDULER) if m.body["orderId"] == "a-1"]
    assert await shop.state("a-1") is ProcessState.PENDING
    assert shop.store.watched()["a-1"] > shop.clock.now() + timedelta(minutes=9)
    await shop.pump()  # a-0 goes on (its step was redispatched) and promotes a-1
    assert await shop.state("a-0") is ProcessState.PROCESSED
    assert await shop.state("a-1") is ProcessState.PROCESSED
    assert shop.claimed.index("a-1") > shop.claimed.index("a-0")


async def test_a_promotion_whose_nudge_was_lost_is_nudged_at_its_recheck() -> None:
    """Promoted (the ledger counts it running) but the nudge never went: the Supervisor
    nudges it when the moved-up check comes due, not when its hold passes."""
    shop = Shop(rules=CustomerPolicy(fair_share=1))
    await shop.submit("A", "a-0")
    await shop.submit("A", "a-1")
    original_send = shop.bus.send

    async def drop_promotions(messages):  # type: ignore[no-untyped-def]
        await original_send([m for m in messages if not m.message_id.endswith(":fair-share")])

    shop.bus.send = drop_promotions  # type: ignore[method-assign]
    await shop.pump()
    shop.bus.send = original_send  # type: ignore[method-assign]
    assert await shop.state("a-1") is ProcessState.PENDING
    shop.clock.advance(61)
    await sweep(shop.deps())
    await shop.pump()
    assert await shop.state("a-1") is ProcessState.PROCESSED


async def test_a_promotion_before_the_create_keeps_its_early_check() -> None:
    """Found by a chaos run (1,000 orders, `c1-f242-00778` waited its whole hold): the
    customer's running order came to rest between a waiting order's ledger entry and its
    create. The promotion moved the waiting order's check up and sent its nudge, which
    found no order yet (dead-lettered); then the intake's own write of the hold replaced
    the promotion's check, so nothing looked at the order for 10 minutes."""
    shop = Shop(rules=CustomerPolicy(fair_share=1))
    await shop.submit("A", "a-0")
    entered = shop.ledger.enter
    lost: list[scheduler.Handled] = []

    async def a_0_rests_meanwhile(customer, order_id, *args, **kwargs):  # type: ignore[no-untyped-def]
        admitted = await entered(customer, order_id, *args, **kwargs)
        if order_id == "a-1":
            await suspend_order(shop.deps(), "a-0", "ops")  # its leave promotes a-1
            for nudge in shop.bus.take(Queue.SCHEDULER):
                if nudge.message_id == "nudge:a-1:fair-share":
                    lost.append(await scheduler.on_nudge(shop.deps(), "a-1", nudge.message_id))
        return admitted

    shop.ledger.enter = a_0_rests_meanwhile  # type: ignore[method-assign]
    await shop.submit("A", "a-1")
    shop.ledger.enter = entered  # type: ignore[method-assign]
    assert lost == [scheduler.Handled.UNKNOWN_ORDER], "the promotion's nudge came too early"
    assert await shop.state("a-1") is ProcessState.PENDING
    shop.clock.advance(31)  # the promotion's check, long before the hold
    await sweep(shop.deps())
    await shop.pump()
    assert await shop.state("a-1") is ProcessState.PROCESSED


async def test_a_repeat_of_a_finished_order_at_the_quota_answers_the_stored_order() -> None:
    shop = Shop(rules=CustomerPolicy(max_pending=1))
    await shop.submit("A", "a-0")
    await shop.pump()
    await shop.submit("A", "a-1")  # at the quota now
    again = await submit_order(shop.deps(), order("A", "a-0"))
    assert not again.created
    assert again.process_state is ProcessState.PROCESSED
    assert "a-0" not in shop.store.watched()
    assert await shop.ledger.loads(10) == (("A", CustomerLoad(running=1)),)
    with pytest.raises(OrderConflict):  # a different body under that id is still a conflict
        await submit_order(shop.deps(), replace(order("A", "a-0"), fingerprint="other"))


async def test_a_promotion_goes_on_the_lane_of_the_promoted_order() -> None:
    shop = Shop(rules=CustomerPolicy(fair_share=1))
    await shop.submit("A", "a-0")
    await submit_order(shop.deps(), replace(order("A", "a-1"), priority=Priority.HIGH))
    await shop.pump()  # a-0 ends; the pump plays the normal lane only
    promoted = [m for m in shop.bus.sent if m.message_id == "nudge:a-1:fair-share"]
    assert [m.queue for m in promoted] == [Queue.SCHEDULER_HIGH]


async def test_retry_after_follows_how_fast_the_customers_orders_end() -> None:
    shop = Shop(rules=CustomerPolicy(max_pending=3))
    for i in range(3):
        await shop.submit("A", f"a-{i}")
    with pytest.raises(OverQuota) as fresh:
        await shop.submit("A", "a-9")
    assert fresh.value.retry_after == RETRY_AFTER_SECONDS  # nothing ended yet: the default
    for i in range(3, 9):  # one of A's orders ends every 20 s, one comes in
        shop.clock.advance(20)
        await suspend_order(shop.deps(), f"a-{i - 3}", "ops")
        await shop.submit("A", f"a-{i}")
    with pytest.raises(OverQuota) as paced:
        await shop.submit("A", "a-9")
    assert 15 <= paced.value.retry_after <= 20


async def test_an_order_created_meanwhile_by_a_retry_is_counted_again() -> None:
    """The Supervisor gave back the count of an order it found missing, and a retry of
    that intake created the order just then: the order is counted again (running)."""
    shop = Shop(rules=CustomerPolicy(fair_share=1))
    await shop.submit("A", "a-0")
    customers = shop.deps().customers
    assert customers is not None
    await customers.never_created("A", "a-0", shop.store, shop.bus, shop.clock.now())
    assert await shop.ledger.loads(10) == (("A", CustomerLoad(running=1)),)


async def test_refused_posts_are_told_to_come_back_one_pace_apart_and_a_repeat_books_none() -> None:
    shop = Shop(rules=CustomerPolicy(max_pending=2))
    await shop.submit("A", "a-0")
    await shop.submit("A", "a-1")
    shop.ledger.customers["A"].paced = CustomerLoad(pace=0.6)  # its orders end 0.6 s apart
    told = []
    for i in range(2, 6):
        with pytest.raises(OverQuota) as refused:
            await shop.submit("A", f"a-{i}")
        told.append(refused.value.retry_after)
    assert told == [1, 2, 2, 3]  # 0.6, 1.2, 1.8, 2.4 s from now
    await shop.submit("A", "a-0")  # a repeat of a stored order: its order, no turn taken
    with pytest.raises(OverQuota) as refused:
        await shop.submit("A", "a-6")
    assert refused.value.retry_after == 3  # 3.0 s: the repeat moved nothing


async def test_an_event_between_a_promotion_and_its_claim_leaves_the_claimed_step_watched() -> None:
    """Found by a chaos run (200 orders, seed 1, `c1-86cc-00133`): a reviewed order waiting
    in its customer's line was promoted (its check moved up, its nudge sent); its review
    event came before the nudge, and the event's save watched the order at the line's
    hold again (its row still said it waited in line); then the nudge claimed it and
    dispatched the reserve. The charge's request was lost later, and nothing looked at the
    order until the hold, 10 minutes on. A claim whose step is due before the check the
    order was watched at moves that check before its save."""
    shop = Shop(rules=CustomerPolicy(fair_share=1))
    await shop.submit("A", "a-0")
    await submit_order(
        shop.deps(), order("A", "a-1"), workflow=REVIEWED_ORDER
    )  # in line behind a-0
    held = shop.store.watched()["a-1"]
    await suspend_order(shop.deps(), "a-0", "ops")  # its leave promotes a-1
    (promotion,) = shop.bus.take(Queue.SCHEDULER)
    assert shop.store.watched()["a-1"] < held
    await send_event(shop.deps(), "a-1", "review", "ev-1", APPROVED)
    assert shop.store.watched()["a-1"] < held, "the event's save put the hold back"
    await scheduler.on_nudge(shop.deps(), "a-1", promotion.message_id)
    claimed = await shop.store.load("a-1")
    assert claimed is not None and claimed.state.process_state is ProcessState.PROCESSING
    reserve = claimed.steps[0]
    assert reserve.complete_by is not None
    assert shop.store.watched()["a-1"] <= reserve.complete_by
