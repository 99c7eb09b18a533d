"""Every state-store method is billed as some Table Storage operation in the bench's
counts: a method missing from the table was counted as "other" (`rewatch` was)."""

from __future__ import annotations

import inspect

from bench._instrument import TABLE_KIND
from shared.ports import StateStore


def test_every_state_store_method_has_a_table_kind() -> None:
    methods = {
        name
        for name, member in inspect.getmembers(StateStore, inspect.isfunction)
        if not name.startswith("_")
    }
    assert methods, "StateStore's methods were not found"
    assert sorted(methods - TABLE_KIND.keys()) == []
