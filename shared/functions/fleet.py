"""Operating the fleet rather than one order: the agents, their health and limits, and
draining one (the Error orders grouped by failure are failures.py)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import azure.functions as func

from shared.contract import Route, agent_queue
from shared.domain.messages import iso
from shared.domain.principal import Role
from shared.functions import composition
from shared.functions.http import json_response, opt_iso, problem, read_json
from shared.functions.signin import route_level
from shared.ports import StateStoreError
from shared.usecases.limits.budget import HTTP_BUDGET
from shared.usecases.operations.fleet import AgentStatus, list_agents, set_drain

bp = func.Blueprint()
MAX_REASON = 500
_UNAVAILABLE = ("Try again", "the state store is unavailable")
_RETRY = {"Retry-After": "5"}


@bp.route(route=Route.AGENTS, methods=["GET"], auth_level=route_level())
async def agents_http(req: func.HttpRequest) -> func.HttpResponse:
    h = await composition.fleet()
    actor = await h.gate.admit(req, Role.READ)
    if isinstance(actor, func.HttpResponse):
        return actor
    try:
        statuses = await list_agents(h.health, h.clock, h.catalogue)
    except StateStoreError:
        return problem(503, *_UNAVAILABLE, _RETRY)
    now = h.clock.now()
    return json_response({"agents": [agent_view(s, now) for s in statuses]})


@bp.route(route=Route.AGENT_DRAIN, methods=["PUT"], auth_level=route_level())
async def drain_agent_http(req: func.HttpRequest) -> func.HttpResponse:
    h = await composition.fleet()
    actor = await h.gate.admit(req, Role.OPERATE)
    if isinstance(actor, func.HttpResponse):
        return actor
    agent = req.route_params.get("agent", "")
    if agent not in h.catalogue.agents:
        known = ", ".join(h.catalogue.agents)
        return problem(404, "Agent not found", f"no agent {agent[:64]!r}; agents: {known}")
    body = _drain_body(req)
    if isinstance(body, func.HttpResponse):
        return body
    drained, reason = body
    try:
        status = await set_drain(
            h.health,
            h.clock,
            h.catalogue,
            agent,
            drained,
            reason,
            actor.recorded,
            budget=HTTP_BUDGET,
        )
    except StateStoreError:
        return problem(503, *_UNAVAILABLE, _RETRY)
    return json_response(agent_view(status, h.clock.now()))


def _drain_body(req: func.HttpRequest) -> tuple[bool, str | None] | func.HttpResponse:
    data, error = read_json(req)
    if error is not None:
        return error
    if not isinstance(data, dict) or set(data) - {"drained", "reason"}:
        return problem(
            400, "Invalid body", 'the body is {"drained": boolean, "reason"?: string}, nothing else'
        )
    drained: Any = data.get("drained")
    if not isinstance(drained, bool):
        return problem(400, "Invalid drained", "drained is required: true or false")
    reason: Any = data.get("reason")
    if reason is not None and (not isinstance(reason, str) or len(reason) > MAX_REASON):
        return problem(400, "Invalid reason", f"reason is a string of at most {MAX_REASON}")
    return drained, reason or None


def agent_view(status: AgentStatus, now: datetime) -> dict[str, Any]:
    drain = status.drain
    return {
        "agent": status.spec.name,
        "queue": agent_queue(status.spec.name),
        "highPriorityQueue": agent_queue(status.spec.name, high=True),
        "drained": status.drained,
        "reason": drain.reason if drain else None,
        "since": opt_iso(drain.since) if drain else None,
        "by": drain.by if drain else None,
        "health": _health_view(status, now),
        "limits": limits_view(status, now),
    }


def limits_view(status: AgentStatus, now: datetime) -> dict[str, Any]:
    limits = status.limits(now)
    return {
        "maxConcurrent": limits.max_concurrent,
        "callsPerSecond": limits.calls_per_second,
        "rate": round(limits.rate, 2),
        "throttled": limits.throttled,
        "last429": opt_iso(limits.last_limited_at),
    }


def _health_view(status: AgentStatus, now: datetime) -> dict[str, Any] | None:
    latest, view = status.latest, status.view
    if latest is None or view is None:
        return None
    return {
        "status": view.availability.name.lower(),
        "detail": view.reason,
        "breaker": latest.breaker.value,
        "successRate": view.success_rate,
        "latencyMs": status.latency_ms(now),
        "inFlight": view.in_flight,
        "capacity": view.capacity,
        "lastHeartbeat": iso(latest.heartbeat_at),
        "instances": len(status.instances),
    }
