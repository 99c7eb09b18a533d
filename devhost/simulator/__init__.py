"""Local stand-in for the remote services, one per catalogue agent, with fault injection.

It lets the Scheduler-Agent-Supervisor pattern be watched healing locally: faults are
set at runtime through ``/_sim/faults`` (transient errors, hangs, apply-then-hang, slow
calls, latency, permanent failures by SKU or by operation) and the effect ledger at
``/_sim/effects`` shows whether every effect happened exactly once.
``GET /{service}/operations/{key}`` answers whether a key's effect is applied, so an
in-doubt step can be resolved by asking.
Reference: docs/simulator.md.
"""

from devhost.simulator.app import create_app
from devhost.simulator.server import SimulatorServer

__all__ = ["SimulatorServer", "create_app"]
