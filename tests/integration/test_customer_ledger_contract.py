"""The customer ledger's contract, on memory and on Azurite's tables: the same decisions,
repeats that change nothing, the line in arrival order, concurrent entries exact."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from datetime import timedelta

import pytest
from azure.data.tables.aio import TableServiceClient

from shared.adapters.clock import FakeClock
from shared.adapters.memory.customers import InMemoryCustomerLedger
from shared.adapters.table.customers import TableCustomerLedger
from shared.domain.fairness import Admission, CustomerLoad, CustomerPolicy, Promoted
from shared.ports import CustomerLedger
from shared.settings import azurite_connection_string

BOTH = CustomerPolicy(max_pending=4, fair_share=2)


@pytest.fixture(params=["memory", pytest.param("table", marks=pytest.mark.azurite)])
async def ledgers(request: pytest.FixtureRequest) -> AsyncIterator[list[CustomerLedger]]:
    """Two instances' ledgers on one store (the memory ledger is one process's)."""
    if request.param == "memory":
        one = InMemoryCustomerLedger()
        yield [one, one]
        return
    port = request.getfixturevalue("azurite_table_port")
    service = TableServiceClient.from_connection_string(azurite_connection_string(port))
    name = f"t{uuid.uuid4().hex[:20]}"
    await service.create_table(name)
    tables = [TableCustomerLedger(service, name), TableCustomerLedger(service, name)]
    try:
        yield list(tables)
    finally:
        for table in tables:
            await table.close()
        await service.close()


@pytest.fixture
def ledger(ledgers: list[CustomerLedger]) -> CustomerLedger:
    return ledgers[0]


async def test_run_wait_refuse_and_repeat(ledger: CustomerLedger) -> None:
    clock = FakeClock()
    seen = []
    for i in range(5):
        clock.advance(1)
        seen.append((await ledger.enter("A", f"a-{i}", clock.now(), BOTH)).admission)
    assert seen == [Admission.RUN, Admission.RUN, Admission.WAIT, Admission.WAIT, Admission.REFUSE]
    again = await ledger.enter("A", "a-2", clock.now(), BOTH)
    assert again.known and again.admission is Admission.WAIT
    assert await ledger.loads(5) == (("A", CustomerLoad(running=2, waiting=2)),)
    assert (await ledger.enter("B", "b-0", clock.now(), BOTH)).admission is Admission.RUN


async def test_leaving_promotes_the_head_of_the_line_once(ledger: CustomerLedger) -> None:
    clock = FakeClock()
    for i in range(4):
        clock.advance(1)
        await ledger.enter("A", f"a-{i}", clock.now(), BOTH)
    assert await ledger.leave("A", "a-0", BOTH) == Promoted("a-2")
    assert await ledger.leave("A", "a-0", BOTH) is None  # a repeat changes nothing
    assert await ledger.loads(5) == (("A", CustomerLoad(running=2, waiting=1)),)
    assert await ledger.leave("A", "a-3", BOTH) is None  # a waiting order leaving
    assert await ledger.leave("A", "a-1", BOTH) is None  # nobody left in line
    assert await ledger.leave("A", "a-2", BOTH) is None
    assert await ledger.loads(5) == ()


async def test_rejoin_counts_a_running_order_once(ledger: CustomerLedger) -> None:
    clock = FakeClock()
    await ledger.rejoin("A", "a-0", clock.now())
    await ledger.rejoin("A", "a-0", clock.now())
    assert await ledger.loads(5) == (("A", CustomerLoad(running=1)),)
    await ledger.enter("A", "a-1", clock.now(), CustomerPolicy(fair_share=1))
    await ledger.rejoin("A", "a-1", clock.now() + timedelta(seconds=1))
    assert await ledger.loads(5) == (("A", CustomerLoad(running=2)),)


async def test_concurrent_entries_never_pass_the_quota(ledgers: list[CustomerLedger]) -> None:
    """On two instances at once: within one a customer's changes take turns, across
    them they race on the load row's ETag."""
    clock = FakeClock()
    policy = CustomerPolicy(max_pending=5)
    entered = await asyncio.gather(
        *(ledgers[i % 2].enter("A", f"a-{i}", clock.now(), policy) for i in range(12))
    )
    runs = [e for e in entered if e.admission is Admission.RUN]
    assert len(runs) == 5
    assert await ledgers[1].loads(5) == (("A", CustomerLoad(running=5)),)


