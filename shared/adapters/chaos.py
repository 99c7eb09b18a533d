"""Fault injection around the ports, for chaos runs only (setting `ChaosFaultRate`).

Wrapping the state store and the bus reaches every handler at its riskiest points: before
a read, after a write has been stored but before the handler knew it (a crash between
write and send), and before a send. The handler then raises like a process that died,
the host abandons the message, and the pattern has to heal around it.
"""

from __future__ import annotations

import random
from typing import Any

from shared.intercept import Call, Intercepted
from shared.ports import MessageBus, StateStore

BEFORE = {
    "load": "before reading an order",
    "reschedule": "before rescheduling a watch entry",
    "unwatch": "before unwatching a finished order",
    "unwatch_entry": "before dropping a missing order's watch entry",
    "put_rest": "before writing a rest entry, after the state",
    "drop_rest": "before dropping the rest entry of an order leaving it",
}
"""The store calls a process may die just before, and what the crash says."""
AFTER = {
    "create": "after storing a new order",
    "save": "after saving a transition, before its sends",
}
"""The store writes a process may die just after: stored, but the handler never knew."""


class ChaosFault(RuntimeError):
    """An injected crash; never raised unless ChaosFaultRate is set."""


class _Dice:
    def __init__(self, rate: float, seed: int | None) -> None:
        self.rate = rate
        self._rng = random.Random(seed)
        self.injected = 0

    def roll(self, where: str) -> None:
        if self._rng.random() < self.rate:
            self.injected += 1
            raise ChaosFault(f"chaos: injected crash {where}")


class ChaosStateStore(Intercepted[StateStore]):
    """Rolls the dice at the calls named in BEFORE and AFTER; any other call, a method
    added to the store included, goes straight through."""

    def __init__(self, inner: StateStore, rate: float, seed: int | None = None) -> None:
        super().__init__(inner, StateStore)
        self.dice = _Dice(rate, seed)

    async def around(self, call: Call) -> Any:
        before = BEFORE.get(call.name)
        if before is not None:
            self.dice.roll(before)
        result = await call.proceed()
        after = AFTER.get(call.name)
        if after is not None:
            self.dice.roll(after)
        return result


class ChaosMessageBus(Intercepted[MessageBus]):
    """Rolls the dice before a send that has anything to send."""

    def __init__(self, inner: MessageBus, rate: float, seed: int | None = None) -> None:
        super().__init__(inner, MessageBus)
        self.dice = _Dice(rate, seed)

    async def around(self, call: Call) -> Any:
        if call.name == "send" and call.argument("messages"):
            self.dice.roll("before sending")
        return await call.proceed()
