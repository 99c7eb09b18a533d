"""One rule for text and numbers at the edge (issue 41, findings 1-3): every string that
enters by HTTP or by queue is Unicode with no lone surrogate, and every number is finite.
Python's parser lets both through (`"\\ud800"`, `NaN`, `Infinity`, `1e400`), and what it
lets in is stored, then breaks the archive's UTF-8, the Tables SDK's filter quoting and
every client's JSON. Anything else is a precise 400 over HTTP and a dead letter with its
reason on a queue, before any handler sees it."""

from __future__ import annotations

import json
import logging
import math
from dataclasses import replace
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from shared import jsonbounds
from shared.contract import Queue
from shared.domain.machine.forward import start
from shared.domain.messages import AgentReply, AgentRequest, InvalidMessage, Nudge
from shared.domain.model import ReceivedEvent
from tests.builders import an_order
from tests.functions.conftest import Harness
from tests.workflows import REVIEWED_ORDER

ITEM = {"sku": "SKU-1", "quantity": 1, "unitPrice": 1.0}
ORDER = {"customerId": "c-1", "items": [ITEM]}

BAD_TEXT = {
    "lone high surrogate": (r'"\ud800x"', "lone surrogate"),
    "lone low surrogate": (r'"\udc00"', "lone surrogate"),
    "reversed pair": (r'"\udc00\ud800"', "lone surrogate"),
    "surrogate as raw bytes": ('"\ud800"', "lone surrogate"),
}
"""How a lone surrogate gets into a JSON body: an escape, or bytes that encode U+D800
as UTF-8 would (CESU-8), which Python's parser reads with surrogatepass."""
BAD_NUMBERS = {
    "NaN": ("NaN", "NaN is not a finite number"),
    "Infinity": ("Infinity", "Infinity is not a finite number"),
    "-Infinity": ("-Infinity", "-Infinity is not a finite number"),
    "1e400": ("1e400", "1e400 is not a finite number"),
    "-1E+999": ("-1E+999", "-1E+999 is not a finite number"),
    "a 400-digit float": ("9" * 400 + ".5", "is not a finite number"),
}
BAD = {**BAD_TEXT, **BAD_NUMBERS}


def raw_json(template: str, bad: str) -> bytes:
    """`template` with `$` replaced by the JSON token `bad`, as bytes on the wire."""
    return template.replace("$", bad).encode("utf-8", "surrogatepass")


ROUTES = {
    "submit": ("submit_order_http", "POST", "orders", {}, '{"customerId": $, "items": []}'),
    "cancel": (
        "cancel_order_http",
        "POST",
        "orders/o-1/cancel",
        {"orderId": "o-1"},
        '{"reason": $}',
    ),
    "event": (
        "send_event_http",
        "POST",
        "orders/o-1/events/review",
        {"orderId": "o-1", "eventName": "review"},
        '{"eventId": "ev-1", "data": {"approved": true, "by": $}}',
    ),
    "bulk": (
        "bulk_orders",
        "POST",
        "orders/bulk",
        {},
        '{"action": "cancel", "dryRun": true, "filter": {"state": "Error", "customerId": $}}',
    ),
    "drain": (
        "drain_agent_http",
        "PUT",
        "agents/payment/drain",
        {"agent": "payment"},
        '{"drained": true, "reason": $}',
    ),
}
PATHS = {
    "submit": "customerId",
    "cancel": "reason",
    "event": "data.by",
    "bulk": "filter.customerId",
    "drain": "reason",
}


@pytest.mark.parametrize("route", ROUTES)
@pytest.mark.parametrize("bad", BAD)
async def test_a_lone_surrogate_or_a_non_finite_number_in_a_body_is_a_400(
    harness: Harness, caplog: pytest.LogCaptureFixture, route: str, bad: str
) -> None:
    name, method, path, route_params, template = ROUTES[route]
    token, said = BAD[bad]
    response = await harness.http(
        name, method, path, raw=raw_json(template, token), route_params=route_params
    )
    assert response.status_code == 400, response.get_body()[:300]
    assert response.mimetype == "application/problem+json"
    detail = json.loads(response.get_body())["detail"]
    assert f"{PATHS[route]}: " in detail and said in detail, detail
    assert (await harness.store.list_by_state(None, 10, None)).items == ()
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []


