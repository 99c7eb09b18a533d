"""Reading and validating a catalogue: every rule a definition can break, named.

An error names the file, the workflow (and version), the step and the rule, so a team
that edits the catalogue learns what to change without reading this code.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

from pydantic import ValidationError

from shared.catalogue.schema import AgentModel, CatalogueModel, StepModel, WorkflowModel
from shared.domain.limits import AgentLimits
from shared.domain.workflow import (
    AgentRetry,
    AgentSpec,
    Catalogue,
    OnDeadline,
    StepDefinition,
    StepKind,
    Workflow,
)


class CatalogueError(ValueError):
    """The catalogue breaks a rule; `problems` lists each, `str()` all of them."""

    def __init__(self, source: str, problems: list[str]) -> None:
        self.source = source
        self.problems = problems
        super().__init__("\n".join(f"{source}: {p}" for p in problems))


def load(path: Path) -> Catalogue:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise CatalogueError(str(path), [f"cannot read: {exc.strerror or exc}"]) from exc
    return parse(text, str(path))


def parse(text: str, source: str = "catalogue.json") -> Catalogue:
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as exc:
        raise CatalogueError(source, [f"not JSON: {exc}"]) from exc
    try:
        model = CatalogueModel.model_validate(raw)
    except ValidationError as exc:
        raise CatalogueError(
            source,
            [
                f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']} [rule: schema]"
                for e in exc.errors()
            ],
        ) from exc
    problems = list(_problems(model))
    if problems:
        raise CatalogueError(source, problems)
    return _build(model)


def _problems(model: CatalogueModel) -> Iterator[str]:
    agents = {a.name: a for a in model.agents}
    yield from _agent_problems(model.agents, agents)
    seen: set[tuple[str, int]] = set()
    for workflow in model.workflows:
        where = f"workflow {workflow.name} v{workflow.version}"
        if (workflow.name, workflow.version) in seen:
            yield f"{where}: declared twice [rule: unique-version]"
        seen.add((workflow.name, workflow.version))
        yield from (f"{where}: {p}" for p in _workflow_problems(workflow, agents))
    defaults = {w.name for w in model.workflows if w.default}
    if len(defaults) != 1:
        yield (
            f"exactly one workflow must be the default, found {sorted(defaults) or 'none'} "
            "[rule: one-default]"
        )


def _agent_problems(declared: list[AgentModel], agents: dict[str, AgentModel]) -> Iterator[str]:
    names: set[str] = set()
    settings: set[str] = set()
    for agent in declared:
        if agent.name in names:
            yield f"agent {agent.name}: declared twice [rule: unique-agent]"
        if agent.service_url_setting in settings:
            yield (
                f"agent {agent.name}: setting {agent.service_url_setting} names another "
                "agent's service too [rule: unique-setting]"
            )
        names.add(agent.name)
        settings.add(agent.service_url_setting)
        for alternative in agent.alternatives:
            if alternative not in agents or alternative == agent.name:
                yield (
                    f"agent {agent.name}: alternative {alternative!r} is not another declared "
                    "agent [rule: unknown-agent]"
                )


def _workflow_problems(workflow: WorkflowModel, agents: dict[str, AgentModel]) -> Iterator[str]:
    results: dict[str, set[str]] = {}
    events: set[str] = set()
    past_pivot = False
    for step in workflow.steps:
        where = f"step {step.name}"
        if step.name in results:
            yield f"{where}: declared twice [rule: unique-step]"
        try:
            kind = StepKind(step.kind)
        except ValueError:
            kinds = ", ".join(k.value for k in StepKind)
            yield f"{where}: kind {step.kind!r} is not one of {kinds} [rule: step-kind]"
            kind = StepKind.COMPENSATABLE
        if kind.waits:
            yield from (f"{where}: {p}" for p in _wait_problems(step, kind, past_pivot))
            if step.event is not None and step.event in events:
                yield f"{where}: two steps wait for event {step.event!r} [rule: unique-event]"
            events.add(step.event or "")
            results[step.name] = set(step.results)
            continue
        if step.agent is None:
            yield f"{where}: a {kind} step needs an agent [rule: missing-agent]"
        elif step.agent not in agents:
            yield f"{where}: agent {step.agent!r} is not declared [rule: unknown-agent]"
        for field in ("event", "until", "wait_seconds", "on_deadline", "final_deadline_seconds"):
            if getattr(step, field) is not None or step.approval:
                yield (
                    f"{where}: only event and timer steps wait; a {kind} step takes no "
                    f"{'approval' if step.approval else field} [rule: wait-field]"
                )
                break
        if kind is StepKind.COMPENSATABLE:
            if step.undo is None:
                yield f"{where}: a compensatable step needs an undo [rule: missing-undo]"
            if past_pivot:
                yield (
                    f"{where}: a compensatable step cannot follow the pivot or a retriable "
                    "step, whose effects stay [rule: compensatable-after-pivot]"
                )
        elif step.undo is not None:
            yield f"{where}: a {kind} step has no undo, found {step.undo!r} [rule: undo-on-{kind}]"
        if kind is StepKind.PIVOT and past_pivot:
            yield (
                f"{where}: a workflow has at most one pivot, before any retriable step "
                "[rule: one-pivot]"
            )
        if step.undo is not None and step.undo == step.name:
            yield f"{where}: the undo must be another operation [rule: undo-is-do]"
        for source in step.inputs:
            earlier, _, name = source.partition(".")
            if earlier not in results:
                yield (
                    f"{where}: input {source!r} names {earlier!r}, which is not an earlier step "
                    "[rule: input-from-later-step]"
                )
            elif name not in results[earlier]:
                yield (
                    f"{where}: input {source!r}: step {earlier} declares no result {name!r} "
                    "[rule: unknown-result]"
                )
        results[step.name] = set(step.results)
        past_pivot = past_pivot or kind is not StepKind.COMPENSATABLE


ORDER_TIMES = frozenset({"notBefore"})
"""Order fields a timer may wait for."""


def _wait_problems(step: StepModel, kind: StepKind, past_pivot: bool) -> Iterator[str]:
    if step.agent is not None:
        yield f"a {kind} step has no agent, found {step.agent!r} [rule: agent-on-wait]"
    if step.undo is not None:
        yield f"a {kind} step has nothing to undo, found {step.undo!r} [rule: undo-on-wait]"
    if kind is StepKind.EVENT:
        if step.event is None:
            yield "an event step names its event [rule: missing-event]"
        if step.until is not None or step.wait_seconds is not None:
            yield "an event step waits for its event, not a time [rule: time-on-event]"
    else:
        if step.event is not None or step.approval:
            yield "a timer step waits for a time, not an event [rule: event-on-timer]"
        if step.until is None and step.wait_seconds is None:
            yield "a timer step needs `until` or `waitSeconds` [rule: missing-time]"
        if step.until is not None and step.until not in ORDER_TIMES:
            known = ", ".join(sorted(ORDER_TIMES))
            yield f"until {step.until!r} is not an order time ({known}) [rule: unknown-order-field]"
    policy = step.on_deadline
    if policy is not None and policy not in {p.value for p in OnDeadline}:
        allowed = ", ".join(p.value for p in OnDeadline)
        yield f"onDeadline {policy!r} is not one of {allowed} [rule: on-deadline]"
    if policy == OnDeadline.COMPENSATE and past_pivot:
        yield (
            "onDeadline compensate cannot follow the pivot, whose effect stays "
            "[rule: compensate-after-pivot]"
        )
    if (step.final_deadline_seconds is not None) != (policy == OnDeadline.ALERT):
        yield (
            "finalDeadlineSeconds goes with onDeadline alert, and only with it "
            "[rule: final-deadline]"
        )
    elif (
        step.final_deadline_seconds is not None
        and step.timeout_seconds is not None
        and step.final_deadline_seconds <= step.timeout_seconds
    ):
        yield "finalDeadlineSeconds must be longer than timeoutSeconds [rule: final-deadline]"


def _build(model: CatalogueModel) -> Catalogue:
    agents = {
        a.name: AgentSpec(
            name=a.name,
            service_url_setting=a.service_url_setting,
            local_service_url=a.local_service_url,
            capacity=a.capacity,
            outcome_queries=a.outcome_queries,
            abandon=a.abandon,
            alternatives=tuple(a.alternatives),
            retry_elsewhere=a.retry_elsewhere,
            retry=AgentRetry(
                a.retry.initial_backoff_seconds,
                a.retry.max_backoff_seconds,
                a.retry.call_timeout_seconds,
            ),
            limits=AgentLimits(a.max_concurrent, a.calls_per_second),
        )
        for a in model.agents
    }
    workflows = tuple(
        Workflow(
            name=w.name,
            version=w.version,
            steps=tuple(
                StepDefinition(
                    name=s.name,
                    agent=s.agent or "",
                    compensation=s.undo,
                    timeout_seconds=s.timeout_seconds,
                    alternatives=agents[s.agent].alternatives if s.agent else (),
                    retry_elsewhere=agents[s.agent].retry_elsewhere if s.agent else False,
                    kind=StepKind(s.kind),
                    inputs=tuple(s.inputs),
                    results=tuple(s.results),
                    event=s.event,
                    approval=s.approval,
                    on_deadline=OnDeadline(s.on_deadline or OnDeadline.HOLD),
                    final_deadline_seconds=s.final_deadline_seconds,
                    until=s.until,
                    wait_seconds=s.wait_seconds,
                )
                for s in w.steps
            ),
        )
        for w in model.workflows
    )
    default = next(w.name for w in model.workflows if w.default)
    return Catalogue(agents=agents, workflows=workflows, default=default)
