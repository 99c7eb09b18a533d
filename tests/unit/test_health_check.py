"""`/api/health` reuses an answer for a few seconds, but an "ok" only while no call to
its dependencies has failed since: a failure the app met shows at the next probe."""

from __future__ import annotations

import pytest

from shared.adapters.clock import FakeClock
from shared.adapters.memory.store import InMemoryBus
from shared.adapters.queues import destination_of
from shared.contract import Queue
from shared.domain.model import Outgoing
from shared.ports import BusUnavailable
from shared.usecases.operations.health_check import HealthCheck, Probe


class CountedPings:
    """A dependency whose pings are counted and can be made to fail."""

    def __init__(self) -> None:
        self.pings = 0
        self.down = False

    async def ping(self) -> None:
        self.pings += 1
        if self.down:
            raise BusUnavailable("no answer")


def check(bus: InMemoryBus, pings: CountedPings, clock: FakeClock) -> HealthCheck:
    return HealthCheck({"serviceBus": Probe(pings.ping, lambda: bus.failures)}, clock)


NUDGE = Outgoing(destination_of(Queue.SCHEDULER), "m-1", {"orderId": "o-1"})


async def test_an_ok_is_reused_within_the_ttl_while_nothing_failed() -> None:
    bus, pings, clock = InMemoryBus(), CountedPings(), FakeClock()
    health = check(bus, pings, clock)
    assert await health.report() == {"serviceBus": "ok"}
    clock.advance(4)
    await bus.send([NUDGE])
    assert await health.report() == {"serviceBus": "ok"}
    assert pings.pings == 1
    clock.advance(1)
    await health.report()
    assert pings.pings == 2


async def test_a_failed_call_since_the_last_ok_makes_the_next_answer_a_new_probe() -> None:
    bus, pings, clock = InMemoryBus(), CountedPings(), FakeClock()
    health = check(bus, pings, clock)
    assert await health.report() == {"serviceBus": "ok"}
    pings.down = True
    bus.fail_next = 1
    with pytest.raises(BusUnavailable):
        await bus.send([NUDGE])
    assert await health.report() == {"serviceBus": "unavailable: BusUnavailable"}
    assert pings.pings == 2


async def test_a_failed_answer_is_reused_for_the_ttl_whatever_fails_meanwhile() -> None:
    """A flood of probes during an outage must not become a flood of calls."""
    bus, pings, clock = InMemoryBus(), CountedPings(), FakeClock()
    pings.down = True
    health = check(bus, pings, clock)
    assert (await health.report())["serviceBus"].startswith("unavailable")
    bus.fail_next = 1
    with pytest.raises(BusUnavailable):
        await bus.send([NUDGE])
    clock.advance(4)
    pings.down = False
    assert (await health.report())["serviceBus"].startswith("unavailable")
    assert pings.pings == 1
    clock.advance(1)
    assert await health.report() == {"serviceBus": "ok"}
