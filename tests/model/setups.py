"""The situations the explorer runs one order in, generated from catalogue.json.

The model is only as good as what it holds: the first explorer ran one workflow of
three compensatable steps with `ExhaustedPolicy=hold` and found nothing, while the
features added since met at seams it never modelled (issue #37). So nothing here is
written by hand that the catalogue already says: every shipped workflow (and with it
every step kind it uses: compensatable, pivot, retriable, event, approval, timer) is
run under both ExhaustedPolicy values, with the agents as declared, and then again with
the variants a deployment may have that the shipped file does not show:

- `no-abandon`: the first alternative-holding agent's service has no abandon route, so
  "not applied" is made final only by time, and a request may still apply after its
  live time (the residual risk of docs/in-doubt.md);
- `shared-keys`: that agent and its alternative share one idempotency-key space (two
  regions of one provider, `retryElsewhere`), so a retry may move between them.

A test that finds a step kind or a workflow the setups miss fails
(tests/model/test_exploration.py), so a new kind cannot be added unmodelled.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta

from shared.domain.machine.transition import ProcessPolicy
from shared.domain.model import ExhaustedPolicy
from shared.domain.workflow import AgentSpec, StepKind, Workflow
from tests.workflows import AGENTS, CATALOGUE

STEP_TIMEOUT = 30
PENDING_TIMEOUT = 60
SKEW = 5
"""The clock-skew margin: a request sent with complete-by C can apply up to C + SKEW."""
MAX_FAILURES = 2


@dataclass(frozen=True)
class Setup:
    """One order's world: its workflow, the policy it runs under and its services."""

    name: str
    workflow: Workflow
    policy: ProcessPolicy
    agents: Mapping[str, AgentSpec]
    spaces: Mapping[str, str]
    """Each agent's idempotency-key space: agents sharing one are one ledger."""

    def space(self, agent: str) -> str:
        return self.spaces.get(agent, agent)

    def abandons(self, agent: str) -> bool:
        spec = self.agents.get(agent)
        return spec is None or spec.abandon

    @property
    def kinds(self) -> frozenset[StepKind]:
        return frozenset(s.kind for s in self.workflow.steps)


def policy(exhausted: ExhaustedPolicy) -> ProcessPolicy:
    return ProcessPolicy(
        step_timeout=timedelta(seconds=STEP_TIMEOUT),
        pending_timeout=timedelta(seconds=PENDING_TIMEOUT),
        max_failure_count=MAX_FAILURES,
        exhausted_policy=exhausted,
        clock_skew=timedelta(seconds=SKEW),
        step_max=timedelta(seconds=STEP_TIMEOUT * 2),
    )


def _moving_agent(workflow: Workflow) -> str | None:
    """The agent of the workflow's first step that has an alternative: where abandon and
    a shared key space matter (a retry may move)."""
    for step in workflow.steps:
        if step.alternatives:
            return step.agent
    return None


def _moving_retriable(
    workflow: Workflow, agents: dict[str, AgentSpec]
) -> tuple[Workflow, str | None]:
    """The workflow with its first retriable step given an alternative, `{agent}-backup`,
    and that step's agent without abandon: a do held on a refusal for good is moved to
    a fresh key (shared/domain/machine/rekey.py), and only where a step may go to another
    provider can the earlier key have been sent elsewhere first, settled not applied by
    time there, and apply late (docs/in-doubt.md, "An earlier round that applies late").
    A catalogue may declare this (an agent's `alternatives`); the shipped one does not."""
    for index, step in enumerate(workflow.steps):
        if step.kind is not StepKind.RETRIABLE or not step.agent or step.alternatives:
            continue
        backup = f"{step.agent}-backup"
        agents[step.agent] = dataclasses.replace(agents[step.agent], abandon=False)
        agents[backup] = dataclasses.replace(agents[step.agent], name=backup, abandon=True)
        moved = dataclasses.replace(step, alternatives=(backup,))
        steps = (*workflow.steps[:index], moved, *workflow.steps[index + 1 :])
        return dataclasses.replace(workflow, steps=steps), step.agent
    return workflow, None


def build(
    workflow: Workflow,
    exhausted: ExhaustedPolicy,
    *,
    no_abandon: bool = False,
    shared_keys: bool = False,
    retriable_moves: bool = False,
) -> Setup:
    agents = dict(AGENTS)
    spaces: dict[str, str] = {}
    tags = [workflow.name, exhausted.value]
    if retriable_moves:
        workflow, moved = _moving_retriable(workflow, agents)
        assert moved is not None, f"{workflow.name} has no retriable step to move"
        tags.append("retriable-moves")
    moving = _moving_agent(workflow)
    if moving is not None and no_abandon and not retriable_moves:
        agents[moving] = dataclasses.replace(agents[moving], abandon=False)
        tags.append("no-abandon")
    if moving is not None and shared_keys and not retriable_moves:
        steps = tuple(
            dataclasses.replace(s, retry_elsewhere=True) if s.agent == moving else s
            for s in workflow.steps
        )
        workflow = dataclasses.replace(workflow, steps=steps)
        for step in steps:
            if step.agent == moving:
                spaces.update({a: moving for a in step.candidates})
        tags.append("shared-keys")
    return Setup("/".join(tags), workflow, policy(exhausted), agents, spaces)


def all_setups() -> dict[str, Setup]:
    """Every shipped workflow under both policies, as shipped, and the variants."""
    found: dict[str, Setup] = {}
    for workflow in CATALOGUE.latest():
        for exhausted in ExhaustedPolicy:
            for no_abandon, shared in ((False, False), (True, False), (False, True)):
                if (no_abandon or shared) and _moving_agent(workflow) is None:
                    continue
                setup = build(workflow, exhausted, no_abandon=no_abandon, shared_keys=shared)
                found[setup.name] = setup
    return found


SETUPS = all_setups()
DEFAULT = build(CATALOGUE.get("order-fulfilment") or CATALOGUE.latest()[0], ExhaustedPolicy.HOLD)
RETRIABLE_MOVES = build(
    CATALOGUE.get("express-delivery") or CATALOGUE.latest()[0],
    ExhaustedPolicy.HOLD,
    retriable_moves=True,
)
"""express-delivery with `notify-customer` able to move to `notifications-backup`, and
`notifications` without abandon: an earlier round of a key moved after a refusal for
good may apply late (tests/model/starts.py `BACKUP_DUE`)."""
