"""Running the simulator: a shared site starter and a background-thread server.

The thread owns its own event loop so synchronous tests and the local runtime can use
the simulator without sharing (or blocking) their loop.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType

from aiohttp import web

from devhost.loopback import guard_app
from devhost.malformed import ProblemAppRunner, RateLimitedLog
from devhost.simulator.app import create_app
from devhost.simulator.services import Service
from shared.domain.workflow import Catalogue

SHUTDOWN_TIMEOUT_SECONDS = 2.0
"""Grace for in-flight calls at stop; hung calls are woken anyway, so this stays short."""
STARTUP_TIMEOUT_SECONDS = 30.0


async def start_site(app: web.Application, host: str, port: int) -> tuple[web.AppRunner, int]:
    """Start serving ``app``; returns the runner (for cleanup) and the bound port.

    Handler cancellation ends hung calls as soon as the client goes away. Only loopback
    host names (and ``host``) are answered, and no write from another origin.
    """
    guard_app(app, host)
    runner = ProblemAppRunner(
        app,
        refusals=RateLimitedLog(logging.getLogger("devhost.simulator")),
        handler_cancellation=True,
        access_log=None,
        shutdown_timeout=SHUTDOWN_TIMEOUT_SECONDS,
    )
    await runner.setup()
    try:
        site = web.TCPSite(runner, host, port, backlog=1024)
        await site.start()
    except BaseException:
        await runner.cleanup()
        raise
    bound_port: int = runner.addresses[0][1]
    return runner, bound_port


class SimulatorServer:
    """The simulator on a background thread; ``port=0`` picks a free port."""

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        db_path: str | Path | None = None,
        seed: int | None = None,
        *,
        services: Mapping[str, Service] | None = None,
        catalogue: Catalogue | None = None,
    ) -> None:
        """``services`` or ``catalogue`` as for ``create_app`` (default: the app's)."""
        self.host = host
        self._services = services
        self._catalogue = catalogue
        self._requested_port = port
        self._bound_port: int | None = None
        self._db_path = db_path
        self._seed = seed
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopping: asyncio.Event | None = None

    @property
    def port(self) -> int:
        if self._bound_port is None:
            raise RuntimeError("simulator not started")
        return self._bound_port

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self) -> SimulatorServer:
        """Return once the server accepts connections; startup errors are raised here."""
        if self._thread is not None:
            raise RuntimeError("simulator already started")
        app = create_app(
            db_path=self._db_path,
            seed=self._seed,
            services=self._services,
            catalogue=self._catalogue,
        )
        ready: concurrent.futures.Future[int] = concurrent.futures.Future()
        self._thread = threading.Thread(
            target=self._run, args=(app, ready), name="simulator", daemon=True
        )
        self._thread.start()
        try:
            self._bound_port = ready.result(timeout=STARTUP_TIMEOUT_SECONDS)
        except BaseException:
            self._thread.join(timeout=STARTUP_TIMEOUT_SECONDS)
            self._thread = None
            raise
        return self

    def stop(self) -> None:
        """Stop and wait; wakes hung calls so this takes at most the shutdown timeout."""
        thread, loop, stopping = self._thread, self._loop, self._stopping
        if thread is None:
            return
        if loop is not None and stopping is not None and not loop.is_closed():
            loop.call_soon_threadsafe(stopping.set)
        thread.join(timeout=SHUTDOWN_TIMEOUT_SECONDS + 10)
        self._thread = None
        self._bound_port = None

    def __enter__(self) -> SimulatorServer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def _run(self, app: web.Application, ready: concurrent.futures.Future[int]) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        try:
            loop.run_until_complete(self._serve(app, ready))
        finally:
            loop.close()

    async def _serve(self, app: web.Application, ready: concurrent.futures.Future[int]) -> None:
        self._stopping = asyncio.Event()
        try:
            runner, port = await start_site(app, self.host, self._requested_port)
        except BaseException as exc:
            ready.set_exception(exc)
            return
        ready.set_result(port)
        try:
            await self._stopping.wait()
        finally:
            await runner.cleanup()
