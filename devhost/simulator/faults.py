"""Fault settings per service and the per-call fault decision.

Decisions come from a random generator derived from (seed, service, key, call number)
rather than one shared stream, so a given call of a given key gets the same fault no
matter how other traffic interleaves: tests and demos replay exactly with ``--seed``.
Outcome queries (``GET /{service}/operations/{key}``) get their own stream per
(seed, service, key, query number), so asking never shifts the faults of the calls.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from enum import Enum

from pydantic import BaseModel, ConfigDict, Field

DEFAULT_HANG_SECONDS = 600.0


class FaultSettings(BaseModel):
    """One service's fault knobs, as accepted by ``PUT /_sim/faults/{service}``.

    Strict and closed (no coercion, no unknown fields) so a typo in a chaos script is a
    400 instead of a silently ignored setting.
    """

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    transient_error_rate: float = Field(
        default=0.0, alias="transientErrorRate", ge=0.0, le=1.0, allow_inf_nan=False
    )
    hang_rate: float = Field(default=0.0, alias="hangRate", ge=0.0, le=1.0, allow_inf_nan=False)
    latency_ms: int = Field(default=0, alias="latencyMs", ge=0)
    latency_jitter_ms: int = Field(default=0, alias="latencyJitterMs", ge=0)
    hang_seconds: float = Field(
        default=DEFAULT_HANG_SECONDS, alias="hangSeconds", ge=0.0, allow_inf_nan=False
    )
    permanent_failure_skus: list[str] = Field(default_factory=list, alias="permanentFailureSkus")
    permanent_failure_operations: list[str] = Field(
        default_factory=list, alias="permanentFailureOperations"
    )
    """Operations of this service that fail permanently (``422`` with code ``rejected``)
    for every order and apply nothing; names the service does not have are a 400 (the
    control API checks them against the service)."""
    slow_ms: int = Field(default=0, alias="slowMs", ge=0)
    """Work time of every operation: the call answers after it, unlike a hang, which
    never does. Operations only: the service's read API and health probe stay fast."""
    apply_then_hang_rate: float = Field(
        default=0.0, alias="applyThenHangRate", ge=0.0, le=1.0, allow_inf_nan=False
    )
    """Share of operations that settle (apply) and then hang for ``hangSeconds``: the
    reply is lost although the effect happened, the case outcome queries exist for."""
    rate_limit_per_second: int | None = Field(default=None, alias="rateLimitPerSecond", ge=1)
    """Operation calls let in per second (any one-second window); past it ``429`` with
    ``Retry-After: 1`` before anything is looked at. None: no quota (see limits.py)."""
    max_concurrent: int | None = Field(default=None, alias="maxConcurrent", ge=1)
    """Operation calls running at once; past it ``429`` with ``Retry-After: 1``."""
    late_rate: float = Field(default=0.0, alias="lateRate", ge=0.0, le=1.0, allow_inf_nan=False)
    """Share of operation calls held on the network for ``lateSeconds`` before the service
    sees them: until then the key is never seen (an outcome query answers ``404``), and
    the call goes on when it arrives even if its caller left, so it may apply after the
    caller's deadline and after the caller settled the key as not applied: the residual
    risk of a provider without ``abandon`` (docs/in-doubt.md)."""
    late_seconds: float = Field(default=0.0, alias="lateSeconds", ge=0.0, allow_inf_nan=False)
    abandon_supported: bool = Field(default=True, alias="abandonSupported")
    """False: ``POST /{service}/operations/{key}/abandon`` answers a plain 404, as a
    provider without the route does; callers can then only wait until a request can no
    longer apply."""

    def to_json(self) -> dict[str, object]:
        """Camel-case form, the same shape the control API accepts."""
        return self.model_dump(by_alias=True)


NO_FAULTS = FaultSettings()


class FaultBoard:
    """Current settings of every service; in memory because chaos is set per session."""

    def __init__(self, services: tuple[str, ...]) -> None:
        self._services = services
        self._settings: dict[str, FaultSettings] = dict.fromkeys(services, NO_FAULTS)

    def get(self, service: str) -> FaultSettings:
        return self._settings[service]

    def set(self, service: str, settings: FaultSettings) -> None:
        self._settings[service] = settings

    def reset(self) -> None:
        self._settings = dict.fromkeys(self._services, NO_FAULTS)

    def to_json(self) -> dict[str, dict[str, object]]:
        return {name: settings.to_json() for name, settings in self._settings.items()}


