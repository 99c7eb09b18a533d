"""Duplicate detection by message id within a time window.

Ids expire in the order they were recorded, so a deque of (expiry, id) lets pruning touch only
expired ids instead of scanning the whole window on every send.
"""

from __future__ import annotations

from collections import deque


class DuplicateDetector:
    def __init__(self, window_ms: int) -> None:
        self.window_ms = window_ms
        self._expiry: dict[str, int] = {}
        self._order: deque[tuple[int, str]] = deque()

    def __len__(self) -> int:
        return len(self._expiry)

    def seen(self, message_id: str, now_ms: int) -> bool:
        self.prune(now_ms)
        expires = self._expiry.get(message_id)
        return expires is not None and expires > now_ms

    def record(self, message_id: str, now_ms: int) -> int:
        """Remember ``message_id`` for one window from now; returns when it expires."""
        expires = now_ms + self.window_ms
        self.restore(message_id, expires)
        return expires

    def restore(self, message_id: str, expires_ms: int) -> None:
        self._expiry[message_id] = expires_ms
        self._order.append((expires_ms, message_id))

    def prune(self, now_ms: int) -> None:
        order = self._order
        while order and order[0][0] <= now_ms:
            expires, message_id = order.popleft()
            if self._expiry.get(message_id) == expires:
                del self._expiry[message_id]
