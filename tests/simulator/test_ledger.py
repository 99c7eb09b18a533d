"""The effect ledger file across versions: an older file gains the traceparents column."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from devhost.simulator.effects import EffectLedger

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
