"""Workflows are data: an ordered table of steps, each with its agent, timeout and undo."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from shared.contract import Queue, Setting, high_priority


class AgentName(StrEnum):
    INVENTORY = "inventory"
    PAYMENT = "payment"
    SHIPPING = "shipping"
    PAYMENT_SECONDARY = "payment-secondary"


@dataclass(frozen=True)
class AgentSpec:
    """Where an Agent listens and which setting names its remote service."""

    name: AgentName
    queue: str
    service_url_setting: str

    @property
    def high_priority_queue(self) -> str:
        return high_priority(self.queue)

    def queue_for(self, high: bool) -> str:
        return self.high_priority_queue if high else self.queue


AGENTS: dict[AgentName, AgentSpec] = {
    AgentName.INVENTORY: AgentSpec(
        AgentName.INVENTORY, Queue.AGENT_INVENTORY, Setting.INVENTORY_SERVICE_URL
    ),
    AgentName.PAYMENT: AgentSpec(
        AgentName.PAYMENT, Queue.AGENT_PAYMENT, Setting.PAYMENT_SERVICE_URL
    ),
    AgentName.SHIPPING: AgentSpec(
        AgentName.SHIPPING, Queue.AGENT_SHIPPING, Setting.SHIPPING_SERVICE_URL
    ),
    AgentName.PAYMENT_SECONDARY: AgentSpec(
        AgentName.PAYMENT_SECONDARY,
        Queue.AGENT_PAYMENT_SECONDARY,
        Setting.PAYMENT_SECONDARY_SERVICE_URL,
    ),
}


@dataclass(frozen=True)
class StepDefinition:
    name: str
    """Also the remote operation the agent performs."""
    agent: AgentName
    compensation: str | None
    timeout_seconds: float | None = None
    """None: the app setting StepTimeoutSeconds."""
    alternatives: tuple[AgentName, ...] = ()
    """Agents that can do this step when `agent` is unhealthy or full, in preference order.
    Their remote services must honour the same idempotency key and compensation."""
    retry_elsewhere: bool = False
    """May the Supervisor's retry of a timed-out attempt go to another agent? Only when the
    candidates share one idempotency-key space (say, two regions of one provider): after
    a timeout the first agent's effect is unknown, and a second provider would apply it
    again. Otherwise the retry stays with the agent that has the key; only new
    dispatches move."""

    @property
    def candidates(self) -> tuple[AgentName, ...]:
        return (self.agent, *self.alternatives)


@dataclass(frozen=True)
class Workflow:
    name: str
    steps: tuple[StepDefinition, ...]

    def index_of(self, step: str) -> int | None:
        for i, definition in enumerate(self.steps):
            if definition.name == step:
                return i
        return None

    def operation(self, step: str, compensate: bool) -> str | None:
        """The remote operation behind a step's do or undo; None when there is none."""
        index = self.index_of(step)
        if index is None:
            return None
        definition = self.steps[index]
        return definition.compensation if compensate else definition.name


#            step                 agent                  compensation
ORDER_FULFILMENT = Workflow(
    name="order-fulfilment",
    steps=(
        StepDefinition("reserve-inventory", AgentName.INVENTORY, "release-inventory"),
        StepDefinition(
            "charge-payment",
            AgentName.PAYMENT,
            "refund-payment",
            alternatives=(AgentName.PAYMENT_SECONDARY,),
        ),
        StepDefinition("create-shipment", AgentName.SHIPPING, "cancel-shipment"),
    ),
)

WORKFLOWS: dict[str, Workflow] = {ORDER_FULFILMENT.name: ORDER_FULFILMENT}
