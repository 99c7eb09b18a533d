"""Is a presented key the host's master key? Asked of the Functions host itself.

With a signed-in mode on, operator routes are `anonymous` to the host (a principal
carries no key), so the host no longer checks the master key for them. The app cannot
read the master key, but the host's admin API admits nothing else: a key that gets a
`200` from `GET /admin/host/status` at the app's own address is the master key. A yes
is remembered for a while (by the key's hash, never the key), a no is asked again.
"""

from __future__ import annotations

import hashlib
import time
from typing import Final

import aiohttp

STATUS_PATH: Final = "/admin/host/status"
KEY_HEADER: Final = "x-functions-key"
REMEMBER_SECONDS: Final = 300.0
TIMEOUT_SECONDS: Final = 3.0

_admitted: dict[tuple[str, str], float] = {}


def _fingerprint(key: str) -> str:
    return hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()


async def is_master_key(base_url: str, key: str) -> bool:
    """`base_url`: the app's own scheme and host, as the request reached it."""
    entry = (base_url, _fingerprint(key))
    if _admitted.get(entry, 0.0) > time.monotonic():
        return True
    timeout = aiohttp.ClientTimeout(total=TIMEOUT_SECONDS)
    try:
        async with (
            aiohttp.ClientSession(timeout=timeout) as session,
            session.get(base_url + STATUS_PATH, headers={KEY_HEADER: key}) as answer,
        ):
            admitted = answer.status == 200
    except (TimeoutError, aiohttp.ClientError, OSError, ValueError):
        return False
    if admitted:
        _admitted[entry] = time.monotonic() + REMEMBER_SECONDS
    return admitted
