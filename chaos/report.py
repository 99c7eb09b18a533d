"""The run's report as rich tables: setup, outcomes, what was absorbed, verdicts."""

from __future__ import annotations

import io
from collections import Counter

from rich.console import Console, Group, RenderableType
from rich.table import Table
from rich.text import Text

from chaos.held import left_in_error
from chaos.model import Check
from chaos.run import RunResult

STATES = ("Processed", "Compensated", "Error")
SHOWN_VIOLATIONS = 10


def _pct(rate: float) -> str:
    return f"{rate * 100:g}%"


def setup_table(result: RunResult) -> Table:
    config = result.config
    t, remote, broker = config.timings, config.remote, config.broker
    first = result.checks[0].observations if result.checks else None
    table = Table(title=f"chaos run {result.run_id} (seed {config.seed})", show_header=False)
    table.add_column("what", style="bold")
    table.add_column("value")
    if first is not None:
        failing = Counter(
            f"{first.workflow_name(p.order_id)}/{p.failing_service}"
            for p in first.planned.values()
            if p.failing_service is not None
        )
        table.add_row(
            "orders",
            f"{len(first.accepted)} accepted of {len(first.planned)} over HTTP, spread over "
            f"2 runtimes, at most {config.submit_rate:g}/s and {config.max_in_flight} "
            "unfinished at once; "
            f"{sum(failing.values())} with a rejected SKU "
            f"({', '.join(f'{s} {n}' for s, n in sorted(failing.items()))})",
        )
    table.add_row(
        "timings",
        f"StepTimeout {t.step_timeout_seconds} s, PendingTimeout {t.pending_timeout_seconds} s, "
        f"Supervisor every {t.supervisor_period_seconds} s (on both runtimes), "
        f"MaxFailureCount {t.max_failure_count}, broker lock {t.broker_lock_seconds:g} s",
    )
    table.add_row(
        "remote faults",
        f"transient errors {_pct(remote.transient_error_rate)}, hangs {_pct(remote.hang_rate)} "
        f"({remote.hang_seconds:g} s, past the deadline), apply-then-hang "
        f"{_pct(remote.apply_then_hang_rate)}, latency {remote.latency_ms} ms "
        f"+ up to {remote.latency_jitter_ms} ms; "
        + "".join(f"{service} {ms} ms slower per call; " for service, ms in remote.steady_slow)
        + "no abandon route at "
        f"{', '.join(remote.without_abandon) or 'none'}",
    )
    slow = config.slow
    table.add_row(
        "slow provider",
        f"{slow.service} {slow.slow_ms} ms per call from {_pct(slow.from_share)} to "
        f"{_pct(slow.to_share)} of the orders accepted, at least {slow.min_seconds:g} s"
        if slow.slow_ms > 0
        else "none",
    )
    table.add_row(
        "broker faults",
        f"duplicates {_pct(broker.duplicate_rate)}, loss {_pct(broker.drop_rate)}, "
        f"delays {_pct(broker.delay_rate)} x {broker.delay_ms} ms (workflow queues)",
    )
    table.add_row("injected crashes", f"ChaosFaultRate {config.chaos_fault_rate:g} in handlers")
    table.add_row(
        "kill -9",
        "; ".join(
            f"{k.instance_id} (pid {k.pid}) at {k.at:.1f} s, back after {k.back_after:.1f} s"
            for k in result.kills
        )
        or "none",
    )
    for service, label in (("broker", "broker kill -9"), ("azurite", "Azurite kill -9")):
        table.add_row(
            label,
            "; ".join(
                f"pid {o.pid} at {o.at:.1f} s, back after {o.down_seconds:.1f} s"
                + (f", {o.runtime_killed} killed meanwhile" if o.runtime_killed else "")
                for o in result.outages
                if o.service == service
            )
            or "none",
        )
    cancels = config.cancels
    table.add_row(
        "operator cancels",
        f"{_pct(cancels.share)} of the orders within {cancels.within_seconds:g} s of their 202, "
        f"{_pct(cancels.twice_share)} of them twice at once; answers "
        + (", ".join(f"{k} {n}" for k, n in sorted(result.cancels.items())) or "none"),
    )
    suspends = config.suspends
    table.add_row(
        "operator suspends",
        f"{_pct(suspends.share)} of the orders within {suspends.within_seconds:g} s of their "
        f"202, resumed up to {suspends.hold_seconds:g} s later; answers "
        + (", ".join(f"{k} {n}" for k, n in sorted(result.suspends.items())) or "none"),
    )
    outages = len(config.infra.outages)
    mix = Counter(config.workflows)
    table.add_row(
        "workflows",
        ", ".join(f"{name} {n}/{len(config.workflows)}" for name, n in mix.items())
        + " of the orders, in turn",
    )
    table.add_row(
        "convergence bound",
        f"{result.bound_seconds:.0f} s after the last submission = (MaxFailureCount "
        f"{t.max_failure_count} + {config.dispatches} finishing dispatches: steps and "
        "undos) x (max(StepTimeout, PendingTimeout) "
        f"{max(t.step_timeout_seconds, t.pending_timeout_seconds)} s + sweep period "
        f"{t.supervisor_period_seconds} s + longest back-off {t.max_backoff_seconds:g} s)"
        + (
            f" + {outages} broker or Azurite outage(s) of {config.infra.outage_seconds:g} s "
            "in all, "
            "each followed by the Supervisor's longest back-off, a PendingTimeout and "
            "one expiry"
            if outages
            else ""
        ),
    )
    table.add_row("load", f"last order accepted {result.load_seconds:.1f} s after the first")
    for check in result.checks:
        table.add_row(f"time to converge ({check.title})", convergence(check, result.bound_seconds))
    if result.resubmitted:
        table.add_row("operator", f"resubmitted {result.resubmitted} Error order(s)")
    for problem in result.problems:
        table.add_row("[red]problem[/]", problem)
    table.add_row("elapsed", f"{result.elapsed:.0f} s; logs and broker db in {result.workdir}")
    return table