class TransientPhase(Enum):
    """Whether a transient error happens before the effect or after it (response lost)."""

    BEFORE_APPLY = "transient-before-apply"
    AFTER_APPLY = "transient-after-apply"


@dataclass(frozen=True)
class TransientFault:
    phase: TransientPhase
    status: int
    """503 mostly; 429 (with Retry-After) and 500 so clients exercise every retryable path."""


@dataclass(frozen=True)
class FaultDecision:
    delay_seconds: float
    hang_seconds: float | None
    """A hang before anything is applied."""
    transient: TransientFault | None
    slow_seconds: float = 0.0
    apply_then_hang_seconds: float | None = None
    """A hang after the effect settled; excludes the other two faults."""


@dataclass(frozen=True)
class QueryDecision:
    delay_seconds: float
    transient_status: int | None


def _transient_status(draw: float) -> int:
    if draw < 0.7:
        return 503
    if draw < 0.85:
        return 429
    return 500


def decide(
    settings: FaultSettings, seed: int, service: str, key: str, call_number: int
) -> FaultDecision:
    """Decide the faults of one call.

    Every call draws the same number of values whatever the settings, so changing one
    knob does not reshuffle the outcome of the others for the same seed. The
    apply-then-hang draw comes last, so runs seeded before it existed replay the same
    while its rate is 0. A hang wins over apply-then-hang, which wins over a transient
    error (its reply is lost anyway).
    """
    rng = random.Random(f"{seed}:{service}:{key}:{call_number}")
    hang_draw, transient_draw, phase_draw, status_draw, jitter_draw, apply_hang_draw = (
        rng.random() for _ in range(6)
    )
    jitter_ms = jitter_draw * settings.latency_jitter_ms
    hang_seconds = settings.hang_seconds if hang_draw < settings.hang_rate else None
    apply_then_hang_seconds = None
    if hang_seconds is None and apply_hang_draw < settings.apply_then_hang_rate:
        apply_then_hang_seconds = settings.hang_seconds
    transient: TransientFault | None = None
    if apply_then_hang_seconds is None and transient_draw < settings.transient_error_rate:
        phase = TransientPhase.BEFORE_APPLY if phase_draw < 0.5 else TransientPhase.AFTER_APPLY
        transient = TransientFault(phase=phase, status=_transient_status(status_draw))
    return FaultDecision(
        delay_seconds=(settings.latency_ms + jitter_ms) / 1000.0,
        hang_seconds=hang_seconds,
        transient=transient,
        slow_seconds=settings.slow_ms / 1000.0,
        apply_then_hang_seconds=apply_then_hang_seconds,
    )


def held_on_the_network(
    settings: FaultSettings, seed: int, service: str, key: str, sent_number: int
) -> float | None:
    """How long this call is held on the network before the service sees it, or None.

    A stream of its own per (seed, service, key, number of the call as sent), so runs
    seeded before the fault existed replay the same while its rate is 0. The number is
    counted as calls are sent, not as they arrive: a held call has not been registered.
    """
    if settings.late_rate <= 0 or settings.late_seconds <= 0:
        return None
    rng = random.Random(f"{seed}:{service}:{key}:late:{sent_number}")
    return settings.late_seconds if rng.random() < settings.late_rate else None


def decide_query(
    settings: FaultSettings, seed: int, service: str, key: str, query_number: int
) -> QueryDecision:
    """Decide the faults of one outcome query: latency and transient errors only.

    A provider whose operations hang still answers its read API, so hangs, slowness and
    permanent failures are for operations alone.
    """
    rng = random.Random(f"{seed}:{service}:{key}:query:{query_number}")
    transient_draw, status_draw, jitter_draw = (rng.random() for _ in range(3))
    jitter_ms = jitter_draw * settings.latency_jitter_ms
    status = None
    if transient_draw < settings.transient_error_rate:
        status = _transient_status(status_draw)
    return QueryDecision(
        delay_seconds=(settings.latency_ms + jitter_ms) / 1000.0, transient_status=status
    )
