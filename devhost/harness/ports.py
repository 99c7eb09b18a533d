"""Loopback ports: pick a free one, tell whether one answers."""

from __future__ import annotations

import socket

LOOPBACK = "127.0.0.1"


def free_port() -> int:
    """A port nothing listens on right now (the OS picks it, so parallel runs differ)."""
    with socket.socket() as s:
        s.bind((LOOPBACK, 0))
        return int(s.getsockname()[1])


def port_open(port: int, host: str = LOOPBACK, timeout: float = 0.25) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False