async def test_the_rule_names_where_in_the_document_and_keeps_the_detail_printable() -> None:
    with pytest.raises(jsonbounds.Unrepresentable) as caught:
        jsonbounds.loads(r'{"items": [{"sku": "a", "unitPrice": NaN}]}')
    assert str(caught.value) == "items.0.unitPrice: NaN is not a finite number"
    with pytest.raises(jsonbounds.Unrepresentable) as caught:
        jsonbounds.loads(r'{"\ud800": 1}')
    assert str(caught.value).encode("ascii"), "the detail is safe to log and to park"
    assert r"\ud800" in str(caught.value)
    with pytest.raises(jsonbounds.Unrepresentable, match="body: a lone surrogate"):
        jsonbounds.loads(r'"\udfff"')


@pytest.mark.parametrize(
    "fine",
    [
        r'"\ud83d\ude00 paired"',
        '"\U0001f600 raw"',
        "1e308",
        "-1.7976931348623157e308",
        "1e-400",
        "9" * 500,
        '"NaN and Infinity are words"',
        r'"\\ud800 is a backslash and five letters"',
        '{"id": "3e456-e999"}',
    ],
)
def test_what_looks_alike_but_keeps_is_accepted(fine: str) -> None:
    assert jsonbounds.loads(fine) == json.loads(fine)
    jsonbounds.check(fine.encode())


NUMBER_TOKENS = st.one_of(
    st.from_regex(r"-?(0|[1-9][0-9]{0,3})(\.[0-9]{1,3})?([eE][+-]?0*[0-9]{1,4})?", fullmatch=True),
    st.from_regex(r"-?[1-9][0-9]{200,260}(\.[0-9])?[eE]\+?[4-9][0-9]", fullmatch=True),
    st.from_regex(r"-?[1-9][0-9]{300,315}\.[0-9]", fullmatch=True),
)
"""Exponents of up to four digits, and the long mantissas that overflow with two or none."""
ANY_TEXT = st.text(st.characters(exclude_categories=()), max_size=8)
"""Every code point, lone surrogates included (hypothesis leaves them out by default)."""
DOCUMENTS = st.recursive(
    st.none() | st.booleans() | st.floats() | ANY_TEXT,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(ANY_TEXT, inner, max_size=3),
    max_leaves=8,
)
LOOKALIKES = st.sampled_from(["3e456", "ab-1e999", "x9e+100", "\\ud800", "1.5", "E-07"])


def breaks_the_rule(value: Any) -> bool:
    if isinstance(value, float):
        return not math.isfinite(value)
    if isinstance(value, str):
        return any(0xD800 <= ord(c) <= 0xDFFF for c in value)
    if isinstance(value, list):
        return any(breaks_the_rule(v) for v in value)
    if isinstance(value, dict):
        return any(breaks_the_rule(k) or breaks_the_rule(v) for k, v in value.items())
    return False


def refused(raw: bytes) -> bool:
    try:
        jsonbounds.check(raw)
    except jsonbounds.Unrepresentable:
        return True
    return False


@given(token=NUMBER_TOKENS, before=st.sampled_from(["[", "[ ", '{"a":', '{"a":\n']))
def test_a_number_is_refused_exactly_when_it_is_not_finite(token: str, before: str) -> None:
    """The queue's fast path looks for what may overflow without parsing; it must never
    miss one, whatever its digits, exponent or place."""
    closing = "]" if before.startswith("[") else "}"
    raw = (before + token + closing).encode()
    assert refused(raw) == (not math.isfinite(float(token))), raw


