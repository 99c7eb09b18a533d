"""Outcome queries: the Supervisor asks a remote service what it did with an in-doubt key.

Where the query runs: in the Supervisor's sweep, for an order whose running step's
complete-by (plus SETTLE_MARGIN) has passed, and nowhere else. The sweep already reads
only the due watch entries, so the queries follow what is due; an order that is not in
doubt is never asked about and gets no added latency. Asked in the Scheduler's next
dispatch instead, the answer would come after a nudge round trip and a claim that may
need undoing; sent as a message to the agent, it would cost two more messages and a
reply lane. Cost per in-doubt step: one GET to the service that holds the key (a few
more only on transient errors, within QUERY_TIMEOUT_SECONDS), and nothing else: the
check's one load and one conditional save are what a recovery costs without it. A
sweep's checks, queries included, run concurrently under the sweep's bound (16).

A query goes through the agent's own circuit breaker with the agents' retry and
deadline rules (shared/resilience.py): the breaker's question is whether the service is
reachable, one answer per service per instance. A query that fails the way a call fails
(unreachable, 5xx) is the same evidence and counts the same; one cut by its own short
deadline does not count, like a call cut by the step's complete-by. While the breaker is
open nothing is sent and the answer is "no answer": the retry stays where the key lives.

`abandon` goes the same way, for the same reasons: it is the one question that settles a
key for good ("not applied" is otherwise final only once no request sent with the key
can still apply), so a failure to ask must read as "no answer", never as settled.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from datetime import timedelta

from shared.domain.health import BreakerState
from shared.domain.in_doubt import RemoteOutcome
from shared.ports import Clock, RemoteService
from shared.resilience import CircuitBreaker, DeadlinePassed, RetryPolicy, call_until_deadline
from shared.telemetry.logsafe import app_logger

log = app_logger("orders.supervisor")

QUERY_TIMEOUT_SECONDS = 2.0
"""All of one query's tries: well inside a sweep check's 5 s, which also loads and saves."""

QUERY_RETRY = RetryPolicy(initial_backoff=0.1, max_backoff=0.5, call_timeout=QUERY_TIMEOUT_SECONDS)


@dataclass(frozen=True)
class Asked:
    """One agent's remote service and the breaker its calls go through."""

    remote: RemoteService
    breaker: CircuitBreaker


@dataclass(frozen=True)
class OutcomeQueries:
    services: Mapping[str, Asked]
    """By agent name."""
    clock: Clock
    timeout: float = QUERY_TIMEOUT_SECONDS
    retry: RetryPolicy = field(default=QUERY_RETRY)

    async def ask(self, agent: str, key: str) -> RemoteOutcome:
        """Never raises: every failure is "no answer", which keeps today's rule."""
        return await self._through_breaker(agent, key, "outcome query", _outcome)

    async def abandon(self, agent: str, key: str) -> RemoteOutcome:
        """Settle `key` at the agent's service for good. Never raises, like `ask`: a
        failure is "no answer" and the key stays unsettled."""
        return await self._through_breaker(agent, key, "abandon", _abandon)

    async def _through_breaker(
        self, agent: str, key: str, what: str, question: _Question
    ) -> RemoteOutcome:
        asked = self.services.get(agent)
        if asked is None:
            return RemoteOutcome.unknown(f"no remote service for {agent}")
        if asked.breaker.state is BreakerState.OPEN:
            return RemoteOutcome.unknown("circuit open")
        remote = asked.remote

        async def query(timeout: float) -> RemoteOutcome:
            return await question(remote, key, timeout)

        try:
            return await call_until_deadline(
                query,
                deadline=self.clock.now() + timedelta(seconds=self.timeout),
                clock=self.clock,
                breaker=asked.breaker,
                policy=self.retry,
            )
        except DeadlinePassed:
            return RemoteOutcome.unknown(f"no answer within {self.timeout:g} s")
        except Exception as exc:  # a query must never fail the check it serves
            log.warning("%s %s at %s failed: %s: %s", what, key, agent, type(exc), exc)
            return RemoteOutcome.unknown(type(exc).__name__)


_Question = Callable[[RemoteService, str, float], Awaitable[RemoteOutcome]]


async def _outcome(remote: RemoteService, key: str, timeout: float) -> RemoteOutcome:
    return await remote.outcome(key, timeout)


async def _abandon(remote: RemoteService, key: str, timeout: float) -> RemoteOutcome:
    return await remote.abandon(key, timeout)
