"""``python -m devhost --instances N``: more runtime processes beside the first one.

One runtime process runs every function on one core; Flex Consumption runs several
instances that compete for the same queues and share the table. The extra processes
here do the same: each a ``python -m devhost --no-services`` with the settings the first
one applied, its own instance id (the Scheduler's ``LockedBy``) and HTTP port, its log in
the state directory. The first process owns the services and stops the extras first.
HTTP is not balanced between them (a client picks a port, as it would an instance).
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from devhost.harness.ports import LOOPBACK, free_port
from devhost.harness.process import Child
from devhost.harness.services import runtime_command
from shared.contract import Setting

STOP_SECONDS = 10.0


@dataclass(frozen=True)
class Instance:
    child: Child
    port: int

    @property
    def url(self) -> str:
        return f"http://{LOOPBACK}:{self.port}"


def extra_instances(
    count: int, *, state_dir: Path, root: Path, environ: Mapping[str, str] = os.environ
) -> list[Instance]:
    """Instances 2..`count` (not started), each on a free HTTP port (the ports after the
    first one's are the simulator's), with an instance id of their own when the settings
    name one (else each process makes up its own)."""
    base = environ.get(Setting.INSTANCE_ID)
    made = []
    for n in range(2, count + 1):
        port = free_port()
        command = runtime_command(
            port=port, state_dir=state_dir, extra=("--root", str(root)), python=sys.executable
        )
        env = {Setting.INSTANCE_ID: f"{base}-{n}"} if base else {}
        log = state_dir / f"instance-{n}.log"
        made.append(Instance(Child(f"instance {n}", command, log, env=env, cwd=root), port))
    return made


def stop_all(instances: list[Instance]) -> None:
    """All asked at once, so each drains while the others do."""
    for instance in instances:
        if instance.child.alive():
            instance.child.signal(signal.SIGTERM)
    for instance in instances:
        instance.child.stop(STOP_SECONDS)
