"""``POST /{service}/operations/{idempotencyKey}/abandon``: settle a key for good.

A caller that gave up on a request needs "not applied" to be final before it undoes
nothing or sends the step elsewhere; only the provider can promise that. Answers:

* ``200 {"applied": true, "result": {...}}``: too late, the key is applied;
* ``409`` ``operation-in-progress`` (``Retry-After``): a call with the key is running;
* ``200 {"applied": false, "abandoned": true}``: never seen, rejected or failed before
  applying (or abandoned already); from now on every call with the key answers 409
  ``operation-abandoned`` and never applies.

With the service's fault field ``abandonSupported: false`` the route answers 404 like
any route the server does not have (no contract code): a provider without it. Latency
and transient errors apply as for outcome queries; the call count of the key does not
change.
"""

from __future__ import annotations

import asyncio

from aiohttp import web

from devhost.simulator.effects import OutcomeKind
from devhost.simulator.faults import decide_query
from devhost.simulator.problems import in_progress_problem, transient_problem
from devhost.simulator.services import Service
from devhost.simulator.state import STATE

ABANDON_FAULT = "transient-abandon"


def _named_by(service: Service, key: str) -> tuple[str, str]:
    """(operation, orderId) of a key never seen, read from the agents' key shape
    ``{orderId}:{operation}`` when it fits, else empty: the row only records the abandon."""
    order_id, _, operation = key.rpartition(":")
    if order_id and operation in service.operations:
        return operation, order_id
    return "", ""


async def handle_abandon(request: web.Request) -> web.Response:
    state = request.app[STATE]
    name = request.match_info["service"]
    key = request.match_info["key"]
    settings = state.faults.get(name)
    if not settings.abandon_supported:
        raise web.HTTPNotFound()
    number = state.query_numbers.next(name, f"{key}/abandon")
    decision = decide_query(settings, state.seed, name, f"{key}/abandon", number)
    if decision.delay_seconds > 0:
        await asyncio.sleep(decision.delay_seconds)
    if decision.transient_status is not None:
        return transient_problem(decision.transient_status, ABANDON_FAULT)
    effect = state.ledger.get(name, key)
    if effect is not None and effect.outcome is not None:
        if effect.outcome.kind is OutcomeKind.APPLIED:
            return web.json_response({"applied": True, "result": effect.outcome.body})
    elif state.in_progress.running(name, key):
        return in_progress_problem(name, key)
    operation, order_id = _named_by(state.services[name], key)
    if effect is None or not effect.abandoned:
        state.stats[name].abandons += 1
        state.ledger.abandon(name, key, operation, order_id)
    return web.json_response({"applied": False, "abandoned": True})
