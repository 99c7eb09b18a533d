"""The operator page: a static HTML page and the JSON snapshot it polls.

The page is one packaged file with its CSS and script inline (no build step). It holds
no data of its own, so nothing user-influenced is ever rendered server-side; the script
puts the data on the page as text. The Content-Security-Policy allows exactly the
inline script and style of that file (by hash) and requests to this origin only, plus
the origin of the local trace query (`TraceQueryUrl`) when one is set.

The route (`/api/ops`) and the Functions' names (`ops_page`, `ops_data`) are what a
deployment already knows (its keys, logs and alerts name them), so they keep the short
word; the code calls it the operator page.
"""

from __future__ import annotations

import base64
import hashlib
import re
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any
from urllib.parse import urlsplit

import azure.functions as func

from shared.contract import Route
from shared.domain.messages import iso
from shared.domain.principal import Role
from shared.domain.routing import STALE_AFTER
from shared.functions import composition
from shared.functions.http import bounded_int, json_response, opt_iso
from shared.functions.reconcile import run_view
from shared.functions.signin import route_level
from shared.usecases.operations.operator_page import (
    DEFAULT_COUNT_CAP,
    MAX_COUNT_CAP,
    AgentView,
    OperatorSnapshot,
    operator_snapshot,
)

bp = func.Blueprint()
_NO_STORE = {"Cache-Control": "no-store"}


@dataclass(frozen=True)
class Page:
    html: str
    headers: dict[str, str]


@cache
def page(trace_query_url: str | None = None) -> Page:
    """Read once per worker; the CSP hashes are computed from the file as shipped."""
    html = resources.files("shared.functions").joinpath("operator_page.html").read_text("utf-8")
    script = _inline_hashes(html, "script")
    style = _inline_hashes(html, "style")
    connect = " ".join(["'self'", *_origin(trace_query_url)])
    csp = (
        f"default-src 'none'; script-src {script}; style-src {style}; connect-src {connect}; "
        "img-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
    )
    return Page(
        html,
        {
            **_NO_STORE,
            "Content-Security-Policy": csp,
            "X-Content-Type-Options": "nosniff",
            "Referrer-Policy": "no-referrer",
        },
    )


def _origin(url: str | None) -> list[str]:
    """The trace query's origin, the one other place the page may fetch from."""
    parts = urlsplit(url or "")
    if parts.scheme not in ("http", "https") or not parts.netloc:
        return []
    return [f"{parts.scheme}://{parts.netloc}"]


def _inline_hashes(html: str, tag: str) -> str:
    bodies = re.findall(rf"<{tag}>(.*?)</{tag}>", html, flags=re.DOTALL)
    return " ".join(
        f"'sha256-{base64.b64encode(hashlib.sha256(b.encode()).digest()).decode()}'" for b in bodies
    )


@bp.route(route=Route.OPS_PAGE, methods=["GET"], auth_level=route_level())
async def ops_page(req: func.HttpRequest) -> func.HttpResponse:
    h = await composition.operator_page()
    actor = await h.gate.admit(req, Role.READ)
    if isinstance(actor, func.HttpResponse):
        return actor
    found = page(h.trace_query_url)
    return func.HttpResponse(
        found.html, mimetype="text/html", charset="utf-8", headers=dict(found.headers)
    )


@bp.route(route=Route.OPS_DATA, methods=["GET"], auth_level=route_level())
async def ops_data(req: func.HttpRequest) -> func.HttpResponse:
    h = await composition.operator_page()
    actor = await h.gate.admit(req, Role.READ)
    if isinstance(actor, func.HttpResponse):
        return actor
    count_cap = bounded_int(req, "countCap", DEFAULT_COUNT_CAP, 1, MAX_COUNT_CAP)
    if isinstance(count_cap, func.HttpResponse):
        return count_cap
    snapshot = await operator_snapshot(h.process, h.health, count_cap, reconcile=h.reconcile)
    view = {**snapshot_view(snapshot), "traceQueryUrl": h.trace_query_url}
    return json_response(view, headers=dict(_NO_STORE))


def snapshot_view(snapshot: OperatorSnapshot) -> dict[str, Any]:
    return {
        "at": iso(snapshot.at),
        "countCap": snapshot.count_cap,
        "staleAfterSeconds": STALE_AFTER.total_seconds(),
        "unavailable": list(snapshot.unavailable),
        "orders": {
            "counts": [
                {
                    "state": c.state.value,
                    "count": c.count,
                    "capped": c.capped,
                    "recent": list(c.recent),
                }
                for c in snapshot.counts
            ],
            "errors": [
                {
                    "orderId": e.entry.order_id,
                    "workflow": e.entry.workflow,
                    "workflowVersion": e.entry.workflow_version,
                    "failureCount": e.entry.failure_count,
                    "step": e.step,
                    "lastError": e.entry.last_error,
                    "updatedAt": iso(e.entry.updated_at),
                }
                for e in snapshot.errors
            ],
        },
        "waiting": [
            {
                "orderId": w.order_id,
                "processState": w.process_state.value,
                "workflow": w.workflow,
                "workflowVersion": w.workflow_version,
                "step": w.step,
                "event": w.event,
                "approval": w.approval,
                "deadline": opt_iso(w.complete_by),
            }
            for w in snapshot.waiting
        ],
        "agents": [_agent_view(a) for a in snapshot.agents],
        "sweeps": [
            {
                "instance": s.instance,
                "startedAt": iso(s.started_at),
                "finishedAt": iso(s.finished_at),
                "durationMs": round((s.finished_at - s.started_at).total_seconds() * 1000),
                "due": s.due,
                "requeued": s.requeued,
                "errored": s.errored,
                "compensating": s.compensating,
                "rescheduled": s.rescheduled,
                "finished": s.finished,
                "lostRaces": s.lost_races,
                "failed": s.failed,
            }
            for s in snapshot.sweeps
        ],
        "reconciliation": [run_view(r) for r in snapshot.reconciliation],
        "customers": _customers_view(snapshot),
    }


def _customers_view(snapshot: OperatorSnapshot) -> dict[str, Any] | None:
    view = snapshot.customers
    if view is None:
        return None
    return {
        "maxPendingPerCustomer": view.max_pending,
        "fairShareRunningPerCustomer": view.fair_share,
        "top": [
            {
                "customerId": name,
                "open": load.open,
                "running": load.running,
                "waiting": load.waiting,
            }
            for name, load in view.top
        ],
    }


def _agent_view(view: AgentView) -> dict[str, Any]:
    h = view.health
    return {
        "agent": h.agent,
        "instance": h.instance,
        "breaker": h.breaker.value,
        "successRate": h.success_rate,
        "latencyMs": h.latency_ms,
        "inFlight": h.in_flight,
        "capacity": h.capacity,
        "calls": h.calls,
        "heartbeatAt": iso(h.heartbeat_at),
        "openUntil": opt_iso(h.open_until),
        "maxConcurrent": h.max_concurrent,
        "callsPerSecond": h.calls_per_second,
        "rate": round(h.rate, 2),
        "throttled": h.throttled,
        "last429": opt_iso(h.last_limited_at),
        "ageSeconds": round(view.age.total_seconds(), 1),
        "stale": view.stale,
    }
