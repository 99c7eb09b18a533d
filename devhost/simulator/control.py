"""The ``/_sim`` control API: fault settings, the effect ledger, stats and health.

Its shape is a contract with chaos scripts and acceptance checks, hence strict input
validation (a typo must be a 400, not a silently ignored knob).
"""

from __future__ import annotations

import logging

from aiohttp import web
from pydantic import ValidationError

from devhost.simulator.faults import FaultSettings
from devhost.simulator.problems import problem, read_json, validation_detail
from devhost.simulator.services import Service
from devhost.simulator.state import STATE

log = logging.getLogger("devhost.simulator")


def _unknown_service(request: web.Request, service: str) -> web.Response:
    known = ", ".join(request.app[STATE].services)
    return problem(
        404, "unknown-service", "Unknown service", f"no service {service!r}; known: {known}"
    )


def _unknown_operations(service: Service, settings: FaultSettings) -> str | None:
    """Why ``permanentFailureOperations`` names operations the service does not have."""
    unknown = [op for op in settings.permanent_failure_operations if op not in service.operations]
    if not unknown:
        return None
    return (
        f"permanentFailureOperations: {service.name} has no operation "
        f"{', '.join(repr(op) for op in unknown)} (it has {', '.join(service.operations)})"
    )


async def put_faults(request: web.Request) -> web.Response:
    state = request.app[STATE]
    service = request.match_info["service"]
    if service not in state.services:
        return _unknown_service(request, service)
    try:
        settings = FaultSettings.model_validate(await read_json(request))
    except ValueError as exc:  # ValidationError is a ValueError too
        detail = validation_detail(exc) if isinstance(exc, ValidationError) else str(exc)
        return problem(400, "invalid-faults", "Invalid fault settings", detail)
    unknown = _unknown_operations(state.services[service], settings)
    if unknown is not None:
        return problem(400, "invalid-faults", "Invalid fault settings", unknown)
    state.faults.set(service, settings)
    log.info("faults for %s: %s", service, settings.to_json())
    return web.json_response(settings.to_json())


async def get_faults(request: web.Request) -> web.Response:
    return web.json_response(request.app[STATE].faults.to_json())


async def delete_faults(request: web.Request) -> web.Response:
    request.app[STATE].faults.reset()
    log.info("faults reset")
    return web.Response(status=204)


async def get_effects(request: web.Request) -> web.Response:
    service = request.query.get("service")
    if service is not None and service not in request.app[STATE].services:
        return problem(
            400, "unknown-service", "Unknown service", f"no service {service!r} to filter on"
        )
    effects = request.app[STATE].ledger.list(order_id=request.query.get("orderId"), service=service)
    return web.json_response([effect.to_json() for effect in effects])


async def delete_effects(request: web.Request) -> web.Response:
    state = request.app[STATE]
    state.ledger.clear()
    state.query_numbers.clear()
    state.sent_numbers.clear()
    log.info("effects cleared")
    return web.Response(status=204)


async def delete_effect(request: web.Request) -> web.Response:
    """Forget one key: the service's record disagrees with the order's from then on
    (what reconciliation exists to notice)."""
    service = request.match_info["service"]
    if service not in request.app[STATE].services:
        return _unknown_service(request, service)
    key = request.match_info["key"]
    if not request.app[STATE].ledger.forget(service, key):
        return problem(
            404, "operation-not-found", "Operation not found", f"{service} never saw key {key!r}"
        )
    log.info("effect forgotten: %s %s", service, key)
    return web.Response(status=204)


async def get_stats(request: web.Request) -> web.Response:
    return web.json_response(request.app[STATE].stats.to_json())


async def delete_stats(request: web.Request) -> web.Response:
    request.app[STATE].stats.reset()
    return web.Response(status=204)


async def get_health(request: web.Request) -> web.Response:
    return web.json_response({"status": "ok", "seed": request.app[STATE].seed})


def add_control_routes(router: web.UrlDispatcher) -> None:
    router.add_get("/_sim/faults", get_faults)
    router.add_delete("/_sim/faults", delete_faults)
    router.add_put("/_sim/faults/{service}", put_faults)
    router.add_get("/_sim/effects", get_effects)
    router.add_delete("/_sim/effects", delete_effects)
    router.add_delete("/_sim/effects/{service}/{key}", delete_effect)
    router.add_get("/_sim/stats", get_stats)
    router.add_delete("/_sim/stats", delete_stats)
    router.add_get("/_sim/health", get_health)
