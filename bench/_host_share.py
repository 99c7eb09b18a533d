"""The runtime's CPU split into the host's share and the app's.

The host's share is the thread that receives, settles and renews locks
(`devhost/host/sb_proton.py`, named `devhost-amqp`): in Azure that work is the Functions
host's, a separate process. The rest of the runtime (handlers, the app's sends and table
requests, the HTTP front door, the trigger glue) is the app's share, the figure that
carries over to Azure. With the SDK's receiver (`DevhostServiceBusReceiver=sdk`) there is
no such thread and the host's share reads 0.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import psutil

HOST_THREAD = "devhost-amqp"


def thread_cpu(pid: int, name: str = HOST_THREAD) -> float:
    """User + system CPU seconds of the process's threads with that OS name."""
    total = 0.0
    try:
        threads = psutil.Process(pid).threads()
    except psutil.Error:
        return 0.0
    for thread in threads:
        try:
            comm = Path(f"/proc/{pid}/task/{thread.id}/comm").read_text().strip()
        except OSError:
            continue
        if comm == name:
            total += thread.user_time + thread.system_time
    return total


@dataclass
class HostShare:
    """Host-thread CPU over a window, per runtime process."""

    pids: dict[str, int]
    start: dict[str, float] | None = None
    used: dict[str, float] | None = None

    def begin(self) -> None:
        self.start = {name: thread_cpu(pid) for name, pid in self.pids.items()}

    def end(self) -> None:
        start = self.start or {}
        self.used = {
            name: thread_cpu(pid) - start.get(name, 0.0) for name, pid in self.pids.items()
        }

    def seconds(self) -> float:
        return sum((self.used or {}).values())


def split_line(runtime_seconds: float, host_seconds: float, orders: int) -> str:
    """Runtime CPU per order, and the host's and the app's shares of it."""
    n = max(orders, 1)
    app = max(runtime_seconds - host_seconds, 0.0)
    return (
        f"runtime CPU per order {1000 * runtime_seconds / n:.1f} ms = "
        f"host (AMQP thread: receive, settle, renew) {1000 * host_seconds / n:.1f} ms + "
        f"app (handlers, sends, table requests, HTTP front, trigger glue) "
        f"{1000 * app / n:.1f} ms"
    )
