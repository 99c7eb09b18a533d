"""Storing a transition and sending what it decided, in the order that loses nothing."""

from __future__ import annotations

import logging
from dataclasses import replace

from shared.domain.model import OrderProcess
from shared.domain.process import Transition
from shared.usecases.deps import ProcessDeps

log = logging.getLogger("orders")


async def commit(deps: ProcessDeps, transition: Transition) -> OrderProcess:
    """Save first (conditional on the ETag), then send, then stop watching a finished order.

    A crash after the save leaves the messages in the record's outbox and the order on the
    Supervisor's watch list, so a redelivery or the next sweep sends them again (their ids
    are deterministic, so the broker drops what already went out).
    """
    etag = await deps.store.save(transition.process, transition.history)
    process = replace(transition.process, etag=etag)
    log_transition(transition)
    await deps.bus.send(transition.outgoing)
    if transition.is_terminal:
        await deps.store.unwatch(process.order_id, process.state.version)
    return process


def log_transition(transition: Transition) -> None:
    state = transition.process.state
    for entry in transition.history:
        log.info(
            "order %s %s%s [%s, attempt %d, failures %d]",
            state.order_id,
            entry.event,
            f": {entry.detail}" if entry.detail else "",
            entry.process_state.value,
            entry.attempt,
            entry.failure_count,
        )
