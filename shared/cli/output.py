"""Plain-text tables and blocks for people, JSON for scripts.

Pure functions from views to strings, so formatting is tested without any I/O; the
commands decide what to print and where.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from shared.cli.deadletters import DeadLetter, Peeked, Settlement, dead_letter_path

EMPTY = "-"
WIDE = 60


def cell(value: Any, width: int | None = None) -> str:
    """One table cell: no newlines, ``-`` for nothing, long text cut with an ellipsis."""
    if value is None or value == "":
        text = EMPTY
    elif isinstance(value, datetime):
        text = when(value)
    else:
        text = " ".join(str(value).split())
    if width is not None and len(text) > width:
        return text[: max(width - 1, 0)] + "…"
    return text


def when(value: Any) -> str:
    """UTC times as ``YYYY-MM-DD HH:MM:SSZ``; anything unparsable is shown as it came."""
    if value is None or value == "":
        return EMPTY
    moment = value
    if isinstance(value, str):
        try:
            moment = datetime.fromisoformat(value)
        except ValueError:
            return value
    if not isinstance(moment, datetime):
        return str(value)
    if moment.tzinfo is not None:
        moment = moment.astimezone(UTC)
    return moment.strftime("%Y-%m-%d %H:%M:%SZ")


def table(headers: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    """Left-aligned columns separated by two spaces; the last column is not padded."""
    text_rows = [[cell(v) for v in row] for row in rows]
    widths = [len(h) for h in headers]
    for row in text_rows:
        for i, value in enumerate(row):
            widths[i] = max(widths[i], len(value))
    lines = []
    for row in [list(headers), *text_rows]:
        padded = [value.ljust(widths[i]) for i, value in enumerate(row)]
        lines.append("  ".join(padded).rstrip())
    return "\n".join(lines)


def to_json(value: Any) -> str:
    return json.dumps(value, indent=2, default=_default, ensure_ascii=False)


def to_json_line(value: Any) -> str:
    return json.dumps(value, default=_default, ensure_ascii=False, separators=(",", ":"))


def _default(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")


# -- orders -------------------------------------------------------------------------------


ORDER_COLUMNS = (
    "ORDER ID",
    "STATE",
    "FAILURES",
    "STEP #",
    "ATTEMPT",
    "COMPLETE BY",
    "UPDATED",
    "LAST ERROR",
)


def orders_table(items: Sequence[Mapping[str, Any]]) -> str:
    if not items:
        return "no orders"
    return table(
        ORDER_COLUMNS,
        (
            [
                o.get("orderId"),
                o.get("processState"),
                o.get("failureCount"),
                o.get("currentStep"),
                o.get("attempt"),
                when(o.get("completeBy")),
                when(o.get("updatedAt")),
                cell(o.get("lastError"), WIDE),
            ]
            for o in items
        ),
    )


def _workflow(view: Mapping[str, Any]) -> str | None:
    name = view.get("workflow")
    return None if name is None else f"{name} v{view.get('workflowVersion', 1)}"


def order_details(view: Mapping[str, Any]) -> str:
    fields = [
        ("order", view.get("orderId")),
        ("state", view.get("processState")),
        ("workflow", _workflow(view)),
        ("failures", view.get("failureCount")),
        ("attempt", view.get("attempt")),
        ("current step", current_step(view)),
        ("phase", view.get("phase")),
        ("locked by", view.get("lockedBy")),
        ("complete by", when(view.get("completeBy"))),
        ("last error", view.get("lastError")),
        ("customer", view.get("customerId")),
        ("priority", view.get("priority")),
        ("reply to", view.get("replyTo")),
        ("items", _items(view.get("items"))),
        ("created", when(view.get("createdAt"))),
        ("updated", when(view.get("updatedAt"))),
    ]
    width = max(len(name) for name, _ in fields)
    lines = [f"{name.ljust(width)}  {cell(value)}" for name, value in fields]
    steps = view.get("steps") or []
    lines += ["", "STEPS", steps_table(steps) if steps else "no steps"]
    history = view.get("history") or []
    lines += ["", "HISTORY", history_table(history) if history else "no history"]
    return "\n".join(lines)


def current_step(view: Mapping[str, Any]) -> str:
    """The API gives the step's index; its name, from the steps, is what people look for."""
    index = view.get("currentStep")
    steps = view.get("steps")
    if isinstance(index, int) and isinstance(steps, list) and 0 <= index < len(steps):
        name = steps[index].get("name") if isinstance(steps[index], dict) else None
        if name:
            return f"{name} (#{index})"
    return cell(index)


def _items(items: Any) -> str:
    if not isinstance(items, list) or not items:
        return EMPTY
    return ", ".join(
        f"{i.get('sku')} x{i.get('quantity')} @ {i.get('unitPrice')}"
        for i in items
        if isinstance(i, dict)
    )


def _step_error(step: Mapping[str, Any]) -> str | None:
    error = step.get("error")
    if isinstance(error, dict):
        return f"{error.get('code')}: {error.get('message')}"
    return None


