"""The effect ledger file across versions (an older file gains the newer columns) and
its clock."""

from __future__ import annotations

import sqlite3
from datetime import UTC, datetime
from pathlib import Path

from devhost.simulator.effects import EffectLedger, Outcome, OutcomeKind

_BEFORE_TRACEPARENTS = """
CREATE TABLE effects (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    service TEXT NOT NULL,
    idempotency_key TEXT NOT NULL,
    operation TEXT NOT NULL,
    order_id TEXT NOT NULL,
    calls INTEGER NOT NULL DEFAULT 0,
    applied INTEGER NOT NULL DEFAULT 0,
    outcome TEXT,
    response TEXT,
    UNIQUE (service, idempotency_key)
);
INSERT INTO effects (service, idempotency_key, operation, order_id, calls, applied, outcome,
    response) VALUES ('payment', 'o-1:charge-payment', 'charge-payment', 'o-1', 1, 1,
    'applied', '{"paymentId": "pay-1"}');
"""


def test_a_ledger_file_from_before_traceparents_opens_and_records_them(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    with sqlite3.connect(path) as db:
        db.executescript(_BEFORE_TRACEPARENTS)

    ledger = EffectLedger(path)
    try:
        [old] = ledger.list()
        ledger.register_call("payment", "o-1:charge-payment", "charge-payment", "o-1", "00-a-b-01")
        again = ledger.get("payment", "o-1:charge-payment")
    finally:
        ledger.close()

    assert old.traceparents == ()
    assert old.to_json()["traceparents"] == []
    assert again is not None
    assert (again.calls, again.traceparents) == (2, ("00-a-b-01",))
    assert again.outcome is not None and again.outcome.body == {"paymentId": "pay-1"}


def test_a_ledger_file_from_before_the_provider_model_gains_its_columns(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    with sqlite3.connect(path) as db:
        db.executescript(_BEFORE_TRACEPARENTS)

    ledger = EffectLedger(path)
    try:
        [old] = ledger.list()
        ledger.register_call("payment", "o-1:refund-payment", "refund-payment", "o-1", None, "k")
        [_, undo] = ledger.list()
    finally:
        ledger.close()

    assert old.to_json() | {"traceparents": []} == {
        "service": "payment",
        "operation": "charge-payment",
        "orderId": "o-1",
        "idempotencyKey": "o-1:charge-payment",
        "calls": 1,
        "applied": 1,
        "traceparents": [],
        "firstCallAt": None,
        "appliedAt": None,
        "abandoned": False,
    }
    assert (undo.undoes, undo.undone, undo.first_call_at is not None) == ("k", None, True)


def test_stamps_come_from_the_clock_and_never_go_back() -> None:
    """Two settles within one clock tick still read in the order they happened."""
    moment = datetime(2026, 1, 1, tzinfo=UTC)
    ledger = EffectLedger(clock=lambda: moment)
    try:
        for key in ("a", "b"):
            ledger.register_call("payment", key, "charge-payment", "o-1")
            ledger.settle("payment", key, "charge-payment", "o-1", Outcome(OutcomeKind.APPLIED, {}))
        a, b = ledger.list()
    finally:
        ledger.close()

    assert a.first_call_at == moment
    assert a.first_call_at < a.applied_at < b.first_call_at < b.applied_at  # type: ignore[operator]
    assert b.to_json()["appliedAt"] == "2026-01-01T00:00:00.000003Z"
