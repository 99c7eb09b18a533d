"""Small HTTP control API: fault injection and per-queue counters.

It runs on its own thread and asyncio loop so a slow HTTP client never stalls the AMQP reactor;
it only touches the engine through its locked methods.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading

from aiohttp import web

from devhost.malformed import ProblemAppRunner, RateLimitedLog
from devhost.problem import http_errors_as_problems, problem

from .engine import Engine
from .faults import FaultConfig, FaultConfigError

log = logging.getLogger(__name__)


def build_app(engine: Engine) -> web.Application:
    known = frozenset(engine.queue_names.values())

    async def get_faults(request: web.Request) -> web.Response:
        return web.json_response(engine.faults.to_json())

    async def put_faults(request: web.Request) -> web.Response:
        try:
            body = await request.json()
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            return problem(400, "Invalid JSON", str(exc))
        try:
            config = FaultConfig.from_json(body, known)
        except FaultConfigError as exc:
            return problem(400, "Invalid fault configuration", str(exc), errors=exc.problems)
        engine.set_faults(config)
        log.info("faults set: %s", config.to_json())
        return web.json_response(config.to_json())

    async def delete_faults(request: web.Request) -> web.Response:
        engine.set_faults(FaultConfig())
        return web.Response(status=204)

    async def get_stats(request: web.Request) -> web.Response:
        return web.json_response(engine.stats())

    app = web.Application(middlewares=[http_errors_as_problems])
    app.router.add_get("/_broker/faults", get_faults)
    app.router.add_put("/_broker/faults", put_faults)
    app.router.add_delete("/_broker/faults", delete_faults)
    app.router.add_get("/_broker/stats", get_stats)
    return app


class ControlServer:
    def __init__(self, engine: Engine, host: str, port: int) -> None:
        self._engine = engine
        self._host = host
        self._port = port
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None

    def start(self, timeout: float = 10.0) -> int:
        """Serve in a background thread; returns the bound port once listening."""
        self._thread = threading.Thread(target=self._run, name="broker-control", daemon=True)
        self._thread.start()
        if not self._ready.wait(timeout):
            raise RuntimeError("control API did not start")
        if self._error is not None:
            raise self._error
        return self._port

    def _run(self) -> None:
        try:
            asyncio.run(self._serve())
        except Exception as exc:
            if self._ready.is_set():
                log.exception("control API failed")
            else:  # start() re-raises it in the caller's thread
                self._error = exc
                self._ready.set()

    async def _serve(self) -> None:
        runner = ProblemAppRunner(
            build_app(self._engine), refusals=RateLimitedLog(log), access_log=None
        )
        await runner.setup()
        try:
            site = web.TCPSite(runner, self._host, self._port)
            await site.start()
            self._port = int(runner.addresses[0][1])
            self._loop = asyncio.get_running_loop()
            self._stop = asyncio.Event()
            self._ready.set()
            await self._stop.wait()
        finally:
            await runner.cleanup()

    def stop(self, timeout: float = 5.0) -> None:
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        if self._thread is not None:
            self._thread.join(timeout)
        self._thread = None
