"""Handing available messages to the client receivers (our sender links) that have credit.

Links are served round-robin, one message per link per round, so competing receivers on one
queue share the work instead of the first link with credit taking everything.
"""

from __future__ import annotations

import logging
import uuid
from typing import Any

from proton import Condition, Endpoint

from .engine import Engine

log = logging.getLogger(__name__)

_ACTIVE = Endpoint.LOCAL_ACTIVE | Endpoint.REMOTE_ACTIVE


class Dispatcher:
    """Consumer links per entity. ``Any`` links: proton's wrappers carry our attributes."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine
        self._links: dict[str, list[Any]] = {}
        self._cursor: dict[str, int] = {}

    def add(self, entity: str, link: Any, presettled: bool) -> None:
        link.sb_entity = entity
        link.sb_presettled = presettled
        self._links.setdefault(entity, []).append(link)

    def remove(self, link: Any) -> None:
        entity = getattr(link, "sb_entity", None)
        links = self._links.get(entity) if entity is not None else None
        if links is not None and link in links:
            links.remove(link)

    def remove_connection(self, connection: Any) -> None:
        """Forget every link of a connection whose transport is gone (no detach will come)."""
        for links in self._links.values():
            links[:] = [link for link in links if link.connection != connection]

    def clear(self) -> None:
        self._links.clear()

    def dispatch_woken(self) -> None:
        for entity in self._engine.pop_woken():
            self.dispatch(entity)

    def dispatch(self, entity: str) -> None:
        links = self._links.get(entity)
        if not links:
            return
        exhausted = False
        while not exhausted:
            ready = [
                link for link in links if link.credit > 0 and (link.state & _ACTIVE) == _ACTIVE
            ]
            if not ready:
                break
            start = self._cursor.get(entity, 0) % len(ready)
            for link in ready[start:] + ready[:start]:
                try:
                    sent = self._send_one(link, entity)
                except Exception:
                    # Dispatch runs inside other links' events; only this link pays for it.
                    log.exception("delivering from %s failed; closing that receiver", entity)
                    self._fail(link)
                    continue
                if not sent:
                    exhausted = True
                    break
            self._cursor[entity] = start + 1
        for link in links:
            if link.drain_mode and link.credit > 0:
                link.drained()  # nothing left: hand the unused credit back, as drain asks

    def _fail(self, link: Any) -> None:
        self.remove(link)
        if not link.state & Endpoint.LOCAL_CLOSED:
            link.condition = Condition("amqp:internal-error", "broker error, see its log")
            link.close()

    def _send_one(self, link: Any, entity: str) -> bool:
        tag = uuid.uuid4().bytes
        # The SDK derives the lock token as UUID(bytes_le=delivery tag); it must be 16 bytes.
        token = None if link.sb_presettled else uuid.UUID(bytes_le=tag)
        payload = self._engine.take(entity, token)
        if payload is None:
            return False
        delivery = link.delivery(tag)
        # proton's Delivery.tag getter decodes tags as UTF-8, so the token rides on the wrapper.
        delivery.sb_token = token
        link.stream(payload)
        link.advance()
        if token is None:
            delivery.settle()  # receive-and-delete: pre-settled, already removed
        return True
