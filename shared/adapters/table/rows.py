"""How an order process maps onto Table Storage entities (one partition per order).

Layout: the `state` entity holds everything `load` needs, so a load is one point read
and a state change one conditional write of one entity:

* the state record's fields as real, queryable properties, named as in the pattern
  (`OrderID`, `LockedBy`, `CompleteBy`, `ProcessState`, `FailureCount`, ...);
* the order's fields (`CustomerId`, `Items`, `Priority`, `ReplyTo`, `Fingerprint`,
  `OrderCreatedAt`). The order never changes, so it could live in its own row read
  beside the state; folded in, a load is one request instead of two, a submission one
  entity instead of two, and no instance needs a cache of orders (on Flex Consumption a
  message reaches any instance). The price is rewriting the order with each state
  change: a few hundred bytes for a usual order;
* the step records (`Steps`) and the outbox (`Outbox`) as JSON properties. Steps go
  through `dataclass_json`, so fields added to `StepRecord` round-trip by themselves.

* the latest history entries (`History`, JSON, each with the version and index that
  name its row). A state change and its history are then one conditional write of one
  entity, not an entity-group transaction, whose multipart body the SDK builds and
  parses with the `email` package (a quarter of a runtime's CPU before). Bounded: when
  the entries would pass `INLINE_HISTORY_ENTRIES` or `INLINE_HISTORY_CHARS`, they move
  to append-only `hist-VVVVVVVVVV-NN` rows in one transaction with that change, and
  `History` starts empty again. A fault-free order never gets there; history reads
  merge the rows and `History` by key.

Limits: a string property holds at most 64 KiB of UTF-16 (32 K code units), an entity
1 MiB. JSON is written without ASCII escaping (an escaped non-ASCII character takes six
code units, a raw one at most two), and any long text is split over `Name`, `Name_1`,
`Name_2`, ... The largest order the intake accepts (100 lines of 128-character SKUs) fits
with room to spare; see the contract tests.

An archived order's partition keeps one entity, its mark, under the `state` key: the
`Fingerprint`, `ArchivedState` and `ArchivedAt` and nothing else (no `ProcessState`, so
no query on the state finds it). It holds the id (a create meets it as a live order),
and `load` reads it as no order (shared/domain/archive.py `ArchivedMark`).

Older tables (an `order` row, a `state` row without `Steps`, `step-NN` rows) are still
read; the first save rewrites the state entity in this layout and the old rows are left
unread.
"""

from __future__ import annotations

import json
import zlib
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from shared.adapters.dataclass_json import from_json, to_json
from shared.adapters.queues import destination_of, queue_of
from shared.domain.archive import ArchivedMark
from shared.domain.destination import Destination, To
from shared.domain.model import (
    ErrorInfo,
    HistoryEntry,
    Notify,
    Order,
    OrderLine,
    OrderProcess,
    Outgoing,
    Phase,
    Priority,
    ProcessState,
    ReceivedEvent,
    StateRecord,
    StepRecord,
    StepStatus,
)

ORDER_ROW = "order"
STATE_ROW = "state"
STEP_PREFIX = "step-"
HISTORY_PREFIX = "hist-"
STEPS = "Steps"
WATCH_SHARDS = 16
"""Watch entries spread over partitions so that no one partition takes every write."""

TEXT_PART = 16_000
"""Code points per string property: at most two UTF-16 code units each, under 32 K."""
HISTORY = "History"
INLINE_HISTORY_ENTRIES = 40
"""Entries kept in the state entity before they move to rows (a fault-free order has
11); under the 100 operations of the transaction that moves them."""
INLINE_HISTORY_CHARS = 3 * TEXT_PART
"""The entries' JSON at most, so the entity stays far under its 1 MiB."""

Entity = dict[str, Any]


def history_key(version: int, index: int) -> str:
    return f"{HISTORY_PREFIX}{version:010d}-{index:02d}"


def in_url(text: str) -> bool:
    """Whether a request's URL can carry the text, as a key or in a filter: not with a
    lone surrogate, which UTF-8 has no bytes for (the SDK's quoting raises). Text
    stored before the edge refused them may hold one (issue 41)."""
    return text.isascii() or text == url_text(text)


