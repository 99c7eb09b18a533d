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
    process = await save(deps, transition)
    await send_then_unwatch(deps, transition)
    return process


async def save(deps: ProcessDeps, transition: Transition) -> OrderProcess:
    """The store's half of a commit: the order as stored, with its new ETag."""
    etag = await deps.store.save(transition.process, transition.history)
    log_transition(transition)
    return replace(transition.process, etag=etag)


async def send_then_unwatch(deps: ProcessDeps, transition: Transition) -> None:
    """The rest of a commit, once saved. A finished order leaves the watch list only
    after its messages went out, so a failed send leaves the Supervisor to resend them.
    A final order's entry goes unconditionally (no re-watch can follow a final state, so
    the version check's read is spared); Error and Suspended keep the check, since an
    operator may already have moved the order on and re-watched it."""
    if transition.check_at is not None:
        state = transition.process.state
        await deps.store.watch(
            state.order_id, transition.check_at, replace=True, version=state.version
        )
    await deps.bus.send(transition.outgoing)
    if transition.is_terminal:
        state = transition.process.state
        version = None if state.process_state.is_final else state.version
        await deps.store.unwatch(state.order_id, version)


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
