"""The aiohttp application: the remote services (operations, outcome queries, health)
plus the ``/_sim`` control API."""

from __future__ import annotations

import asyncio
import logging
import re
import secrets
import time
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path

from aiohttp import web

from devhost.simulator.abandon import handle_abandon
from devhost.simulator.calls import handle_call, handle_probe
from devhost.simulator.control import add_control_routes
from devhost.simulator.effects import Clock, EffectLedger, utc_now
from devhost.simulator.limits import Monotonic
from devhost.simulator.problems import problem
from devhost.simulator.queries import handle_query
from devhost.simulator.services import SERVICES, Service, services_from
from devhost.simulator.state import STATE, SimulatorState
from shared.domain.workflow import Catalogue

log = logging.getLogger("devhost.simulator")

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@web.middleware
async def problem_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Router errors (unknown service, wrong method) become problem+json like the rest."""
    try:
        return await handler(request)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        code = {404: "not-found", 405: "method-not-allowed"}.get(exc.status, "http-error")
        headers = {"Allow": exc.headers["Allow"]} if "Allow" in exc.headers else None
        detail = f"{request.method} {request.path}: {exc.reason}"
        return problem(exc.status, code, exc.reason, detail, headers)
    except web.RequestPayloadError:
        raise  # a body that cannot be decoded: the runner answers it (devhost.malformed)
    except Exception:
        log.exception("unexpected error handling %s %s", request.method, request.path)
        return problem(500, "simulator-bug", "Simulator error", "see the simulator log")


async def _wake_hung_calls(app: web.Application) -> None:
    """Hung calls would otherwise hold shutdown for the whole runner timeout."""
    app[STATE].closing.set()


async def _close(app: web.Application) -> None:
    state = app[STATE]
    for task in list(state.finishing):
        task.cancel()
    await asyncio.gather(*state.finishing, return_exceptions=True)
    state.ledger.close()


def create_app(
    db_path: str | Path | None = None,
    seed: int | None = None,
    clock: Clock = utc_now,
    *,
    services: Mapping[str, Service] | None = None,
    catalogue: Catalogue | None = None,
    monotonic: Monotonic = time.monotonic,
) -> web.Application:
    """Build the simulator; ``db_path=None`` keeps the ledger in memory, ``seed=None``
    picks a random seed (reported by ``/_sim/health`` so a run can be replayed), and
    ``clock`` stamps the ledger's ``firstCallAt`` and ``appliedAt``; ``monotonic`` times
    the quotas' one-second windows.

    The services are ``services`` if given, else those of ``catalogue``, else those of
    the catalogue the app runs (``SERVICES``): one per agent, named as the agent."""
    if services is not None and catalogue is not None:
        raise ValueError("pass services or a catalogue, not both")
    if services is None:
        services = SERVICES if catalogue is None else services_from(catalogue)
    if not services:
        raise ValueError("the simulator needs at least one service")
    state = SimulatorState(
        ledger=EffectLedger(db_path, clock),
        seed=secrets.randbits(32) if seed is None else seed,
        services=services,
        monotonic=monotonic,
    )
    app = web.Application(middlewares=[problem_middleware])
    app[STATE] = state
    names = "|".join(re.escape(name) for name in services)
    app.router.add_post(f"/{{service:{names}}}/{{operation}}", handle_call)
    app.router.add_get(f"/{{service:{names}}}/health", handle_probe)
    app.router.add_get(f"/{{service:{names}}}/operations/{{key}}", handle_query)
    app.router.add_post(f"/{{service:{names}}}/operations/{{key}}/abandon", handle_abandon)
    add_control_routes(app.router)
    app.on_shutdown.append(_wake_hung_calls)
    app.on_cleanup.append(_close)
    return app
