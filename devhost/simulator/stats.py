"""Per-service counters of what the simulator injected, for dashboards and soak checks.

In memory only: they describe this process's run, unlike the ledger, which describes
the (simulated) outside world.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass


def _camel(name: str) -> str:
    first, *rest = name.split("_")
    return first + "".join(word.title() for word in rest)


@dataclass
class ServiceStats:
    calls: int = 0
    applied: int = 0
    transient_errors: int = 0
    transient_errors_after_apply: int = 0
    hangs: int = 0
    permanent_failures: int = 0
    idempotent_repeats: int = 0
    key_reuse_rejections: int = 0
    slow_calls: int = 0
    apply_then_hangs: int = 0
    queries: int = 0
    query_transient_errors: int = 0
    nothing_to_undo: int = 0
    """Compensations answered ``nothing-to-undo``: their do was not applied then."""
    in_progress_rejections: int = 0
    """Calls answered 409 ``operation-in-progress`` (their key, or an undo's do, running)."""
    abandoned_rejections: int = 0
    abandons: int = 0
    """Keys settled as abandoned by ``POST .../abandon``."""
    rate_limited: int = 0
    """Calls refused ``429`` past ``rateLimitPerSecond``."""
    concurrency_limited: int = 0
    """Calls refused ``429`` past ``maxConcurrent``."""
    late_arrivals: int = 0
    """Calls held on the network for ``lateSeconds`` before the service saw them."""
    late_applied: int = 0
    """Keys applied by a call that arrived late."""
    held_now: int = 0
    """Calls held on the network right now, not yet seen by the service (a gauge)."""
    max_calls_in_one_second: int = 0
    """The most operation calls that arrived in any one-second window, refused or not."""
    max_concurrent_seen: int = 0
    """The most operation calls running at once, counting each refused one as it came."""

    def note_load(self, calls_in_window: int, concurrent: int) -> None:
        self.max_calls_in_one_second = max(self.max_calls_in_one_second, calls_in_window)
        self.max_concurrent_seen = max(self.max_concurrent_seen, concurrent)

    def to_json(self) -> dict[str, int]:
        return {_camel(name): value for name, value in asdict(self).items()}


class StatsBoard:
    def __init__(self, services: tuple[str, ...]) -> None:
        self._services = services
        self._stats = {name: ServiceStats() for name in services}

    def __getitem__(self, service: str) -> ServiceStats:
        return self._stats[service]

    def reset(self) -> None:
        self._stats = {name: ServiceStats() for name in self._services}

    def to_json(self) -> dict[str, dict[str, int]]:
        return {name: stats.to_json() for name, stats in self._stats.items()}
