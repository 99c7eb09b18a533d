"""HTTP mapping shared by the HTTP functions: problem+json errors and JSON views."""

from __future__ import annotations

import re
from typing import Any

import azure.functions as func

from shared import jsonbounds
from shared.catalogue.running import workflow_of
from shared.domain.messages import iso
from shared.domain.model import HistoryEntry, OrderProcess, ProcessState, StateRecord, StepStatus
from shared.domain.workflow import Catalogue
from shared.telemetry.propagation import trace_id_of

PROBLEM_JSON = "application/problem+json"
MAX_BODY_BYTES = 64 * 1024


def problem(
    status: int,
    title: str,
    detail: str,
    headers: dict[str, str] | None = None,
    *,
    code: str | None = None,
) -> func.HttpResponse:
    """`code`: a stable machine-readable reason where clients branch on it (past-pivot)."""
    body: dict[str, object] = {"type": "about:blank", "title": title, "status": status}
    body["detail"] = detail
    if code is not None:
        body["code"] = code
    return func.HttpResponse(
        jsonbounds.dumps(body), status_code=status, mimetype=PROBLEM_JSON, headers=headers
    )


def json_response(
    body: Any, status: int = 200, headers: dict[str, str] | None = None
) -> func.HttpResponse:
    """Written by the rule the bodies are read by: an order stored before it may hold NaN
    or a lone surrogate (issue 41), answered as null and U+FFFD, never as invalid JSON."""
    return func.HttpResponse(
        jsonbounds.dumps(body), status_code=status, mimetype="application/json", headers=headers
    )


def is_json_media_type(content_type: str | None) -> bool:
    """`application/json` or `application/*+json`, with any parameters (e.g. charset)."""
    media = (content_type or "").split(";")[0].strip().lower()
    return media == "application/json" or (
        media.startswith("application/") and media.endswith("+json")
    )


def read_json(req: func.HttpRequest) -> tuple[Any, func.HttpResponse | None]:
    """The parsed body, or the 4xx that explains why there is none. Every route's body
    comes through here, so here is where a lone surrogate or a number that is not finite
    is refused (shared/jsonbounds.py), before any handler could store it.

    A missing content type is refused too: a browser's cross-site form or `text/plain`
    POST must not pass as JSON (the request would be "simple", with no CORS preflight).
    """
    content_type = req.headers.get("content-type")
    if not is_json_media_type(content_type):
        sent = (content_type or "").split(";")[0].strip() or "no content type"
        return None, problem(415, "Unsupported Media Type", f"send application/json, not {sent}")
    raw = req.get_body() or b""
    if len(raw) > MAX_BODY_BYTES:
        return None, problem(
            413, "Payload Too Large", f"the body is {len(raw)} bytes; the limit is {MAX_BODY_BYTES}"
        )
    try:
        return jsonbounds.loads(raw), None
    except jsonbounds.Unrepresentable as exc:
        return None, problem(400, "Invalid JSON", f"the body holds what JSON cannot carry: {exc}")
    except ValueError as exc:
        return None, problem(400, "Invalid JSON", f"the body is not JSON: {exc}")


_WHOLE_NUMBER = re.compile(r"^[0-9]{1,4}$")
"""ASCII digits only: str.isdigit() accepts '²', which int() then refuses."""


def bounded_int(
    req: func.HttpRequest, name: str, default: int, low: int, high: int
) -> int | func.HttpResponse:
    """A whole-number query parameter within [low, high], or the 400 that says why not."""
    raw = req.params.get(name, str(default))
    if _WHOLE_NUMBER.match(raw) and low <= int(raw) <= high:
        return int(raw)
    return problem(400, f"Invalid {name}", f"{name} must be a whole number from {low} to {high}")


def base_url(req: func.HttpRequest) -> str:
    url = str(req.url)
    marker = url.find("/api/")
    return url[:marker] if marker >= 0 else url.rstrip("/")


ORDER_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
"""An order id as the intake accepts it: anything else cannot name an order."""


def order_not_found(order_id: str) -> func.HttpResponse:
    return problem(404, "Order not found", f"no order with id {order_id!r}")


def opt_iso(value: Any) -> str | None:
    return iso(value) if value is not None else None


def state_view(state: StateRecord) -> dict[str, Any]:
    return {
        "orderId": state.order_id,
        "processState": state.process_state.value,
        "lockedBy": state.locked_by,
        "completeBy": opt_iso(state.complete_by),
        "failureCount": state.failure_count,
        "attempt": state.attempt,
        "phase": state.phase.value,
        "currentStep": state.current_step,
        "lastError": state.last_error,
        "createdAt": iso(state.created_at),
        "updatedAt": iso(state.updated_at),
    }


def history_view(entry: HistoryEntry) -> dict[str, Any]:
    return {
        "at": iso(entry.at),
        "event": entry.event,
        "detail": entry.detail,
        "processState": entry.process_state.value,
        "failureCount": entry.failure_count,
        "attempt": entry.attempt,
    }


def order_view(process: OrderProcess, catalogue: Catalogue) -> dict[str, Any]:
    order = process.order
    return {
        **state_view(process.state),
        "workflow": process.state.workflow,
        "workflowVersion": process.state.workflow_version,
        "customerId": order.customer_id,
        "priority": order.priority.value,
        "replyTo": order.reply_to,
        "items": [
            {"sku": i.sku, "quantity": i.quantity, "unitPrice": i.unit_price} for i in order.items
        ],
        "steps": [
            {
                "name": s.name,
                "status": s.status.value,
                "attempts": s.attempts,
                "completeBy": opt_iso(s.complete_by),
                "compensationAttempts": s.compensation_attempts,
                "agent": s.agent,
                "error": {"code": s.error.code, "message": s.error.message} if s.error else None,
            }
            for s in process.steps
        ],
        "history": [history_view(h) for h in process.history],
        "traceId": trace_id_of(order.trace_parent),
        "waitingFor": waiting_view(process, catalogue),
        "events": [
            {
                "eventId": e.event_id,
                "name": e.name,
                "at": iso(e.at),
                "consumedBy": e.consumed_by,
                "by": (e.data or {}).get("by"),
            }
            for e in process.state.events
        ],
    }


def waiting_view(process: OrderProcess, catalogue: Catalogue) -> dict[str, Any] | None:
    """What a waiting order waits for (docs/catalogue.md), else None."""
    state = process.state
    workflow = workflow_of(catalogue, state)
    index = state.current_step
    if workflow is None or index >= len(workflow.steps) or index >= len(process.steps):
        return None
    definition, step = workflow.steps[index], process.steps[index]
    active = state.process_state in (ProcessState.PROCESSING, ProcessState.SUSPENDED)
    if not definition.waits or step.status is not StepStatus.RUNNING or not active:
        return None
    deadline = opt_iso(step.complete_by)
    what = {"event": definition.event} if definition.event else {"until": deadline}
    return {**what, "step": step.name, "since": opt_iso(step.dispatched_at), "deadline": deadline}