@given(document=DOCUMENTS, ascii_only=st.booleans(), lookalike=LOOKALIKES)
def test_a_document_is_refused_exactly_when_it_holds_a_lone_surrogate_or_a_non_finite(
    document: Any, ascii_only: bool, lookalike: str
) -> None:
    """Escaped (`\\ud800`, as json.dumps writes it) or raw (the bytes a CESU-8 writer
    sends), and next to text that looks alike but keeps."""
    text = json.dumps([lookalike, document], ensure_ascii=ascii_only)
    raw = text.encode("utf-8", "surrogatepass")
    assert refused(raw) == breaks_the_rule(document), raw[:200]


QUEUES = {
    "scheduler_reply": (
        Queue.AGENT_REPLIES,
        '{"orderId": "o-1", "step": "reserve-inventory", "action": "do", "attempt": 1, '
        '"outcome": "succeeded", "result": {"ref": $}}',
        "result.ref",
    ),
    "payment_agent": (
        "agent-payment",
        '{"orderId": "o-1", "step": "charge-payment", "action": "do", "attempt": 1, '
        '"completeBy": "2030-01-01T00:00:00Z", "idempotencyKey": "o-1:charge-payment", '
        '"payload": {"amount": $}}',
        "payload.amount",
    ),
    "submit_order_message": (
        Queue.ORDERS,
        '{"orderId": "o-1", "customerId": "c-1", "items": [{"sku": "S", "quantity": 1, '
        '"unitPrice": $}]}',
        "items.0.unitPrice",
    ),
    "scheduler_nudge": (Queue.SCHEDULER, '{"orderId": "o-1", "reason": $}', "reason"),
}


@pytest.mark.parametrize("function", QUEUES)
@pytest.mark.parametrize("bad", BAD)
async def test_a_lone_surrogate_or_a_non_finite_number_in_a_message_is_dead_lettered(
    harness: Harness, function: str, bad: str
) -> None:
    queue, template, where = QUEUES[function]
    token, said = BAD[bad]
    await harness.message(function, raw_json(template, token), message_id="bad-1")
    (parked,) = harness.bus.parked
    assert (parked.queue, parked.message_id, parked.reason) == (queue, "bad-1", "invalid-message")
    assert f"{where}: " in parked.detail and said in parked.detail, parked.detail
    assert parked.detail.isascii(), "a poison property the broker can carry"
    assert all(not r.calls for r in harness.remotes.values()), "no agent acted on it"
    assert (await harness.store.list_by_state(None, 10, None)).items == ()


@pytest.mark.parametrize("kind", [Nudge, AgentReply, AgentRequest])
def test_every_message_kind_parses_through_the_rule(kind: Any) -> None:
    with pytest.raises(InvalidMessage, match="not a finite number"):
        kind.parse(b'{"orderId": "o-1", "x": NaN}')


async def test_an_order_stored_before_the_rule_is_answered_as_json_that_keeps_it(
    harness: Harness,
) -> None:
    """An older version stored `"by": NaN` (finding 3) and a lone surrogate in a cancel
    reason (finding 1): the order's GET was invalid JSON ("Unexpected token 'N'" on the
    operator page). Each is answered as null and U+FFFD now."""
    order = replace(an_order("o-old"), customer_id="c-1")
    process = start(order, REVIEWED_ORDER, harness.clock.now()).process
    approval = ReceivedEvent(
        "ev-1", "review", harness.clock.now(), {"approved": True, "by": math.nan}
    )
    state = replace(process.state, last_error="cancelled: \ud800", events=(approval,))
    await harness.store.create(replace(process, state=state), [])
    for name, path, params in (
        ("get_order", "orders/o-old", {"orderId": "o-old"}),
        ("list_orders_http", "orders", {}),
    ):
        response = await harness.http(name, "GET", path, route_params=params)
        assert response.status_code == 200
        answer = jsonbounds.loads(response.get_body())  # the rule's own parse: strict
        shown = answer if name == "get_order" else answer["items"][0]
        assert shown["lastError"] == "cancelled: \ufffd"
        if name == "get_order":
            assert answer["events"][0]["by"] is None
