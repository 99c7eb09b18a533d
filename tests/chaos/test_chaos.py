"""Prove it heals: the whole system under mixed faults, injected crashes, kill -9 of a
runtime, of the broker and of Azurite, and random operator cancels.

The seeded quick run (60 orders, one kill, a 6 s broker outage, a 4 s Azurite outage,
about a minute) belongs
to the default suite; the issue's 1,000-order run is marked slow (`bin/test -m slow`).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from chaos import config as presets
from chaos.report import as_text
from chaos.run import RunResult, run_chaos

pytestmark = [pytest.mark.azurite, pytest.mark.broker]


def assert_healed(result: RunResult) -> None:
    assert result.passed, as_text(result)
    first = result.checks[0]
    assert len(first.observations.accepted) == result.config.orders
    assert len(result.kills) == result.config.kills
    assert len(result.outages) == len(result.config.infra.outages)
    assert {o.service for o in result.outages} == {"broker", "azurite"}
    assert result.cancels["202"] > 0, as_text(result)  # some orders were cancelled
    # The faults did hit: otherwise the run proves nothing.
    assert first.figures.recoveries > 0, as_text(result)
    assert first.figures.broker["duplicated"] > 0
    assert first.figures.simulator["transientErrors"] > 0
    assert first.figures.simulator["applyThenHangs"] > 0, as_text(result)
    assert first.figures.simulator["queries"] > 0, as_text(result)
    assert first.figures.log_counts["chaos crashes injected"] > 0
    assert first.figures.states.get("Compensated", 0) > 0
    # The mix ran: express-delivery orders were in it and some went through to the end.
    express = first.figures.states_by_workflow.get("express-delivery", {})
    assert sum(express.values()) > 0, as_text(result)
    assert express.get("Processed", 0) > 0, as_text(result)
    # Reviewed orders ran, their reviewer's events were accepted, early and once
    # waiting, through the outages, and the orders took them; scheduled ones shipped.
    reviewed = first.figures.states_by_workflow.get("reviewed-order", {})
    assert reviewed.get("Processed", 0) > 0, as_text(result)
    events = first.figures.events
    assert events["accepted eventIds"] > 0, as_text(result)
    assert 0 < events["  sent early"] < events["accepted eventIds"], as_text(result)
    assert events["consumed"] > 0, as_text(result)
    # Some were sent while the broker or Azurite was down (a 503 asked again).
    assert sum(n for k, n in events.items() if k.endswith(" down")) > 0, as_text(result)
    assert any(e.approved is False for e in first.observations.events), as_text(result)
    scheduled = first.figures.states_by_workflow.get("scheduled-delivery", {})
    assert scheduled.get("Processed", 0) > 0, as_text(result)
    assert events["timers fired"] > 0, as_text(result)


@pytest.mark.e2e
async def test_quick_chaos_run_heals_and_keeps_every_invariant(tmp_path: Path) -> None:
    result = await run_chaos(presets.quick(seed=7), tmp_path)
    assert_healed(result)


@pytest.mark.slow
@pytest.mark.e2e
@pytest.mark.timeout(1800)
async def test_thousand_orders_with_two_kills_heal_and_keep_every_invariant(
    tmp_path: Path,
) -> None:
    result = await run_chaos(presets.full(orders=1000, seed=1), tmp_path)
    assert_healed(result)
    assert len(result.kills) >= 2