def steps_table(steps: Sequence[Mapping[str, Any]]) -> str:
    return table(
        ["STEP", "STATUS", "ATTEMPTS", "COMPLETE BY", "ERROR"],
        (
            [
                s.get("name"),
                s.get("status"),
                s.get("attempts"),
                when(s.get("completeBy")),
                cell(_step_error(s), WIDE),
            ]
            for s in steps
        ),
    )


def history_table(history: Sequence[Mapping[str, Any]]) -> str:
    return table(
        ["AT", "EVENT", "STATE", "FAILURES", "ATTEMPT", "DETAIL"],
        (
            [
                when(h.get("at")),
                h.get("event"),
                h.get("processState"),
                h.get("failureCount"),
                h.get("attempt"),
                cell(h.get("detail"), WIDE),
            ]
            for h in history
        ),
    )


def changes(before: Mapping[str, Any] | None, after: Mapping[str, Any]) -> list[str]:
    """What ``orders watch`` prints: new history entries and step changes, oldest first."""
    if before is None:
        state = f"{after.get('orderId')}: {after.get('processState')}"
        return [f"{state} (failures {after.get('failureCount')}, step {current_step(after)})"]
    lines: list[str] = []
    seen = {_history_key(h) for h in before.get("history") or []}
    for entry in after.get("history") or []:
        if _history_key(entry) not in seen:
            lines.append(
                f"{when(entry.get('at'))}  {entry.get('event')}  -> {entry.get('processState')}"
                + (f"  {cell(entry.get('detail'), WIDE)}" if entry.get("detail") else "")
            )
    old_steps = {s.get("name"): s for s in before.get("steps") or []}
    for step in after.get("steps") or []:
        old = old_steps.get(step.get("name")) or {}
        if (old.get("status"), old.get("attempts")) != (step.get("status"), step.get("attempts")):
            lines.append(
                f"step {step.get('name')}: {step.get('status')} (attempts {step.get('attempts')})"
            )
    if not lines and before.get("processState") != after.get("processState"):
        lines.append(f"state {before.get('processState')} -> {after.get('processState')}")
    return lines


def _history_key(entry: Mapping[str, Any]) -> tuple[Any, ...]:
    return (entry.get("at"), entry.get("event"), entry.get("attempt"), entry.get("detail"))


def resubmit_table(results: Sequence[Mapping[str, Any]]) -> str:
    return table(
        ["ORDER ID", "RESULT", "DETAIL"],
        ([r["orderId"], r["result"], r.get("detail")] for r in results),
    )


# -- agents and failures ------------------------------------------------------------------


AGENT_COLUMNS = (
    "AGENT",
    "QUEUE",
    "DRAINED",
    "HEALTH",
    "BREAKER",
    "SUCCESS",
    "LATENCY",
    "IN FLIGHT",
    "HEARTBEAT",
    "LIMIT",
    "RATE",
    "429s",
    "LAST 429",
    "DRAIN REASON",
)


def agents_table(agents: Sequence[Mapping[str, Any]]) -> str:
    if not agents:
        return "no agents"
    return table(
        AGENT_COLUMNS,
        (_agent_row(a) for a in agents),
    )


def _agent_row(agent: Mapping[str, Any]) -> list[Any]:
    health = agent.get("health") or {}
    limits = agent.get("limits") or {}
    drained = agent.get("drained")
    rate, latency = health.get("successRate"), health.get("latencyMs")
    return [
        agent.get("agent"),
        agent.get("queue"),
        f"yes since {when(agent.get('since'))}" if drained else "no",
        health.get("status", "never heard from"),
        health.get("breaker"),
        f"{rate:.0%}" if isinstance(rate, int | float) else None,
        f"{latency:.0f} ms" if isinstance(latency, int | float) else None,
        f"{health['inFlight']}/{health['capacity']}" if "inFlight" in health else None,
        when(health.get("lastHeartbeat")),
        _limit_cell(limits),
        f"{limits['rate']:g}/s" if isinstance(limits.get("rate"), int | float) else None,
        limits.get("throttled"),
        when(limits.get("last429")),
        cell(agent.get("reason"), WIDE) if drained else None,
    ]


def _limit_cell(limits: Mapping[str, Any]) -> str:
    """`5/s, 8 at once`; `none` when the agent has no limit."""
    parts = []
    if limits.get("callsPerSecond") is not None:
        parts.append(f"{limits['callsPerSecond']:g}/s")
    if limits.get("maxConcurrent") is not None:
        parts.append(f"{limits['maxConcurrent']} at once")
    return ", ".join(parts) or "none"


def drain_line(agent: Mapping[str, Any]) -> str:
    name = agent.get("agent")
    if not agent.get("drained"):
        return f"{name} undrained: it takes new dispatches again"
    reason = agent.get("reason")
    return f"{name} drained: no new dispatches" + (f" ({reason})" if reason else "")


def archived_table(items: Iterable[Mapping[str, Any]]) -> str:
    return table(
        ["ORDER", "STATE", "FINISHED", "ARCHIVED", "PAGE"],
        (
            [
                i.get("orderId"),
                i.get("processState"),
                when(i.get("finishedAt")),
                when(i.get("archivedAt")),
                i.get("blob"),
            ]
            for i in items
        ),
    )