def url_text(text: str) -> str:
    """The text with each lone surrogate spelled as its escape (`\\ud800`), the rest as
    it is: a key made of any other text stays the key it always was."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def watch_partition(order_id: str) -> str:
    return f"~watch-{zlib.crc32(order_id.encode()) % WATCH_SHARDS:02d}"


def watch_partitions() -> list[str]:
    return [f"~watch-{shard:02d}" for shard in range(WATCH_SHARDS)]


ARCHIVED_STATE = "ArchivedState"


def mark_entity(mark: ArchivedMark) -> Entity:
    return {
        "PartitionKey": mark.order_id,
        "RowKey": STATE_ROW,
        "Fingerprint": mark.fingerprint,
        ARCHIVED_STATE: mark.process_state.value,
        "ArchivedAt": mark.archived_at,
    }


def is_mark(entity: Mapping[str, Any]) -> bool:
    return entity.get(ARCHIVED_STATE) is not None


def to_mark(entity: Mapping[str, Any]) -> ArchivedMark:
    return ArchivedMark(
        str(entity["PartitionKey"]),
        str(entity["Fingerprint"]),
        ProcessState(entity[ARCHIVED_STATE]),
        utc(entity["ArchivedAt"]),
    )


def is_current_layout(state: Mapping[str, Any]) -> bool:
    """A state entity that carries its steps; older ones need their partition's rows."""
    return STEPS in state


def utc_or_none(value: Any) -> datetime | None:
    return None if value is None else utc(value)


def utc(value: Any) -> datetime:
    """A timestamp as read from a table (the SDK's TablesEntityDatetime, or ISO text in
    JSON) as a plain aware UTC datetime, so that equal instants compare equal."""
    if value is None:
        raise ValueError("a required timestamp is missing")
    at = value if isinstance(value, datetime) else datetime.fromisoformat(str(value))
    at = (at if at.tzinfo else at.replace(tzinfo=UTC)).astimezone(UTC)
    return datetime(*at.timetuple()[:6], at.microsecond, tzinfo=UTC)


def _without_nulls(entity: Entity) -> Entity:
    """Table Storage has no null: an absent property is the null."""
    return {k: v for k, v in entity.items() if v is not None}


def _dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def put_text(entity: Entity, name: str, text: str | None) -> None:
    """Store text of any length: the first part as `name`, the rest as `name_1`, ..."""
    if text is None:
        return
    entity[name] = text[:TEXT_PART]
    for i, start in enumerate(range(TEXT_PART, len(text), TEXT_PART), start=1):
        entity[f"{name}_{i}"] = text[start : start + TEXT_PART]


def get_text(entity: Mapping[str, Any], name: str) -> str | None:
    first = entity.get(name)
    if first is None:
        return None
    parts = [str(first)]
    while (part := entity.get(f"{name}_{len(parts)}")) is not None:
        parts.append(str(part))
    return "".join(parts)


def _items_json(order: Order) -> str:
    return _dumps(
        [{"sku": i.sku, "quantity": i.quantity, "unitPrice": i.unit_price} for i in order.items]
    )


def state_entity(process: OrderProcess, history: str = "[]") -> Entity:
    """The one entity that holds an order, its state record, its steps and its latest
    history (`history`: JSON from `inline_history_text`)."""
    state, order = process.state, process.order
    entity = _without_nulls(
        {
            "PartitionKey": state.order_id,
            "RowKey": STATE_ROW,
            "OrderID": state.order_id,
            "LockedBy": state.locked_by,
            "CompleteBy": state.complete_by,
            "ProcessState": state.process_state.value,
            "FailureCount": state.failure_count,
            "Attempt": state.attempt,
            "Phase": state.phase.value,
            "CurrentStep": state.current_step,
            "Version": state.version,
            "CreatedAt": state.created_at,
            "UpdatedAt": state.updated_at,
            "Workflow": state.workflow,
            "WorkflowVersion": state.workflow_version,
            "OutboxCause": state.outbox_cause,
            "CancelRequested": state.cancel_requested,
            "CustomerId": order.customer_id,
            "Priority": order.priority.value,
            "ReplyTo": order.reply_to,
            "Fingerprint": order.fingerprint,
            "OrderCreatedAt": order.created_at,
            "TraceParent": order.trace_parent,
            "NotBefore": order.not_before,
            "Notify": None if order.notify is Notify.ALL else order.notify.value,
        }
    )
    put_text(entity, "LastError", state.last_error)
    put_text(entity, "Outbox", _dumps([_outgoing_json(m) for m in state.outbox]))
    put_text(entity, "Items", _items_json(order))
    put_text(entity, STEPS, _dumps([to_json(step) for step in process.steps]))
    if state.events:
        put_text(entity, "Events", _dumps([to_json(event) for event in state.events]))
    put_text(entity, HISTORY, history)
    return entity


