"""Request/response nodes: ``<entity>/$management`` operations and ``$cbs`` put-token.

Both follow the AMQP management pattern: the answer carries ``correlation_id`` = the request's
message id and a status code in its application properties. The two nodes spell the status keys
differently (``statusCode`` on $management, ``status-code`` on $cbs), and the SDK only reads its
own spelling.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from proton import UNDESCRIBED, Array, Data, Message, int32, timestamp

from . import codec
from .addresses import DEAD_LETTER_SUFFIX
from .engine import Engine
from .model import Settlement

log = logging.getLogger(__name__)

VENDOR = "com.microsoft:"
LOCK_LOST = VENDOR + "message-lock-lost"
ARGUMENT_ERROR = VENDOR + "argument-error"
NOT_IMPLEMENTED = "amqp:not-implemented"

_DISPOSITIONS = {
    "completed": Settlement.COMPLETE,
    "abandoned": Settlement.ABANDON,
    "suspended": Settlement.DEAD_LETTER,
    # Deferral is not supported (no receive-by-sequence-number); a deferred message is
    # abandoned instead so that it is not lost.
    "defered": Settlement.ABANDON,
}

Result = tuple[int, str, Any, str | None]
# proton's hints type the descriptor argument of Array too narrowly for this constant.
_PLAIN: Any = UNDESCRIBED  # status, description, body, error condition


def _response(
    request: Message,
    status: int,
    description: str,
    body: Any,
    condition: str | None,
    *,
    code_key: str,
    description_key: str,
) -> Message:
    props: dict[str, Any] = {code_key: int32(status), description_key: description}
    if condition:
        props["errorCondition"] = condition
    return Message(body=body, correlation_id=request.id, properties=props)


def cbs_response(request: Message) -> Message:
    """Accept any token: the local broker does not authorise."""
    return _response(
        request,
        200,
        "OK",
        None,
        None,
        code_key="status-code",
        description_key="status-description",
    )


def _ok(body: Any = None) -> Result:
    return 200, "OK", body if body is not None else {}, None


def _lock_lost() -> Result:
    return 410, "The lock supplied is invalid: it expired or was already released.", None, LOCK_LOST


def _tokens(body: dict[str, Any]) -> list[Any]:
    tokens = [codec.as_uuid(t) for t in codec.as_list(body["lock-tokens"])]
    if any(t is None for t in tokens):
        raise ValueError("lock-tokens must be UUIDs")
    return tokens


class ManagementNode:
    """Answers ``$management`` requests against the engine."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine
        self._operations: dict[str, Callable[[str, dict[str, Any]], Result]] = {
            VENDOR + "renew-lock": self._renew_lock,
            VENDOR + "schedule-message": self._schedule,
            VENDOR + "cancel-scheduled-message": self._cancel,
            VENDOR + "peek-message": self._peek,
            VENDOR + "update-disposition": self._update_disposition,
        }

    def handle(self, entity: str, request: Message) -> Message:
        properties: dict[Any, Any] = request.properties or {}
        operation = properties.get("operation")
        handler = self._operations.get(str(operation))
        if handler is None:
            result: Result = (
                501,
                f"Operation {operation!r} is not supported.",
                None,
                NOT_IMPLEMENTED,
            )
        else:
            body = request.body if isinstance(request.body, dict) else {}
            try:
                result = handler(entity, body)
            except (KeyError, TypeError, ValueError) as exc:
                log.warning("bad %s request on %s: %r", operation, entity, exc)
                result = 400, f"Invalid request: {exc!r}", None, ARGUMENT_ERROR
        status, description, response_body, condition = result
        return _response(
            request,
            status,
            description,
            response_body,
            condition,
            code_key="statusCode",
            description_key="statusDescription",
        )

    def _renew_lock(self, entity: str, body: dict[str, Any]) -> Result:
        expirations = self._engine.renew(_tokens(body))
        if expirations is None:
            return _lock_lost()
        stamps = [timestamp(ms) for ms in expirations]
        return _ok({"expirations": Array(_PLAIN, Data.TIMESTAMP, *stamps)})

    def _schedule(self, entity: str, body: dict[str, Any]) -> Result:
        if entity.endswith(DEAD_LETTER_SUFFIX):
            raise ValueError("cannot schedule messages on a dead-letter queue")
        payloads = [bytes(item["message"]) for item in codec.as_list(body["messages"])]
        seqs = self._engine.schedule(entity, payloads)
        return _ok({"sequence-numbers": Array(_PLAIN, Data.LONG, *seqs)})

    def _cancel(self, entity: str, body: dict[str, Any]) -> Result:
        seqs = [int(s) for s in codec.as_list(body["sequence-numbers"])]
        self._engine.cancel_scheduled(entity, seqs)
        return _ok()

    def _peek(self, entity: str, body: dict[str, Any]) -> Result:
        from_seq = int(body.get("from-sequence-number", 0))
        count = max(0, int(body.get("message-count", 1)))
        messages = self._engine.peek(entity, from_seq, count)
        if not messages:
            return 204, "No messages", None, None
        return _ok({"messages": [{"message": m} for m in messages]})

    def _update_disposition(self, entity: str, body: dict[str, Any]) -> Result:
        settlement = _DISPOSITIONS[str(body["disposition-status"])]
        reason = body.get("deadletter-reason") or None
        description = body.get("deadletter-description") or None
        results = [
            self._engine.settle(token, settlement, reason, description) for token in _tokens(body)
        ]
        return _ok() if all(results) else _lock_lost()
