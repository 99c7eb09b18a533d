"""The event signature on its own: what it covers, its window either way, the header's
forms, and the worked example of docs/events.md against the code."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

import pytest

from shared.domain.event_signature import (
    WINDOW_SECONDS,
    header,
    refusal,
    signature,
    signed_text,
)
from tests.infra.deployment import ROOT

SECRET = "unit-secret"
BODY = b'{"eventId":"ev-1","data":{"approved":true,"by":"ana"}}'
SIGNED_AT = datetime(2026, 1, 1, tzinfo=UTC)
T = int(SIGNED_AT.timestamp())


def check(
    value: str | None,
    order: str = "o-1",
    event: str = "review",
    body: bytes = BODY,
    now: datetime = SIGNED_AT,
) -> str | None:
    return refusal(value, SECRET, order, event, body, now)


def test_a_signature_for_this_order_event_and_body_within_the_window_is_good() -> None:
    good = header(SECRET, T, "o-1", "review", BODY)
    assert check(good) is None
    assert check(good, now=SIGNED_AT + timedelta(seconds=WINDOW_SECONDS)) is None
    assert check(good, now=SIGNED_AT - timedelta(seconds=WINDOW_SECONDS)) is None


@pytest.mark.parametrize(
    ("changed", "why"),
    [
        ({"order": "o-2"}, "does not match"),
        ({"order": "o-1.review"}, "does not match"),
        ({"event": "payment-confirmed"}, "does not match"),
        ({"body": BODY.replace(b"true", b"false")}, "does not match"),
        ({"body": BODY + b" "}, "does not match"),
        ({"now": SIGNED_AT + timedelta(seconds=WINDOW_SECONDS + 1)}, "301 s ago"),
        ({"now": SIGNED_AT - timedelta(seconds=WINDOW_SECONDS + 1)}, "301 s ahead"),
    ],
)
def test_anything_else_is_refused_saying_why(changed: dict[str, object], why: str) -> None:
    good = header(SECRET, T, "o-1", "review", BODY)
    reason = check(good, **changed)  # type: ignore[arg-type]
    assert reason is not None and why in reason


def test_another_secret_does_not_verify() -> None:
    assert "does not match" in str(check(header("guess", T, "o-1", "review", BODY)))


@pytest.mark.parametrize(
    ("value", "why"),
    [
        (None, "is required"),
        ("  ", "is required"),
        ("sha256=" + "0" * 64, "no longer accepted"),
        ("v1=" + "0" * 64, "one t"),
        (f"t={T},t={T},v1=" + "0" * 64, "one t"),
        (f"t=-{T},v1=" + "0" * 64, "one t"),
        (f"t={T}.5,v1=" + "0" * 64, "one t"),
        (f"t={T}", "64 hex digits"),
        (f"t={T},v1=xyz", "64 hex digits"),
        (f"t={T} v1=abc", "must be t="),
        ("t=1," + "v1=" + "0" * 64 + "," * 2000, "must be t="),
    ],
)
def test_an_unreadable_header_is_refused_saying_what_form_is_expected(
    value: str | None, why: str
) -> None:
    reason = check(value)
    assert reason is not None and why in reason, reason


def test_upper_case_hex_spaces_unknown_keys_and_a_second_v1_are_taken() -> None:
    sig = signature(SECRET, T, "o-1", "review", BODY)
    assert check(f" t={T}, v1={sig.upper()} ") is None
    assert check(f"t={T},v0=old,v1={'0' * 64},v1={sig}") is None


def test_the_names_cannot_smuggle_a_line_feed_into_the_signed_text() -> None:
    with pytest.raises(ValueError, match="line feed"):
        signed_text(T, "o-1\n", "review", BODY)
    good = header(SECRET, T, "o-1", "review", BODY)
    assert "line feed" in str(check(good, order="o-1\n"))


def test_the_worked_example_in_docs_events_md_is_what_the_code_computes() -> None:
    doc = (ROOT / "docs" / "events.md").read_text(encoding="utf-8")
    example = doc.split("### Worked example", 1)[1].split("## Operators", 1)[0]

    def field(name: str) -> str:
        found = re.search(rf"^    {name} +(\S+)", example, re.M)
        assert found, name
        return found.group(1)

    secret, order, event, t = field("secret"), field("order"), field("event"), int(field("t"))
    body = re.search(r"^    body +(.+)$", example, re.M)
    assert body
    raw = body.group(1).encode()
    lines = f"    {t}\n    {order}\n    {event}\n    {raw.decode()}\n"
    assert lines in example, "the signed text shown"
    assert signed_text(t, order, event, raw) == lines.replace("    ", "").rstrip("\n").encode()
    shown = re.search(r"^    x-signature: (\S+)$", example, re.M)
    assert shown and shown.group(1) == header(secret, t, order, event, raw)
    assert datetime.fromtimestamp(t, UTC).isoformat().replace("+00:00", "Z") in example
