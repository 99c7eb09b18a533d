"""Where Table Storage's driver errors become the state store's port errors.

Both Table adapters (the state store and the health store) talk to one driver, so they
share one translation: a refusal the caller expects is a race it lost (or work someone
else already did), anything else the SDK raises means the store is unavailable. The
SDK's exception is not chained (`from None`): its text is in the message and its
traceback is the SDK's own.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

from azure.core.exceptions import AzureError, HttpResponseError

from shared.ports import StateStoreError, StoreUnavailable

Refusal = Callable[[HttpResponseError], bool]
"""Recognises the service's answer to a call that lost a race or had nothing to do."""


def refused_with(*types: type[HttpResponseError]) -> Refusal:
    return lambda exc: isinstance(exc, types)


def refused_status(*statuses: int) -> Refusal:
    return lambda exc: exc.status_code in statuses


def _never(_: HttpResponseError) -> bool:
    return False


@contextlib.contextmanager
def translated_errors(
    lost: StateStoreError | None = None, *, when: Refusal = _never, where: str = ""
) -> Iterator[None]:
    """A refusal `when` recognises raises `lost`, or without one ends the block quietly
    (the table exists, the watch entry moved on); any other driver error raises
    StoreUnavailable, its message prefixed with `where`."""
    try:
        yield
    except HttpResponseError as exc:
        if not when(exc):
            raise StoreUnavailable(f"{where}{exc}") from None
        if lost is not None:
            raise lost from None
    except AzureError as exc:
        raise StoreUnavailable(f"{where}{exc}") from None
