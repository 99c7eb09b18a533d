"""The local dev servers' front door: loopback host names only, no cross-site writes.

The simulator and the trace receiver listen on loopback like the runtime, and any web
page the developer opens can reach loopback too: a page could rebind a name of its own
to 127.0.0.1 and read them, or POST to them from its origin. The simulator's ledger is
what the tests judge by and its faults are what they inject, so they get the runtime's
checks (devhost/host/guard.py): a Host that is not a loopback name (or the name they
were bound to) is 421, and a state-changing request from another Origin is 403.
"""

from __future__ import annotations

from aiohttp import web
from aiohttp.typedefs import Handler, Middleware

from devhost.host import guard
from devhost.problem import problem


def refused(request: web.Request, also: frozenset[str], server: str) -> web.Response | None:
    """The refusal of a request from outside loopback, or None; neither the Host nor
    the Origin is echoed."""
    host_header = request.headers.get("Host")
    if not guard.allowed_host(host_header, also):
        return problem(421, "Misdirected Request", f"{server} answers only to loopback host names")
    own = f"{request.scheme}://{host_header or request.host}"
    if guard.foreign_origin(request.method, request.headers.get("Origin"), own):
        return problem(403, "Forbidden", "state-changing requests are taken from this origin only")
    return None


def bound_names(bind_host: str) -> frozenset[str]:
    """The name a server bound to `bind_host` answers to besides loopback's; none when it
    listens on every interface."""
    wildcard = bind_host in ("", "0.0.0.0", "::")
    return frozenset() if wildcard else frozenset({guard.host_name(bind_host)})


def loopback_only(bind_host: str) -> Middleware:
    """The middleware for a server bound to `bind_host`."""
    also = bound_names(bind_host)

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        refusal = refused(request, also, "this server")
        return refusal if refusal is not None else await handler(request)

    return middleware


def guard_app(app: web.Application, bind_host: str) -> None:
    """Put the check in front of the app's own middlewares; before the app starts."""
    app.middlewares.insert(0, loopback_only(bind_host))
