"""The pure rules of shared/domain/fairness.py (who runs, who waits, who is refused) and
the machine's side of a customer's line (shared/domain/machine/line.py)."""

from __future__ import annotations

from datetime import timedelta

from shared.adapters.clock import FakeClock
from shared.domain.destination import Destination, To
from shared.domain.fairness import (
    KEPT,
    RETRY_AFTER_SECONDS,
    Admission,
    CustomerLoad,
    CustomerPolicy,
    Promoted,
    RefusalMemo,
    admit,
    promotes,
)
from shared.domain.machine.forward import start
from shared.domain.machine.line import in_line, promotion, wait_in_line
from shared.domain.machine.recovery import next_check
from tests.builders import a_policy, an_order
from tests.workflows import CATALOGUE

FAIR = CustomerPolicy(fair_share=2)
QUOTA = CustomerPolicy(max_pending=3)


def test_under_its_share_an_order_runs_at_once() -> None:
    assert admit(CustomerLoad(running=1), FAIR) is Admission.RUN
    assert admit(CustomerLoad(), CustomerPolicy()) is Admission.RUN


def test_at_its_share_an_order_waits() -> None:
    assert admit(CustomerLoad(running=2), FAIR) is Admission.WAIT


def test_behind_its_own_line_an_order_waits_even_with_a_free_slot() -> None:
    """First in, first out within one customer: a newcomer never jumps its own line."""
    assert admit(CustomerLoad(running=0, waiting=1), FAIR) is Admission.WAIT


def test_at_the_quota_an_order_is_refused_whether_running_or_waiting() -> None:
    assert admit(CustomerLoad(running=2), QUOTA) is Admission.RUN
    assert admit(CustomerLoad(running=1, waiting=2), QUOTA) is Admission.REFUSE
    assert admit(CustomerLoad(running=3), CustomerPolicy(max_pending=3, fair_share=9)) is (
        Admission.REFUSE
    )


def test_a_slot_freed_promotes_only_under_the_share() -> None:
    assert promotes(CustomerLoad(running=1, waiting=4), FAIR)
    assert not promotes(CustomerLoad(running=2, waiting=4), FAIR)
    assert not promotes(CustomerLoad(running=0, waiting=0), FAIR)
    assert promotes(CustomerLoad(running=5, waiting=1), CustomerPolicy(max_pending=9))


def test_no_rule_set_keeps_no_record() -> None:
    assert not CustomerPolicy().active
    assert CustomerPolicy(fair_share=1).active and CustomerPolicy(max_pending=1).active


def test_an_order_in_line_has_no_nudge_and_is_checked_when_its_hold_passes() -> None:
    clock = FakeClock()
    now = clock.now()
    workflow = CATALOGUE.default_workflow()
    started = start(an_order("o-1", clock=clock), workflow, now)
    assert not in_line(started.process)
    waiting = wait_in_line(started, now, hold=timedelta(minutes=10))
    assert in_line(waiting.process)
    assert all(m.destination.to is not To.SCHEDULER for m in waiting.outgoing)
    assert waiting.process.state.outbox == waiting.outgoing
    assert waiting.history[-1].event == "waiting-for-fair-share"
    policy = a_policy()
    check = next_check(waiting.process, workflow, policy, now)
    assert check == now + timedelta(minutes=10)
    # an order not in line is checked within a step timeout, as before
    assert next_check(started.process, workflow, policy, now) == now + timedelta(seconds=30)


def test_a_promotion_is_one_message_per_order_on_its_lane() -> None:
    o1 = Promoted("o-1")
    assert promotion(o1).message_id == promotion(o1).message_id
    assert promotion(o1).destination == Destination.to_scheduler()
    assert promotion(o1).body["orderId"] == "o-1"
    assert promotion(Promoted("o-1", high=True)).destination == Destination.to_scheduler(high=True)
    assert promotion(Promoted("o-1", high=True)).message_id == promotion(o1).message_id


def retry_after(load: CustomerLoad) -> int:
    """The Retry-After of a customer's first refusal by an instance."""
    return RefusalMemo().come_back("A", load, FakeClock().now())


def test_retry_after_is_the_customers_pace_of_ends_within_bounds() -> None:
    t0 = FakeClock().now()
    load = CustomerLoad(running=3)
    assert retry_after(load) == RETRY_AFTER_SECONDS  # nothing ended yet
    load = load.ended(t0)
    assert load.pace is None  # one end is no gap
    load = load.ended(t0 + timedelta(seconds=12)).ended(t0 + timedelta(seconds=24))
    assert load.pace == 12 and retry_after(load) == 12
    assert load == CustomerLoad(running=3)  # the pace is no part of the counts
    fast = CustomerLoad().ended(t0).ended(t0 + timedelta(milliseconds=100))
    assert retry_after(fast) == 1
    slow = CustomerLoad().ended(t0).ended(t0 + timedelta(hours=1))
    assert retry_after(slow) == 60
    skewed = CustomerLoad().ended(t0).ended(t0 - timedelta(seconds=5))  # another clock
    assert skewed.pace == 0 and skewed.left_at == t0


def test_the_refused_are_told_to_come_back_one_pace_after_another() -> None:
    """Each slot frees one pace after the last: telling every refused POST the same second
    would bring them back together, one to find a slot and the rest to be refused again."""
    t0 = FakeClock().now()
    memo = RefusalMemo()
    quick = CustomerLoad(running=3, pace=0.4)
    told = [memo.come_back("A", quick, t0) for _ in range(5)]
    assert told == [1, 1, 2, 2, 2]  # 0.4, 0.8, 1.2, 1.6, 2.0 s, rounded up
    assert memo.come_back("B", quick, t0) == 1  # each customer has its own line of them
    later = t0 + timedelta(seconds=10)
    assert memo.come_back("A", quick, later) == 1  # the earlier ones are past: from now
    slow = CustomerLoad(running=3, pace=25.0)
    assert [memo.come_back("C", slow, t0) for _ in range(4)] == [25, 50, 60, 60]
    assert memo.come_back("D", CustomerLoad(running=3), t0) == RETRY_AFTER_SECONDS


def test_a_memo_of_many_customers_drops_only_the_ones_whose_time_has_passed() -> None:
    t0 = FakeClock().now()
    memo = RefusalMemo()
    load = CustomerLoad(running=3, pace=0.5)
    for n in range(KEPT):
        memo.refused(f"c-{n}", load, t0)
        memo.come_back(f"c-{n}", load, t0)
    later = t0 + timedelta(seconds=2)
    memo.refused("fresh", load, later)
    memo.come_back("fresh", load, later)
    assert set(memo.held) == {"fresh"} and set(memo.booked) == {"fresh"}
    memo.refused("another", load, later)
    assert memo.holds("fresh", later) == load  # one still in its moment is kept
