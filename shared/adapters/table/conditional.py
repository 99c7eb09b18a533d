"""Single-row writes the small stores beside the orders share: the conditional one every
lease, cursor and schedule row takes (created when the caller read none, else replaced
only at the ETag it read; each caller translates the refusal, 409 exists, 412 changed or
404 gone, into its own lost race), and a write that makes the table on first use."""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, TypeVar

from azure.core import MatchConditions
from azure.core.exceptions import ResourceExistsError, ResourceNotFoundError
from azure.data.tables import UpdateMode
from azure.data.tables.aio import TableClient, TableServiceClient

_T = TypeVar("_T")


async def put_row(
    table: TableClient, entity: Mapping[str, Any], etag: str | None
) -> Mapping[str, Any]:
    """The write's metadata (its new `etag`)."""
    if etag is None:
        return await table.create_entity(entity)
    return await table.update_entity(
        entity, mode=UpdateMode.REPLACE, etag=etag, match_condition=MatchConditions.IfNotModified
    )


async def creating_table(
    service: TableServiceClient, table_name: str, write: Callable[[], Awaitable[_T]]
) -> _T:
    """A write by a store that shares the state table but may come before the state store
    made it. A 404 names a missing table or a missing row, and the services do not spell
    the first alike (Azurite's code is not TableNotFound), so the table is ensured and the
    write tried once more: a second 404 is the row's, for the caller to translate."""
    try:
        return await write()
    except ResourceNotFoundError:
        with contextlib.suppress(ResourceExistsError):
            await service.create_table(table_name)
        return await write()