async def test_a_promotion_keeps_the_lane_and_standing_says_where_an_order_is(
    ledger: CustomerLedger,
) -> None:
    clock = FakeClock()
    one = CustomerPolicy(fair_share=1)
    await ledger.enter("A", "a-0", clock.now(), one)
    clock.advance(1)
    await ledger.enter("A", "a-1", clock.now(), one, high=True)
    assert await ledger.standing("A", "a-0") is Admission.RUN
    assert await ledger.standing("A", "a-1") is Admission.WAIT
    assert await ledger.standing("A", "a-9") is None
    assert await ledger.standing("B", "a-0") is None
    assert await ledger.leave("A", "a-0", one) == Promoted("a-1", high=True)
    assert await ledger.standing("A", "a-1") is Admission.RUN


async def test_leaving_at_a_time_keeps_the_customers_pace(ledger: CustomerLedger) -> None:
    clock = FakeClock()
    quota = CustomerPolicy(max_pending=5)
    for i in range(4):
        await ledger.enter("A", f"a-{i}", clock.now(), quota)
    for i in range(3):
        clock.advance(10)
        await ledger.leave("A", f"a-{i}", quota, clock.now())
    ((_, load),) = await ledger.loads(5)
    assert load == CustomerLoad(running=1)
    assert load.pace == 10 and load.left_at == clock.now()
    refused = [await ledger.enter("A", f"b-{i}", clock.now(), quota) for i in range(5)][-1]
    assert refused.admission is Admission.REFUSE and refused.load.pace == 10


async def test_an_instance_writing_on_its_last_copy_stays_exact(
    ledgers: list[CustomerLedger],
) -> None:
    """In a burst the table ledger writes a customer's next entry on the load row as the
    previous one left it: a repeat, a refusal of a counted order, and a change from
    another instance in between must all still come out exact."""
    clock = FakeClock()
    quota = CustomerPolicy(max_pending=3)
    one, other = ledgers
    ids = ("a-0", "a-1", "a-1", "a-2", "a-2", "a-3")  # in turn on one instance
    burst = await asyncio.gather(*(one.enter("A", i, clock.now(), quota) for i in ids))
    assert [(e.admission, e.known) for e in burst] == [
        (Admission.RUN, False),
        (Admission.RUN, False),
        (Admission.RUN, True),
        (Admission.RUN, False),
        (Admission.RUN, True),  # at the quota, but counted already
        (Admission.REFUSE, False),
    ]
    roomy = CustomerPolicy(max_pending=10)
    await asyncio.gather(
        one.leave("A", "a-0", roomy, clock.now()),
        other.leave("A", "a-1", roomy, clock.now()),
        one.enter("A", "a-3", clock.now(), roomy),
        one.enter("A", "a-4", clock.now(), roomy),
    )
    assert await other.loads(5) == (("A", CustomerLoad(running=3)),)
    await asyncio.gather(*(one.leave("A", i, quota, clock.now()) for i in ("a-2", "a-3", "a-4")))
    assert await other.loads(5) == ()
    assert (await one.enter("A", "a-5", clock.now(), quota)).load == CustomerLoad()


async def test_entries_given_up_while_waiting_leave_the_others_answered(
    ledger: CustomerLedger,
) -> None:
    """An intake whose budget runs out while its entry waits (or is being entered with
    others) is cancelled: every other entry still gets its answer, and the count holds
    at most the entries that were given up besides the ones answered."""
    clock = FakeClock()
    policy = CustomerPolicy(fair_share=3)
    first = [ledger.enter("A", f"a-{i}", clock.now(), policy) for i in range(2)]
    tasks = [asyncio.ensure_future(e) for e in first]
    await asyncio.sleep(0)  # a-0 enters alone; a-1 waits for its turn
    tasks += [
        asyncio.ensure_future(ledger.enter("A", f"a-{i}", clock.now(), policy))
        for i in range(2, 20)
    ]
    await tasks[0]  # a-1 now enters every waiting entry together
    tasks[1].cancel()
    for task in tasks[2::4]:
        task.cancel()
    done = await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 30)
    answered = [d for d in done if not isinstance(d, BaseException)]
    assert len(answered) >= 14
    ((_, load),) = await ledger.loads(5)
    assert load.running == 3 and len(answered) <= load.open <= 20
