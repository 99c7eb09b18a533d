"""One conditional write of a single row, the shape every lease, cursor and schedule row
takes: created when the caller read none, else replaced only at the ETag it read. Each
caller translates the refusal (409 exists, 412 changed, 404 gone) into its own lost race."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from azure.core import MatchConditions
from azure.data.tables import UpdateMode
from azure.data.tables.aio import TableClient


async def put_row(
    table: TableClient, entity: Mapping[str, Any], etag: str | None
) -> Mapping[str, Any]:
    """The write's metadata (its new `etag`)."""
    if etag is None:
        return await table.create_entity(entity)
    return await table.update_entity(
        entity, mode=UpdateMode.REPLACE, etag=etag, match_condition=MatchConditions.IfNotModified
    )