Keyed = tuple[str, HistoryEntry]
"""A history entry and the key of its row (`history_key`): its place in the order."""


def keyed_history(version: int, history: list[HistoryEntry]) -> list[Keyed]:
    return [(history_key(version, i), entry) for i, entry in enumerate(history)]


def history_text(entity: Mapping[str, Any]) -> str:
    """The JSON of the entries a state entity carries (none in older layouts)."""
    return get_text(entity, HISTORY) or "[]"


def parse_history(text: str) -> list[Keyed]:
    return [(str(item["key"]), _history_entry(item)) for item in json.loads(text)]


def inline_history_text(entries: list[Keyed]) -> str | None:
    """The JSON for `History`; None when it is too much to keep inline."""
    if len(entries) > INLINE_HISTORY_ENTRIES:
        return None
    text = _dumps([_history_json(key, entry) for key, entry in entries])
    return text if len(text) <= INLINE_HISTORY_CHARS else None


def _history_json(key: str, entry: HistoryEntry) -> dict[str, Any]:
    return {
        "key": key,
        "at": entry.at.isoformat(),
        "event": entry.event,
        "detail": entry.detail,
        "processState": entry.process_state.value,
        "failureCount": entry.failure_count,
        "attempt": entry.attempt,
    }


def _history_entry(item: Mapping[str, Any]) -> HistoryEntry:
    return HistoryEntry(
        at=utc(item["at"]),
        event=item["event"],
        detail=item.get("detail") or "",
        process_state=ProcessState(item["processState"]),
        failure_count=int(item.get("failureCount", 0)),
        attempt=int(item.get("attempt", 0)),
    )


def history_entities(order_id: str, history: list[Keyed]) -> list[Entity]:
    entities = []
    for key, entry in history:
        entity = _without_nulls(
            {
                "PartitionKey": order_id,
                "RowKey": key,
                "At": entry.at,
                "Event": entry.event,
                "ProcessState": entry.process_state.value,
                "FailureCount": entry.failure_count,
                "Attempt": entry.attempt,
            }
        )
        put_text(entity, "Detail", entry.detail or None)
        entities.append(entity)
    return entities


def _outgoing_json(message: Outgoing) -> dict[str, Any]:
    """The destination, and its queue as well: an instance of the version before
    destinations, still running during a deployment, reads `queue` only."""
    destination = message.destination
    return {
        "to": destination.to.value,
        **({"agent": destination.agent} if destination.agent is not None else {}),
        **({"high": True} if destination.high else {}),
        **({"replyTo": destination.reply_to} if destination.reply_to is not None else {}),
        "queue": queue_of(destination),
        "messageId": message.message_id,
        "body": dict(message.body),
        "deliverAt": message.deliver_at.isoformat() if message.deliver_at else None,
    }


def _outgoing(data: Mapping[str, Any]) -> Outgoing:
    return Outgoing(
        destination=_destination(data),
        message_id=data["messageId"],
        body=data["body"],
        deliver_at=utc_or_none(data.get("deliverAt")),
    )


def _destination(data: Mapping[str, Any]) -> Destination:
    """An outbox stored before destinations has its queue only: read back to the
    destination whose queue it is, so it still delivers there."""
    if "to" not in data:
        return destination_of(data["queue"])
    return Destination(
        To(data["to"]),
        high=bool(data.get("high", False)),
        agent=data.get("agent"),
        reply_to=data.get("replyTo"),
    )


def to_order(entity: Mapping[str, Any], created_at: str = "OrderCreatedAt") -> Order:
    return Order(
        order_id=entity["OrderID"],
        customer_id=entity["CustomerId"],
        items=tuple(
            OrderLine(i["sku"], int(i["quantity"]), float(i["unitPrice"]))
            for i in json.loads(get_text(entity, "Items") or "[]")
        ),
        priority=Priority(entity.get("Priority", Priority.NORMAL.value)),
        reply_to=entity.get("ReplyTo"),
        fingerprint=entity["Fingerprint"],
        created_at=utc(entity[created_at]),
        trace_parent=entity.get("TraceParent"),
        not_before=utc_or_none(entity.get("NotBefore")),
        notify=Notify(entity.get("Notify") or Notify.ALL),
    )


