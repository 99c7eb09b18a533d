"""The embeddable broker: engine, store, AMQP reactor thread and control API in one object.

Tests start one per test on free ports; ``python -m devhost.broker`` runs one in the foreground.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable, Mapping
from types import TracebackType
from typing import Any

from shared.catalogue import catalogue_file, load
from shared.catalogue.derive import all_queues
from shared.contract import QUEUE_PROPERTIES

from .control import ControlServer
from .engine import Engine
from .faults import FaultConfig
from .model import Limits
from .server import BrokerHandler
from .store import open_store

log = logging.getLogger(__name__)

_SNAKE_TO_JSON = {
    "duplicate_rate": "duplicateRate",
    "drop_rate": "dropRate",
    "delay_rate": "delayRate",
    "delay_ms": "delayMs",
    "queues": "queues",
    "seed": "seed",
}


def faults_from(faults: FaultConfig | Mapping[str, Any] | None, **fields: Any) -> FaultConfig:
    """Accept a FaultConfig, the control API's JSON shape, or snake_case keyword fields."""
    if isinstance(faults, FaultConfig):
        return faults
    body: dict[str, Any] = dict(faults or {})
    for key, value in fields.items():
        if key not in _SNAKE_TO_JSON:
            raise TypeError(f"unknown fault field {key!r}")
        body[_SNAKE_TO_JSON[key]] = list(value) if key == "queues" and value is not None else value
    return FaultConfig.from_json(body)


class Broker:
    """A local Service Bus broker for the azure-servicebus SDK.

    ``port=0`` and ``control_port=0`` pick free ports (read them back from ``.port`` and
    ``.control_port``); ``control_port=None`` runs no control API. ``db_path=None`` or
    ``":memory:"`` keeps everything in memory.
    """

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        db_path: str | None = None,
        control_port: int | None = 0,
        lock_seconds: float = QUEUE_PROPERTIES.lock_duration_seconds,
        max_delivery_count: int = QUEUE_PROPERTIES.max_delivery_count,
        extra_queues: Iterable[str] = (),
        faults: FaultConfig | Mapping[str, Any] | None = None,
        duplicate_detection_window_seconds: float = (
            QUEUE_PROPERTIES.duplicate_detection_window_seconds
        ),
    ) -> None:
        if lock_seconds <= 0 or max_delivery_count < 1:
            raise ValueError("lock_seconds must be > 0 and max_delivery_count >= 1")
        self.host = host
        self.port = port
        self.control_port = control_port
        self.db_path = db_path
        queues = all_queues(load(catalogue_file()))
        self.queues: tuple[str, ...] = tuple(dict.fromkeys([*queues, *extra_queues]))
        self._limits = Limits(
            lock_ms=int(lock_seconds * 1000),
            max_delivery_count=max_delivery_count,
            dedupe_window_ms=int(duplicate_detection_window_seconds * 1000),
        )
        self._initial_faults = faults_from(faults)
        self._engine: Engine | None = None
        self._handler: BrokerHandler | None = None
        self._thread: threading.Thread | None = None
        self._control: ControlServer | None = None

    # -- lifecycle -------------------------------------------------------------------------

    def start(self) -> Broker:
        """Listen and run in background threads; returns once connections are accepted."""
        if self._thread is not None:
            raise RuntimeError("broker already started")
        engine = Engine(self.queues, open_store(self.db_path), self._limits, self._initial_faults)
        restored = engine.restore()
        handler = BrokerHandler(engine)
        try:
            port = handler.listen(self.host, self.port)
        except BaseException:
            handler.abandon()
            engine.close()
            raise
        try:
            if self.control_port is not None:
                self._control = ControlServer(engine, self.host, self.control_port)
                self.control_port = self._control.start()
        except BaseException:
            self._control = None
            handler.abandon()
            engine.close()
            raise
        self.port = port
        self._engine, self._handler = engine, handler
        self._thread = threading.Thread(target=self._run, name="broker-amqp", daemon=True)
        self._thread.start()
        log.info("broker on port %d restored %d messages", self.port, restored)
        return self

    def _run(self) -> None:
        assert self._handler is not None
        try:
            self._handler.run()
        except Exception:
            log.exception("broker reactor stopped with an error")

    def stop(self, timeout: float = 5.0) -> None:
        """Close connections, commit what is pending and release the ports."""
        if self._control is not None:
            self._control.stop()
            self._control = None
        if self._thread is not None and self._handler is not None:
            self._handler.request_stop()
            self._thread.join(timeout)
            if self._thread.is_alive():
                log.error("broker reactor did not stop within %.1f s", timeout)
        self._thread = None
        self._handler = None
        if self._engine is not None:
            try:
                self._engine.flush()
            finally:
                self._engine.close()
            self._engine = None

    def __enter__(self) -> Broker:
        if self._thread is None:
            self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    # -- use -------------------------------------------------------------------------------

    @property
    def connection_string(self) -> str:
        host = "127.0.0.1" if self.host in ("0.0.0.0", "", "::") else self.host
        return (
            f"Endpoint=sb://{host}:{self.port};SharedAccessKeyName=RootManageSharedAccessKey;"
            "SharedAccessKey=SAS_KEY_VALUE;UseDevelopmentEmulator=true;"
        )

    @property
    def engine(self) -> Engine:
        if self._engine is None:
            raise RuntimeError("broker not started")
        return self._engine

    def stats(self) -> dict[str, dict[str, int]]:
        return self.engine.stats()

    def set_faults(
        self, faults: FaultConfig | Mapping[str, Any] | None = None, **fields: Any
    ) -> FaultConfig:
        """Replace the fault configuration (no arguments clears it); returns what is in force."""
        config = faults_from(faults, **fields)
        unknown = (config.queues or frozenset()) - set(self.queues)
        if unknown:
            raise ValueError(f"unknown queues: {sorted(unknown)}")
        self.engine.set_faults(config)
        return config

    @property
    def faults(self) -> FaultConfig:
        return self.engine.faults