def convergence(check: Check, bound: float) -> str:
    c = check.convergence
    terminal = (
        f"every order terminal {c.terminal_after:.1f} s after the last submission"
        if c.terminal_after is not None
        else "NOT every order terminal"
    )
    settled = (
        f"watch list empty {c.settled_after:.1f} s later"
        if c.settled_after is not None
        else f"{c.still_watched} order(s) still on the watch list"
    )
    return f"{terminal} (bound {bound:.0f} s); {settled}"


def states_table(checks: list[Check]) -> Table:
    table = Table(title="orders by final state")
    table.add_column("when")
    for state in (*STATES, "other"):
        table.add_column(state, justify="right")
    for check in checks:
        states = check.figures.states
        other = sum(n for s, n in states.items() if s not in STATES)
        table.add_row(check.title, *(str(states.get(s, 0)) for s in STATES), str(other))
    return table


def states_by_workflow_table(checks: list[Check]) -> Table:
    table = Table(title="orders by workflow and final state")
    table.add_column("when")
    table.add_column("workflow")
    for state in (*STATES, "other"):
        table.add_column(state, justify="right")
    for check in checks:
        for name, states in sorted(check.figures.states_by_workflow.items()):
            other = sum(n for s, n in states.items() if s not in STATES)
            table.add_row(check.title, name, *(str(states.get(s, 0)) for s in STATES), str(other))
    return table


def held_table(checks: list[Check]) -> Table | None:
    """Why each order in Error at the end of a check is there (chaos/held.py); None
    when no check ended with one."""
    rows = [(check.title, held) for check in checks for held in left_in_error(check.observations)]
    if not rows:
        return None
    table = Table(title="orders left in Error: why")
    table.add_column("when", overflow="fold")
    table.add_column("order", overflow="fold")
    table.add_column("why", overflow="fold")
    for title, held in rows:
        if held.planned is None:
            planned = "nothing: meant to go through"
        else:
            planned = held.planned + ("" if held.as_planned else ", yet held elsewhere")
        resubmits = f"\nresubmitted {held.resubmits}x" if held.resubmits else ""
        table.add_row(
            title,
            f"{held.order_id}\n{held.workflow}{resubmits}",
            f"{held.step}: {held.error_code}; alerts: "
            f"{', '.join(held.alerts) or '[red]none[/]'}\n"
            f"planned: {planned}\n"
            f"in force: {', '.join(held.in_force) or 'nothing'}",
        )
    return table


def figures_table(result: RunResult) -> Table:
    checks = result.checks
    table = Table(title="what the system absorbed (cumulative)")
    table.add_column("figure")
    for check in checks:
        table.add_column(check.title, justify="right")

    def row(label: str, pick: str) -> None:
        table.add_row(label, *(pick_figure(c, pick) for c in checks))

    row("Supervisor recoveries (history timed-out, expired-in-outage)", "recoveries")
    row("  of which not counted (deadline passed in an outage)", "recoveries_in_outage")
    row("remote calls", "sim:calls")
    row("  retried calls (same idempotency key)", "sim:retried calls (same key)")
    row("  transient errors injected", "sim:transientErrors")
    row("    of which after the effect was applied", "sim:transientErrorsAfterApply")
    row("  hangs injected", "sim:hangs")
    row("  apply-then-hang injected (effect applied, reply lost)", "sim:applyThenHangs")
    row("  held on the network past their live time (late arrivals)", "sim:lateArrivals")
    row("    of which applied when they arrived", "sim:lateApplied")
    row("outcome queries (in-doubt steps, then reconciliation)", "sim:queries")
    row("  idempotent replays", "sim:idempotentRepeats")
    row("  permanent rejections", "sim:permanentFailures")
    row("broker: duplicate deliveries injected", "broker:duplicated")
    row("broker: duplicates suppressed (same message id)", "broker:duplicatesSuppressed")
    row("broker: messages lost", "broker:dropped")
    row("broker: messages delayed", "broker:delayed")
    row("broker: abandoned by a handler", "broker:abandoned")
    row("broker: dead-lettered", "broker:deadLettered")
    row("chaos crashes injected (logged by the runtimes)", "log:chaos crashes injected")
    row("stale replies ignored (runtime logs)", "log:stale replies ignored")
    row("agent requests expired on arrival (runtime logs)", "log:requests expired on arrival")
    row("agents silent at the deadline (runtime logs)", "log:agents silent at the deadline")
    table.add_row("kill -9 of a runtime", *(str(len(result.kills)) for _ in checks))
    names = list(dict.fromkeys(k for c in checks for k in c.figures.events))
    for name in names:
        table.add_row(f"events: {name}", *(str(c.figures.events.get(name, 0)) for c in checks))
    limits = list(dict.fromkeys(k for c in checks for k in c.figures.limits))
    for name in limits:
        table.add_row(f"limits: {name}", *(str(c.figures.limits.get(name, 0)) for c in checks))
    reasons = sorted({r for c in checks for r in c.figures.alerts_by_reason})
    for reason in reasons:
        table.add_row(
            f"operator alerts: {reason}",
            *(str(c.figures.alerts_by_reason.get(reason, 0)) for c in checks),
        )
    return table


