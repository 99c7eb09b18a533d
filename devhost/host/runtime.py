"""``LocalHost``: every trigger of the app, running inside the caller's event loop.

Used by ``python -m devhost`` and directly by tests, which is why it takes already
loaded functions and an explicit settings mapping instead of reading files: a test
can build a throwaway ``FunctionApp`` and run it end to end in-process.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any

from devhost.host.guard import Keys, passes_principal
from devhost.host.http import HttpFrontend
from devhost.host.loader import (
    HTTP_TRIGGER,
    SERVICE_BUS_TRIGGER,
    TIMER_TRIGGER,
    FunctionSpec,
    HostConfig,
    functions_of,
)
from devhost.host.servicebus import QueueTrigger, Receivers
from devhost.host.timers import TimerRunner
from devhost.settings import resolve_binding

log = logging.getLogger("devhost.host")

SHUTDOWN_HOOK_TIMEOUT = 10.0


@dataclass(frozen=True)
class FunctionRow:
    """One banner line: what a developer needs to call or feed a function."""

    name: str
    trigger: str
    detail: str


def disabled_setting(name: str) -> tuple[str, ...]:
    """The app setting that turns a function off, as Azure spells it and as Linux
    environments carry it (a dot is not allowed in an environment variable there)."""
    return (f"AzureWebJobs.{name}.Disabled", f"AzureWebJobs_{name}_Disabled")


def enabled(functions: Sequence[FunctionSpec], settings: Mapping[str, str]) -> list[FunctionSpec]:
    """The functions whose ``AzureWebJobs.<name>.Disabled`` is not true: the host starts
    no listener for the others and routes no HTTP request to them (a 404). Running some
    functions on one instance and the rest on another is how Flex Consumption scales
    them (HTTP triggers together, every other function on instances of its own)."""
    kept: list[FunctionSpec] = []
    for spec in functions:
        value = next((settings[k] for k in disabled_setting(spec.name) if k in settings), "")
        if value.strip().lower() in {"true", "1"}:
            log.info("function %s is disabled by its app setting", spec.name)
        else:
            kept.append(spec)
    return kept


class LocalHost:
    """Runs HTTP, timer and Service Bus triggers for a set of indexed functions."""

    def __init__(
        self,
        functions: Sequence[FunctionSpec],
        settings: Mapping[str, str],
        *,
        config: HostConfig | None = None,
        host: str = "127.0.0.1",
        port: int = 7071,
        drain_timeout: float = 30.0,
        shutdown_hooks: Sequence[Callable[[], Awaitable[None]]] = (),
    ) -> None:
        self.functions = enabled(functions, settings)
        self.shutdown_hooks = list(shutdown_hooks)
        self.settings = dict(settings)
        self.config = config or HostConfig()
        self.drain_timeout = drain_timeout
        # Resolve %Setting% references up front so a typo fails at startup, not at 3 am.
        self.triggers: list[tuple[FunctionSpec, dict[str, Any]]] = [
            (spec, resolve_binding(spec.trigger, self.settings, where=f"function {spec.name}"))
            for spec in self.functions
        ]
        self._http = HttpFrontend(
            self.triggers,
            self.config,
            host=host,
            port=port,
            shutdown_timeout=drain_timeout,
            keys=Keys.from_settings(self.settings),
            pass_principal=passes_principal(self.settings),
        )
        self._pool = Receivers(self.settings, self.config)
        self.timers = [
            TimerRunner(spec, trigger)
            for spec, trigger in self.triggers
            if trigger["type"] == TIMER_TRIGGER
        ]
        self.queues = [
            QueueTrigger(spec, trigger, self._pool, self.settings, self.config)
            for spec, trigger in self.triggers
            if trigger["type"] == SERVICE_BUS_TRIGGER
        ]
        self._started = False

    @classmethod
    def from_app(cls, app: Any, settings: Mapping[str, str], **kwargs: Any) -> LocalHost:
        """Convenience for tests holding a ``FunctionApp`` rather than specs."""
        return cls(functions_of(app), settings, **kwargs)

    @property
    def http_url(self) -> str:
        """Base URL such as ``http://127.0.0.1:7071`` (the real port when 0 was asked)."""
        return self._http.url

    @property
    def api_url(self) -> str:
        prefix = self.config.route_prefix
        return f"{self.http_url}/{prefix}" if prefix else self.http_url

    async def start(self) -> None:
        await self._http.start()
        self._started = True
        for timer in self.timers:
            timer.start()
        for queue in self.queues:
            queue.start()
        log.debug(
            "host started: %d http, %d timer, %d service bus",
            len(self.functions) - len(self.timers) - len(self.queues),
            len(self.timers),
            len(self.queues),
        )

    async def listening(self, timeout: float = 60.0) -> None:
        """Wait until every Service Bus trigger has its link open. Tests call it after
        ``start`` so that the first message's complete-by does not pay for a dozen links
        opening at once; raises ``TimeoutError`` if the broker never answers."""
        waits = [queue.listening.wait() for queue in self.queues]
        await asyncio.wait_for(asyncio.gather(*waits), timeout)

    async def stop(self) -> None:
        """Stop intake everywhere, let running invocations finish, then close clients."""
        if not self._started:
            return
        self._started = False
        started = time.monotonic()
        await asyncio.gather(
            *(timer.stop() for timer in self.timers),
            *(queue.stop_receiving() for queue in self.queues),
        )
        log.debug("intake stopped after %.1f s", time.monotonic() - started)
        await asyncio.gather(self._http.stop(), self._drain())
        log.debug("invocations drained after %.1f s", time.monotonic() - started)
        await asyncio.gather(*(queue.close() for queue in self.queues))
        await self._pool.close()
        log.debug("Service Bus closed after %.1f s", time.monotonic() - started)
        for hook in self.shutdown_hooks:
            # The app's own clients (HTTP sessions, SDK clients) are closed on the loop
            # that created them, after the last invocation, like a worker shutting down.
            try:
                await asyncio.wait_for(hook(), SHUTDOWN_HOOK_TIMEOUT)
            except TimeoutError:
                log.warning(
                    "shutdown hook %r still running after %.0f s", hook, SHUTDOWN_HOOK_TIMEOUT
                )
            except Exception:
                log.exception("shutdown hook %r failed", hook)
        log.debug("host stopped after %.1f s", time.monotonic() - started)

    async def _drain(self) -> None:
        pending: list[asyncio.Task[None]] = [
            *(task for timer in self.timers for task in timer.in_flight()),
            *(task for queue in self.queues for task in queue.in_flight()),
        ]
        if not pending:
            return
        log.info(
            "waiting up to %.0f s for %d running invocation(s)", self.drain_timeout, len(pending)
        )
        _, still_running = await asyncio.wait(pending, timeout=self.drain_timeout)
        if still_running:
            log.warning("cancelling %d invocation(s) still running at shutdown", len(still_running))
            for task in still_running:
                task.cancel()
            await asyncio.gather(*still_running, return_exceptions=True)

    async def __aenter__(self) -> LocalHost:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()

    def rows(self) -> list[FunctionRow]:
        """Describe each function from its resolved trigger binding."""
        rows: list[FunctionRow] = []
        for spec, trigger in self.triggers:
            kind = str(trigger["type"])
            if kind == HTTP_TRIGGER:
                methods = ",".join(trigger.get("methods") or ["*"])
                route = trigger.get("route") or spec.name
                detail = f"{methods} {self.api_url}/{route}  [{trigger.get('authLevel', '?')}]"
                rows.append(FunctionRow(spec.name, "http", detail))
            elif kind == TIMER_TRIGGER:
                detail = str(trigger.get("schedule"))
                if trigger.get("runOnStartup"):
                    detail += " (runOnStartup)"
                rows.append(FunctionRow(spec.name, "timer", detail))
            elif kind == SERVICE_BUS_TRIGGER:
                detail = f"queue {trigger.get('queueName')} via {trigger.get('connection')}"
                rows.append(FunctionRow(spec.name, "serviceBus", detail))
            else:
                rows.append(FunctionRow(spec.name, kind, "not run locally"))
        return rows
