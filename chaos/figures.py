"""The report's counts: what happened during the run, next to the PASS/FAIL verdicts."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from chaos.model import Figures, Observations

LOG_PATTERNS: dict[str, re.Pattern[str]] = {
    # The message of the ChaosFault, not the `raise` line a logged traceback quotes.
    "chaos crashes injected": re.compile(r"chaos: injected crash [a-z]"),
    "stale replies ignored": re.compile(r"stale reply ignored"),
    "requests expired on arrival": re.compile(r"arrived after its complete-by"),
    "agents silent at the deadline": re.compile(r"gave up at its complete-by"),
}
IN_OUTAGE = "expired-in-outage"
RECOVERY_EVENTS = frozenset({"timed-out", IN_OUTAGE})
"""History events of a Supervisor recovery: counted, or forgiven as the outage's doing."""
SIMULATOR_KEYS = (
    "calls",
    "applied",
    "transientErrors",
    "transientErrorsAfterApply",
    "hangs",
    "applyThenHangs",
    "queries",
    "permanentFailures",
    "idempotentRepeats",
    "keyReuseRejections",
    "lateArrivals",
    "lateApplied",
)
BROKER_KEYS = (
    "sent",
    "duplicated",
    "duplicatesSuppressed",
    "dropped",
    "delayed",
    "abandoned",
    "deadLettered",
)


def count_log_lines(paths: Iterable[Path]) -> dict[str, int]:
    counts = dict.fromkeys(LOG_PATTERNS, 0)
    for path in paths:
        try:
            text = path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            continue
        for name, pattern in LOG_PATTERNS.items():
            counts[name] += len(pattern.findall(text))
    return counts


def _sum(stats: Mapping[str, Any], keys: Iterable[str]) -> dict[str, int]:
    totals = dict.fromkeys(keys, 0)
    for per in stats.values():
        if isinstance(per, Mapping):
            for key in totals:
                totals[key] += int(per.get(key, 0))
    return totals


def figures(
    obs: Observations,
    simulator_stats: Mapping[str, Any],
    broker_stats: Mapping[str, Any],
    log_counts: Mapping[str, int],
    event_answers: Mapping[str, int] | None = None,
) -> Figures:
    states = Counter(
        p.state.process_state.value if (p := obs.processes.get(order_id)) else "missing"
        for order_id in obs.accepted
    )
    by_workflow: dict[str, Counter[str]] = {}
    for order_id in obs.accepted:
        p = obs.processes.get(order_id)
        state = p.state.process_state.value if p else "missing"
        by_workflow.setdefault(obs.workflow_name(order_id), Counter())[state] += 1
    simulator = _sum(simulator_stats, SIMULATOR_KEYS)
    simulator["retried calls (same key)"] = max(simulator["calls"] - len(obs.effects), 0)
    return Figures(
        states=dict(states),
        states_by_workflow={name: dict(counts) for name, counts in sorted(by_workflow.items())},
        recoveries=sum(
            1 for p in obs.processes.values() for h in p.history if h.event in RECOVERY_EVENTS
        ),
        recoveries_in_outage=sum(
            1 for p in obs.processes.values() for h in p.history if h.event == IN_OUTAGE
        ),
        alerts_by_reason=dict(Counter(a.reason for a in obs.alerts)),
        simulator=simulator,
        broker=_sum(broker_stats, BROKER_KEYS),
        log_counts=dict(log_counts),
        events=event_figures(obs, event_answers or {}),
        limits=limit_figures(obs),
    )


def limit_figures(obs: Observations) -> dict[str, int]:
    """What our own limits did: steps held for them (a hold's history entry), and the
    most calls each limited service saw in one second against its limit."""
    counts = {
        "steps held (step-held)": sum(
            1 for p in obs.processes.values() for h in p.history if h.event == "step-held"
        ),
        "orders waiting in their customer's line": sum(
            1
            for p in obs.processes.values()
            for h in p.history
            if h.event == "waiting-for-fair-share"
        ),
    }
    for agent, rate in sorted(obs.limits.items()):
        seen = obs.max_calls_in_one_second.get(agent, 0)
        counts[f"{agent}: most calls in one second (limit {rate}/s)"] = seen
    return counts


def event_figures(obs: Observations, answers: Mapping[str, int]) -> dict[str, int]:
    """The reviewer's sends by answer, then what the orders did with the events."""
    kept = [e for p in obs.processes.values() for e in p.state.events]
    counts = {f"sent: {answer}": n for answer, n in sorted(answers.items())}
    counts["accepted eventIds"] = len(obs.events)
    counts["  sent early"] = sum(1 for e in obs.events if e.early)
    counts["  approvals"] = sum(1 for e in obs.events if e.approved)
    counts["kept by the orders"] = len(kept)
    counts["consumed"] = sum(1 for e in kept if e.consumed_by is not None)
    counts["timers fired"] = sum(
        1 for p in obs.processes.values() for h in p.history if h.event == "timer-fired"
    )
    return counts