def pick_figure(check: Check, pick: str) -> str:
    f = check.figures
    if pick == "recoveries":
        return str(f.recoveries)
    if pick == "recoveries_in_outage":
        return str(f.recoveries_in_outage)
    source, _, key = pick.partition(":")
    values = {"sim": f.simulator, "broker": f.broker, "log": f.log_counts}[source]
    return str(values.get(key, 0))


def invariants_table(checks: list[Check]) -> Table:
    table = Table(title="invariants")
    table.add_column("invariant")
    for check in checks:
        table.add_column(check.title, justify="center")
    names = [r.name for r in checks[0].results] if checks else []
    for i, name in enumerate(names):
        cells = []
        for check in checks:
            r = check.results[i]
            verdict = "[green]PASS[/]" if r.passed else f"[red]FAIL[/] ({len(r.violations)})"
            cells.append(f"{verdict} [dim]{r.checked} checked[/]")
        table.add_row(name, *cells)
    return table


def violations(checks: list[Check]) -> list[RenderableType]:
    shown: list[RenderableType] = []
    for check in checks:
        for r in check.results:
            if r.passed:
                continue
            text = Text(f"FAIL {r.name} ({check.title}):\n", style="bold red")
            for line in r.violations[:SHOWN_VIOLATIONS]:
                text.append(f"  {line}\n")
            if len(r.violations) > SHOWN_VIOLATIONS:
                text.append(f"  ... and {len(r.violations) - SHOWN_VIOLATIONS} more\n")
            shown.append(text)
    return shown


SHOWN_STORIES = 3
"""Orders whose story (history, events kept) a run prints: the first few a violation
names, and the first few still in Error at the end."""


def stories(checks: list[Check]) -> list[RenderableType]:
    """The history and kept events of the first orders a violation names, so that a
    failure found once (a flake) can be read without running it again."""
    shown: list[RenderableType] = []
    named: list[str] = []
    for check in checks:
        for r in check.results:
            for line in () if r.passed else r.violations:
                order_id = line.split(":", 1)[0]
                if order_id in check.observations.processes and order_id not in named:
                    named.append(order_id)
        shown += [_story(check, order_id) for order_id in named[:SHOWN_STORIES]]
        named.clear()
    return shown


def held_stories(checks: list[Check]) -> list[RenderableType]:
    """The history of the first orders still in Error at the end, beside the table
    that says why: the resubmit and what followed it are there to read."""
    if not checks:
        return []
    last = checks[-1]
    held = left_in_error(last.observations)
    return [_story(last, h.order_id) for h in held[:SHOWN_STORIES]]


def _story(check: Check, order_id: str) -> Text:
    process = check.observations.processes[order_id]
    text = Text(f"story of {order_id} ({check.title}):\n", style="bold")
    for h in process.history:
        text.append(f"  {h.at:%H:%M:%S.%f} {h.event}: {h.detail}\n")
    for e in process.state.events:
        text.append(
            f"  kept {e.event_id} at {e.at:%H:%M:%S.%f} {e.data} consumed by {e.consumed_by}\n"
        )
    return text


def render(result: RunResult) -> Group:
    parts: list[RenderableType] = [setup_table(result)]
    if result.checks:
        held = held_table(result.checks)
        parts += [
            states_table(result.checks),
            states_by_workflow_table(result.checks),
            *([] if held is None else [held]),
            figures_table(result),
            invariants_table(result.checks),
            *violations(result.checks),
            *stories(result.checks),
            *held_stories(result.checks),
        ]
    verdict = "PASS" if result.passed else "FAIL"
    parts.append(Text(f"chaos run: {verdict}", style="bold green" if result.passed else "bold red"))
    return Group(*parts)


def print_report(result: RunResult, console: Console | None = None) -> None:
    (console or Console()).print(render(result))


def as_text(result: RunResult, width: int = 160) -> str:
    """The report as plain text (for test failure messages)."""
    buffer = io.StringIO()
    Console(file=buffer, width=width, color_system=None).print(render(result))
    return buffer.getvalue()
