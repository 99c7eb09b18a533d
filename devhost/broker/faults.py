"""Fault injection on sends: duplicate, drop, delay.

Tests of at-least-once consumers need a broker that misbehaves on purpose and reproducibly, so
every decision comes from a seeded RNG that is re-seeded whenever the configuration changes.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

_RATE_FIELDS = {
    "duplicateRate": "duplicate_rate",
    "dropRate": "drop_rate",
    "delayRate": "delay_rate",
}
_KNOWN_FIELDS = {*_RATE_FIELDS, "delayMs", "queues", "seed"}
MAX_DELAY_MS = 24 * 3600 * 1000


class FaultConfigError(ValueError):
    """The fault configuration is invalid; ``problems`` lists every reason."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("; ".join(problems))
        self.problems = problems


@dataclass(frozen=True, slots=True)
class FaultConfig:
    """Rates are probabilities per sent message; ``queues`` None means every queue."""

    duplicate_rate: float = 0.0
    drop_rate: float = 0.0
    delay_rate: float = 0.0
    delay_ms: int = 0
    queues: frozenset[str] | None = None
    seed: int = 0

    @property
    def active(self) -> bool:
        return bool(self.duplicate_rate or self.drop_rate or (self.delay_rate and self.delay_ms))

    def applies_to(self, queue: str) -> bool:
        return self.queues is None or queue in self.queues

    @classmethod
    def from_json(cls, body: Any, known_queues: frozenset[str] | None = None) -> FaultConfig:
        """Validate the control API's camelCase shape, collecting every problem at once."""
        if not isinstance(body, Mapping):
            raise FaultConfigError(["body must be a JSON object"])
        problems = [f"unknown field {key!r}" for key in body if key not in _KNOWN_FIELDS]
        rates: dict[str, float] = {}
        for key, attr in _RATE_FIELDS.items():
            value = body.get(key, 0)
            if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= 1:
                problems.append(f"{key} must be a number between 0 and 1")
            else:
                rates[attr] = float(value)
        delay_ms = body.get("delayMs", 0)
        if isinstance(delay_ms, bool) or not isinstance(delay_ms, int) or delay_ms < 0:
            problems.append("delayMs must be a non-negative integer")
            delay_ms = 0
        elif delay_ms > MAX_DELAY_MS:
            problems.append(f"delayMs must be at most {MAX_DELAY_MS}")
        seed = body.get("seed", 0)
        if isinstance(seed, bool) or not isinstance(seed, int):
            problems.append("seed must be an integer")
            seed = 0
        queues = body.get("queues")
        queue_set: frozenset[str] | None = None
        if queues is not None:
            if not isinstance(queues, list) or not all(isinstance(q, str) for q in queues):
                problems.append("queues must be a list of queue names")
            else:
                queue_set = frozenset(queues)
                if known_queues is not None:
                    problems.extend(
                        f"unknown queue {q!r}" for q in sorted(queue_set - known_queues)
                    )
        if problems:
            raise FaultConfigError(problems)
        return cls(delay_ms=delay_ms, queues=queue_set, seed=seed, **rates)

    def to_json(self) -> dict[str, Any]:
        return {
            "duplicateRate": self.duplicate_rate,
            "dropRate": self.drop_rate,
            "delayRate": self.delay_rate,
            "delayMs": self.delay_ms,
            "queues": None if self.queues is None else sorted(self.queues),
            "seed": self.seed,
        }


@dataclass(frozen=True, slots=True)
class FaultDecision:
    drop: bool = False
    duplicate: bool = False
    delay_ms: int = 0


NO_FAULT = FaultDecision()


class FaultInjector:
    """Draws fault decisions; not thread-safe, the engine calls it under its lock."""

    def __init__(self, config: FaultConfig | None = None) -> None:
        self._config = FaultConfig()
        self._rng = random.Random(0)
        self.configure(config or FaultConfig())

    @property
    def config(self) -> FaultConfig:
        return self._config

    def configure(self, config: FaultConfig) -> None:
        self._config = config
        self._rng = random.Random(config.seed)

    def decide(self, queue: str) -> FaultDecision:
        config = self._config
        if not config.active or not config.applies_to(queue):
            return NO_FAULT
        # Always draw three numbers so one rate does not shift the sequence of the others.
        drop_roll, duplicate_roll, delay_roll = (self._rng.random() for _ in range(3))
        if drop_roll < config.drop_rate:
            return FaultDecision(drop=True)
        return FaultDecision(
            duplicate=duplicate_roll < config.duplicate_rate,
            delay_ms=config.delay_ms if delay_roll < config.delay_rate else 0,
        )
