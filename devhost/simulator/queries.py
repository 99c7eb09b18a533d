"""Outcome queries: ``GET /{service}/operations/{idempotencyKey}``, the read API of a key.

It answers what a payment provider's idempotency read API would: whether the request
made with that key took effect, and with which result, so a caller whose reply was
lost knows instead of guessing. The answer is about that key's own request only:

* ``200 {"applied": true, "result": {...}}``: the key's effect is applied; ``result``
  is what the operation returned. It stays so after a compensation, which is another
  request with its own key (a refunded charge still happened; ask the refund's key).
* ``200 {"applied": false}``: the key was seen and nothing is applied: every call
  failed before applying (transient error, hang) or the request was rejected
  permanently (card declined).
* ``200 {"applied": false, "abandoned": true}``: the key was abandoned
  (``POST .../abandon``): it never applies.
* ``409`` ``operation-in-progress``: no outcome yet and a call with the key is still
  running (latency, ``slowMs``, a hang whose client is still waiting); it may still
  apply, so "not applied" would be a guess. Like a provider's concurrent-request 409.
* ``404`` ``operation-not-found``: the key was never seen by this service.

Latency, jitter and transient errors apply as configured for the service; hangs,
``slowMs``, apply-then-hang and permanent failures do not (a provider whose charge
endpoint hangs still answers its read API). A query is one unique-index lookup and is
not counted as a call of the key.
"""

from __future__ import annotations

import asyncio

from aiohttp import web

from devhost.simulator.effects import OutcomeKind
from devhost.simulator.faults import decide_query
from devhost.simulator.problems import in_progress_problem, problem, transient_problem
from devhost.simulator.state import STATE

QUERY_FAULT = "transient-query"


async def handle_query(request: web.Request) -> web.Response:
    state = request.app[STATE]
    name = request.match_info["service"]
    key = request.match_info["key"]
    stats = state.stats[name]
    stats.queries += 1
    number = state.query_numbers.next(name, key)
    decision = decide_query(state.faults.get(name), state.seed, name, key, number)
    if decision.delay_seconds > 0:
        await asyncio.sleep(decision.delay_seconds)
    if decision.transient_status is not None:
        stats.query_transient_errors += 1
        return transient_problem(decision.transient_status, QUERY_FAULT)
    effect = state.ledger.get(name, key)
    if effect is None:
        return problem(
            404, "operation-not-found", "Operation not found", f"{name} never saw key {key!r}"
        )
    if effect.outcome is not None and effect.outcome.kind is OutcomeKind.APPLIED:
        return web.json_response({"applied": True, "result": effect.outcome.body})
    if effect.abandoned:
        return web.json_response({"applied": False, "abandoned": True})
    if effect.outcome is None and state.in_progress.running(name, key):
        return in_progress_problem(name, key)
    return web.json_response({"applied": False})
