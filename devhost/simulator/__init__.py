"""Local stand-in for the inventory, payment and shipping services, with fault injection.

It lets the Scheduler-Agent-Supervisor pattern be watched healing locally: faults are
set at runtime through ``/_sim/faults`` and the effect ledger at ``/_sim/effects``
shows whether every effect happened exactly once.
"""

from devhost.simulator.app import create_app
from devhost.simulator.server import SimulatorServer

__all__ = ["SimulatorServer", "create_app"]