_STATE_FIELDS = (
    "OrderID",
    "ProcessState",
    "LockedBy",
    "CompleteBy",
    "FailureCount",
    "Attempt",
    "Phase",
    "CurrentStep",
    "Version",
    "CreatedAt",
    "UpdatedAt",
    "Workflow",
    "WorkflowVersion",
    "OutboxCause",
    "CancelRequested",
)
_STATE_TEXTS = ("LastError", "Outbox", "Events")
STATE_TEXT_PARTS = 4
"""Parts of each of the state's texts a state-only query asks for: 64,000 characters,
far past any outbox, error or event list seen; an entity that fills the last part is
read again whole."""
STATE_COLUMNS = (
    *_STATE_FIELDS,
    *(name if i == 0 else f"{name}_{i}" for name in _STATE_TEXTS for i in range(STATE_TEXT_PARTS)),
)
"""What `to_state` reads: an operator's query of 1,000 orders asks for these alone, not
the steps, items and history that are four fifths of a finished order's entity (the
whole entity made each such read allocate about 4 MB, response and parse, for 1,000
state records)."""


def selected_state(entity: Mapping[str, Any]) -> dict[str, Any] | None:
    """An entity read with `STATE_COLUMNS` as `to_state` takes it (a column asked for
    but not on the entity comes back as null), or None when a text may go on past the
    parts asked for."""
    if any(entity.get(f"{name}_{STATE_TEXT_PARTS - 1}") is not None for name in _STATE_TEXTS):
        return None
    return {k: v for k, v in entity.items() if v is not None}


def to_state(entity: Mapping[str, Any]) -> StateRecord:
    return StateRecord(
        order_id=entity["OrderID"],
        process_state=ProcessState(entity["ProcessState"]),
        locked_by=entity.get("LockedBy"),
        complete_by=utc_or_none(entity.get("CompleteBy")),
        failure_count=int(entity.get("FailureCount", 0)),
        attempt=int(entity.get("Attempt", 0)),
        phase=Phase(entity.get("Phase", Phase.FORWARD.value)),
        current_step=int(entity.get("CurrentStep", 0)),
        last_error=get_text(entity, "LastError"),
        version=int(entity.get("Version", 0)),
        created_at=utc(entity["CreatedAt"]),
        updated_at=utc(entity["UpdatedAt"]),
        workflow=entity["Workflow"],
        workflow_version=int(entity.get("WorkflowVersion", 1)),
        outbox=tuple(_outgoing(m) for m in json.loads(get_text(entity, "Outbox") or "[]")),
        outbox_cause=entity.get("OutboxCause"),
        cancel_requested=bool(entity.get("CancelRequested", False)),
        events=tuple(
            from_json(ReceivedEvent, e) for e in json.loads(get_text(entity, "Events") or "[]")
        ),
    )


def to_process(state: Mapping[str, Any], etag: str | None) -> OrderProcess:
    """An order from its state entity (current layout)."""
    steps = json.loads(get_text(state, STEPS) or "[]")
    return OrderProcess(
        order=to_order(state),
        state=to_state(state),
        steps=tuple(from_json(StepRecord, step) for step in steps),
        etag=etag,
    )


def to_history(entity: Mapping[str, Any]) -> HistoryEntry:
    return HistoryEntry(
        at=utc(entity["At"]),
        event=entity["Event"],
        detail=get_text(entity, "Detail") or "",
        process_state=ProcessState(entity["ProcessState"]),
        failure_count=int(entity.get("FailureCount", 0)),
        attempt=int(entity.get("Attempt", 0)),
    )


def _legacy_step(entity: Mapping[str, Any]) -> StepRecord:
    code = entity.get("ErrorCode")
    return StepRecord(
        name=entity["Step"],
        status=StepStatus(entity["Status"]),
        attempts=int(entity.get("Attempts", 0)),
        complete_by=utc_or_none(entity.get("CompleteBy")),
        result=json.loads(entity["Result"]) if "Result" in entity else None,
        error=ErrorInfo(code, entity.get("ErrorMessage", "")) if code else None,
        compensation_attempts=int(entity.get("CompensationAttempts", 0)),
    )


def from_legacy_rows(entities: list[Mapping[str, Any]], etag: str | None) -> OrderProcess | None:
    """An order stored as an `order` row, a `state` row and `step-NN` rows; None while a
    row is missing."""
    by_key = {e["RowKey"]: e for e in entities}
    if ORDER_ROW not in by_key or STATE_ROW not in by_key:
        return None
    steps = [_legacy_step(by_key[k]) for k in sorted(by_key) if k.startswith(STEP_PREFIX)]
    return OrderProcess(
        order=to_order(by_key[ORDER_ROW], created_at="CreatedAt"),
        state=to_state(by_key[STATE_ROW]),
        steps=tuple(steps),
        etag=etag,
    )
