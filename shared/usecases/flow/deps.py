"""What every process use case needs: the ports, the policy, and where to route steps."""

from __future__ import annotations

from dataclasses import dataclass, field

from shared.catalogue.running import pinned_workflow, workflow_of
from shared.domain.machine.transition import ProcessPolicy
from shared.domain.model import OrderProcess
from shared.domain.routing import PRIMARY_ONLY, Routing
from shared.domain.workflow import Catalogue, Workflow
from shared.ports import Clock, MessageBus, StateStore
from shared.usecases.flow.intake_load import IntakeLoad
from shared.usecases.flow.process_cache import ProcessCache
from shared.usecases.flow.routing import RoutingSource
from shared.usecases.flow.unit_of_work import UnitOfWork
from shared.usecases.limits.customers import Customers


@dataclass(frozen=True)
class ProcessDeps:
    store: StateStore
    bus: MessageBus
    clock: Clock
    policy: ProcessPolicy
    instance_id: str = "local"
    routing: RoutingSource | None = None
    """Agent health to route steps on; None: every step goes to its primary agent."""
    cache: ProcessCache | None = None
    """The orders this instance last wrote, for the Scheduler to skip a read; None: read."""
    customers: Customers | None = None
    """The intake quota and fair share per customer; None: neither is set."""
    catalogue: Catalogue = field(kw_only=True)
    """The workflows this instance runs, handed in by the composition root (a test
    passes its own)."""
    intake_load: IntakeLoad = field(default_factory=IntakeLoad)
    """Submissions this instance is storing at once: past a burst, none is claimed."""
    claim_at_intake: bool = True
    """Whether the intake stores a new order already claimed by this instance, its first
    step dispatched in the same insert (shared/usecases/flow/submission.py), as the
    composed app does. False leaves the first claim to the Scheduler's nudge, as past a
    burst (shared/usecases/flow/intake_load.py): only a test about that claim asks."""

    @property
    def work(self) -> UnitOfWork:
        return UnitOfWork(self.store, self.bus, self.customers, catalogue=self.catalogue)

    async def current_routing(self) -> Routing:
        return await self.routing.current() if self.routing is not None else PRIMARY_ONLY

    def workflow(self, process: OrderProcess) -> Workflow:
        """Raises UnknownWorkflow when the catalogue lost the order's version; the
        message handlers use `find_workflow` and hold such an order instead."""
        return pinned_workflow(self.catalogue, process.state)

    def find_workflow(self, process: OrderProcess) -> Workflow | None:
        """The order's pinned workflow, or None when the catalogue no longer keeps it."""
        return workflow_of(self.catalogue, process.state)
