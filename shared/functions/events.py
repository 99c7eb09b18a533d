"""`POST /api/orders/{orderId}/events/{eventName}`: the world answers a waiting step.

Function auth like the intake. With the setting EventSigningSecret, the request must also
be signed for this order, this event and this body, recently (`x-signature:
t=<unix seconds>,v1=<hex HMAC-SHA256>`, shared/domain/event_signature.py and
docs/events.md): an outside system that holds the secret, and only it, can approve an
order, and a request it signed authorises that one event, nowhere else.

`POST /api/orders/{orderId}/approval`: an operator answers an approval (admin auth, like
the other operator actions), recorded as the same event `by` the operator. The operator
page cannot hold the signing secret, and should not: a secret in a page is no secret.
"""

from __future__ import annotations

import json
import re
from typing import Any

import azure.functions as func

from shared.catalogue.schema import NAME_MAX_LENGTH, NAME_PATTERN
from shared.contract import Route
from shared.domain.event_signature import SIGNATURE_HEADER, refusal
from shared.domain.machine.events import InvalidEventData, NoApprovalWaiting, NotAwaited
from shared.domain.machine.transition import InvalidTransition
from shared.domain.principal import Role
from shared.functions import composition
from shared.functions.archive import missing_order
from shared.functions.http import ORDER_ID, order_not_found, problem, read_json
from shared.functions.signin import route_level
from shared.ports import StateStoreError
from shared.telemetry.spans import serving
from shared.usecases.limits.budget import HTTP_BUDGET
from shared.usecases.operations.events import answer_approval, send_event
from shared.usecases.operations.operator import OrderNotFound

bp = func.Blueprint()
_EVENT_NAME = re.compile(NAME_PATTERN)
"""An event is named like everything in the catalogue."""
_EVENT_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$")
MAX_DATA_BYTES = 8 * 1024
"""An event's data is kept with the order (its entity is capped): ids and a comment.
Measured as it is stored (`table_rows`): compact JSON, UTF-8, non-ASCII unescaped."""
MAX_COMMENT = 500
"""An approval's comment, as long as a cancel's reason."""
_APPROVAL_FIELDS = frozenset({"eventId", "approved", "comment", "event"})


@bp.route(route=Route.ORDER_EVENT, methods=["POST"], auth_level=func.AuthLevel.FUNCTION)
async def send_event_http(req: func.HttpRequest, context: func.Context) -> func.HttpResponse:
    with serving(req, context):
        return await _send(req)


async def _send(req: func.HttpRequest) -> func.HttpResponse:
    order_id = req.route_params.get("orderId", "")
    name = req.route_params.get("eventName", "")
    if not ORDER_ID.match(order_id):
        return order_not_found(order_id[:64])
    if not _EVENT_NAME.match(name) or len(name) > NAME_MAX_LENGTH:
        return problem(400, "Invalid event name", "an event name is lower-case words and hyphens")
    h = await composition.events()
    secret = h.signing_secret
    if secret is not None:
        why = refusal(
            req.headers.get(SIGNATURE_HEADER),
            secret,
            order_id,
            name,
            req.get_body() or b"",
            h.process.clock.now(),
        )
        if why is not None:
            return problem(401, "Bad signature", why)
    body, failure = read_json(req)
    if failure is not None:
        return failure
    parsed = _body(body)
    if isinstance(parsed, func.HttpResponse):
        return parsed
    event_id, data = parsed
    try:
        await send_event(h.process, order_id, name, event_id, data, budget=HTTP_BUDGET)
    except OrderNotFound:
        return await missing_order(h.archive, order_id)
    except (NotAwaited, InvalidEventData) as exc:
        return problem(400, "Invalid event", str(exc))
    except InvalidTransition as exc:
        return problem(409, "Not waiting", str(exc), code=exc.code)
    except StateStoreError:
        return problem(503, "Try again", "the state store is unavailable", {"Retry-After": "5"})
    return func.HttpResponse(
        json.dumps({"orderId": order_id, "event": name, "eventId": event_id}),
        status_code=202,
        mimetype="application/json",
    )