def failures_table(report: Mapping[str, Any]) -> str:
    groups = report.get("groups") or []
    text = (
        table(
            ["COUNT", "STEP", "ERROR CODE", "FIRST", "LAST", "SAMPLE ORDER IDS"],
            (
                [
                    g.get("count"),
                    g.get("step"),
                    g.get("errorCode"),
                    when(g.get("firstAt")),
                    when(g.get("lastAt")),
                    " ".join(g.get("sampleOrderIds") or []),
                ]
                for g in groups
            ),
        )
        if groups
        else "no orders in Error"
    )
    if report.get("truncated"):
        text += f"\nonly the first {report.get('scanned')} Error orders were read (the cap)"
    return text


def bulk_preview(action: str, preview: Mapping[str, Any]) -> str:
    """What a bulk action would do: how many orders, a sample, the remote operations."""
    matched = preview.get("matched", 0)
    lines = [f"{action} would act on {matched} order{'' if matched == 1 else 's'}"]
    samples = preview.get("sampleOrderIds") or []
    if samples:
        lines.append("sample: " + " ".join(str(s) for s in samples))
    effects = preview.get("effects") or []
    if effects:
        lines.append(
            table(
                ["REMOTE OPERATION", "COUNT"],
                ([e.get("operation"), e.get("count")] for e in effects),
            )
        )
    else:
        lines.append("no remote operation")
    refused = preview.get("refused")
    if refused:
        lines.append(f"refused: {refused} order{'' if refused == 1 else 's'}")
        lines.extend(
            f"  {r.get('orderId')}: {r.get('reason')}" for r in preview.get("refusals") or []
        )
    return "\n".join(lines)


def bulk_progress(job: Mapping[str, Any]) -> str:
    return (
        f"bulk {job.get('bulkId')} {job.get('action')}: {job.get('state')}, "
        f"{job.get('done')} done, {job.get('skipped')} skipped, {job.get('failed')} failed "
        f"of {job.get('matched')}"
    )


# -- dead letters -------------------------------------------------------------------------


def excerpt(body: bytes | None, limit: int) -> str:
    if body is None:
        return "(not a data body)"
    text = " ".join(body.decode("utf-8", errors="replace").split())
    return text if len(text) <= limit else text[: max(limit - 1, 0)] + "…"


def dead_letter_json(message: DeadLetter, limit: int) -> dict[str, Any]:
    return {
        "queue": message.queue,
        "messageId": message.message_id,
        "sequenceNumber": message.sequence_number,
        "enqueuedTime": message.enqueued_at,
        "deliveryCount": message.delivery_count,
        "deadLetterReason": message.reason,
        "deadLetterErrorDescription": message.description,
        "applicationProperties": message.properties,
        "bodyExcerpt": excerpt(message.body, limit),
        "bodyBytes": message.body_size,
    }


def _properties(properties: Mapping[str, Any]) -> str:
    return " ".join(f"{k}={cell(v)}" for k, v in properties.items()) or EMPTY


def dead_letters_text(peeked: Sequence[Peeked], limit: int) -> str:
    blocks: list[str] = []
    empty = [p.queue for p in peeked if not p.messages]
    for queue in peeked:
        if not queue.messages:
            continue
        count = len(queue.messages)
        more = f" (first {count}; raise --max to see more)" if queue.more else ""
        lines = [
            f"{dead_letter_path(queue.queue)}: {count} message{'s' if count != 1 else ''}{more}"
        ]
        for m in queue.messages:
            lines.append(
                f"  {cell(m.message_id)}  seq {cell(m.sequence_number)}  "
                f"enqueued {when(m.enqueued_at)}  deliveries {cell(m.delivery_count)}"
            )
            lines.append(f"    reason       {cell(m.reason)}")
            lines.append(f"    description  {cell(m.description)}")
            lines.append(f"    properties   {_properties(m.properties)}")
            lines.append(f"    body         {excerpt(m.body, limit)} ({m.body_size} bytes)")
        blocks.append("\n".join(lines))
    if empty:
        blocks.append("no dead letters on: " + ", ".join(empty))
    return "\n\n".join(blocks)


def settlement_json(result: Settlement) -> dict[str, Any]:
    return {
        "queue": result.queue,
        "done": [
            {
                "messageId": s.message_id,
                "sequenceNumber": s.sequence_number,
                **({"newMessageId": s.new_message_id} if s.new_message_id else {}),
            }
            for s in result.done
        ],
        "skipped": [{"messageId": m, "reason": r} for m, r in result.skipped],
    }


def settlement_text(result: Settlement, verb: str) -> str:
    lines = []
    for s in result.done:
        line = f"{verb} {cell(s.message_id)} (seq {cell(s.sequence_number)})"
        if s.new_message_id:
            line += f" to {result.queue} as {s.new_message_id}"
        lines.append(line)
    for message_id, reason in result.skipped:
        lines.append(f"skipped {cell(message_id)}: {reason}")
    count = len(result.done)
    lines.append(
        f"{verb} {count} message{'s' if count != 1 else ''} from {dead_letter_path(result.queue)}"
    )
    return "\n".join(lines)