def _body(body: Any) -> tuple[str, dict[str, Any] | None] | func.HttpResponse:
    if not isinstance(body, dict) or set(body) - {"eventId", "data"}:
        return problem(400, "Invalid event", 'the body is {"eventId": string, "data"?: object}')
    event_id = body.get("eventId")
    if not isinstance(event_id, str) or not _EVENT_ID.match(event_id):
        return problem(
            400, "Invalid event", "eventId is required: 1-128 letters, digits and ._:- characters"
        )
    data = body.get("data")
    if data is not None and not isinstance(data, dict):
        return problem(400, "Invalid event", "data is a JSON object")
    size = data_bytes(data) if data else 0
    if size > MAX_DATA_BYTES:
        return problem(
            413,
            "Payload Too Large",
            f"the event's data is {size} bytes as compact JSON in UTF-8; "
            f"at most {MAX_DATA_BYTES} (8 KiB)",
        )
    return event_id, data


def data_bytes(data: dict[str, Any]) -> int:
    """The UTF-8 bytes of `data`'s compact JSON, as it is stored. ASCII escapes would
    count an "é" as the six characters of `\\u00e9`, refusing 6 KB of accented text as
    18 KB. `surrogatepass` counts a lone surrogate as the three bytes it takes rather
    than raising: refusing it is not this measure's job."""
    text = json.dumps(data, ensure_ascii=False, separators=(",", ":"))
    return len(text.encode("utf-8", "surrogatepass"))


@bp.route(route=Route.ORDER_APPROVAL, methods=["POST"], auth_level=route_level())
async def answer_approval_http(req: func.HttpRequest, context: func.Context) -> func.HttpResponse:
    with serving(req, context):
        return await _approve(req)


async def _approve(req: func.HttpRequest) -> func.HttpResponse:
    h = await composition.events()
    actor = await h.gate.admit(req, Role.OPERATE)
    if isinstance(actor, func.HttpResponse):
        return actor
    order_id = req.route_params.get("orderId", "")
    if not ORDER_ID.match(order_id):
        return order_not_found(order_id[:64])
    body, failure = read_json(req)
    if failure is not None:
        return failure
    parsed = _approval(body)
    if isinstance(parsed, func.HttpResponse):
        return parsed
    event_id, approved, comment, event = parsed
    try:
        kept = await answer_approval(
            h.process,
            order_id,
            event_id,
            approved,
            actor.recorded,
            comment,
            event,
            budget=HTTP_BUDGET,
        )
    except OrderNotFound:
        return await missing_order(h.archive, order_id)
    except (NotAwaited, InvalidEventData) as exc:
        return problem(400, "Invalid approval", str(exc))
    except NoApprovalWaiting as exc:
        return problem(409, "No approval waiting", str(exc))
    except InvalidTransition as exc:
        return problem(409, "Not waiting", str(exc), code=exc.code)
    except StateStoreError:
        return problem(503, "Try again", "the state store is unavailable", {"Retry-After": "5"})
    data = kept.data or {}
    return func.HttpResponse(
        json.dumps(
            {
                "orderId": order_id,
                "event": kept.name,
                "eventId": kept.event_id,
                "approved": data.get("approved"),
                "by": data.get("by"),
            }
        ),
        status_code=202,
        mimetype="application/json",
    )


def _approval(body: Any) -> tuple[str, bool, str | None, str | None] | func.HttpResponse:
    """`{"eventId", "approved", "comment"?, "event"?}`; the operator is the x-operator
    header, as for every operator action, never a field a client fills in."""
    shape = '{"eventId": string, "approved": bool, "comment"?: string, "event"?: string}'
    if not isinstance(body, dict) or set(body) - _APPROVAL_FIELDS:
        return problem(400, "Invalid approval", f"the body is {shape}")
    event_id = body.get("eventId")
    if not isinstance(event_id, str) or not _EVENT_ID.match(event_id):
        return problem(
            400,
            "Invalid approval",
            "eventId is required: 1-128 letters, digits and ._:- characters",
        )
    approved = body.get("approved")
    if not isinstance(approved, bool):
        return problem(400, "Invalid approval", "approved is required: true or false")
    comment = body.get("comment")
    if comment is not None and (not isinstance(comment, str) or len(comment) > MAX_COMMENT):
        return problem(400, "Invalid approval", f"comment is a string of at most {MAX_COMMENT}")
    event = body.get("event")
    if event is not None and (
        not isinstance(event, str) or not _EVENT_NAME.match(event) or len(event) > NAME_MAX_LENGTH
    ):
        return problem(400, "Invalid approval", "event is lower-case words and hyphens")
    return event_id, approved, comment or None, event
