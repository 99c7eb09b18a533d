"""The order archive on Blob Storage: one page a blob, gzip JSON lines, one order a line.

Layout: container `order-archive` (ARCHIVE_CONTAINER), blobs `yyyy/mm/dd/<page>.jsonl.gz`
by the UTC day each order finished (shared/domain/archive.py). A line is
`{"orderId", "archivedAt", "process"}` where `process` is the order, its state record,
its steps and its whole history as the generic dataclass codec writes them, so a field
the domain adds later is archived the day it is added and old lines still read.

JSON lines so that a reader can stream a page and a tool (zcat, jq) reads it without
this code; gzip because order JSON repeats its keys on every line (about 8x smaller).
A page is written whole with one PUT (overwrite allowed): a page is only ever rewritten
with the same content by a run finishing a killed run's page.
"""

from __future__ import annotations

import asyncio
import gzip
import json
from collections.abc import Sequence
from dataclasses import replace
from datetime import date
from typing import Any, Final

from azure.core.credentials_async import AsyncTokenCredential
from azure.core.exceptions import (
    AzureError,
    ResourceExistsError,
    ResourceNotFoundError,
)
from azure.storage.blob import ContentSettings
from azure.storage.blob.aio import BlobServiceClient, ContainerClient

from shared import jsonbounds
from shared.adapters.dataclass_json import from_json, to_json
from shared.adapters.table.client import CONNECTION_TIMEOUT, READ_TIMEOUT, RETRY_OPTIONS
from shared.adapters.table.rows import utc
from shared.contract import ARCHIVE_CONTAINER
from shared.domain.archive import ArchivedOrder, day_prefix
from shared.domain.model import OrderProcess
from shared.ports import StoreUnavailable

SUFFIX: Final = ".jsonl.gz"


def blob_service_client(
    *,
    connection_string: str | None = None,
    endpoint: str | None = None,
    credential: AsyncTokenCredential | None = None,
) -> BlobServiceClient:
    """As the table client (table_client.py): short timeouts and one quick retry, since
    the archiver's own next run is the retry that matters, and no proxy lookups."""
    options: dict[str, Any] = {
        "use_env_settings": False,
        "connection_timeout": CONNECTION_TIMEOUT,
        "read_timeout": READ_TIMEOUT,
        **RETRY_OPTIONS,
    }
    if connection_string:
        return BlobServiceClient.from_connection_string(connection_string, **options)
    if endpoint is None or credential is None:
        raise ValueError("a Blob client needs a connection string or an endpoint and a credential")
    return BlobServiceClient(endpoint, credential=credential, **options)


def encode(orders: Sequence[ArchivedOrder]) -> bytes:
    lines = (
        json.dumps(
            {
                "orderId": o.order_id,
                "archivedAt": o.archived_at.isoformat(),
                "process": to_json(replace(o.process, etag=None)),
            },
            ensure_ascii=False,
            separators=(",", ":"),
        )
        for o in orders
    )
    # mtime 0: the same page compresses to the same bytes, whoever writes it. Text with
    # a lone surrogate, which rows stored before the edge refused it may hold, is kept
    # as its escape: an encode that raised failed this page on every run, and nothing
    # after it was archived again (issue 41).
    return gzip.compress(jsonbounds.utf8("\n".join(lines) + "\n"), mtime=0)


def decode(data: bytes) -> tuple[ArchivedOrder, ...]:
    found = []
    for line in gzip.decompress(data).decode().splitlines():
        if not line.strip():
            continue
        item = json.loads(line)
        found.append(
            ArchivedOrder(
                process=from_json(OrderProcess, item["process"]),
                archived_at=utc(item["archivedAt"]),
            )
        )
    return tuple(found)


class BlobArchive:
    def __init__(self, service: BlobServiceClient, container: str = ARCHIVE_CONTAINER) -> None:
        self._service = service
        self._container: ContainerClient = service.get_container_client(container)
        self._ready = False
        self._ready_lock = asyncio.Lock()

    async def close(self) -> None:
        await self._container.close()
        await self._service.close()

    async def ensure_container(self) -> None:
        """Created once per worker; in Azure the Bicep already did."""
        if self._ready:
            return
        async with self._ready_lock:
            if self._ready:
                return
            try:
                await self._container.create_container()
            except ResourceExistsError:
                pass
            except AzureError as exc:
                raise StoreUnavailable(f"archive container: {exc}") from exc
            self._ready = True

    async def exists(self, name: str) -> bool:
        await self.ensure_container()
        try:
            return bool(await self._container.get_blob_client(name).exists())
        except AzureError as exc:
            raise StoreUnavailable(f"archive {name}: {exc}") from exc

    async def write(self, name: str, orders: Sequence[ArchivedOrder]) -> None:
        await self.ensure_container()
        try:
            await self._container.upload_blob(
                name,
                encode(orders),
                overwrite=True,
                # a .gz file, not a gzip-encoded response: tools download the bytes as is
                content_settings=ContentSettings(content_type="application/gzip"),
            )
        except AzureError as exc:
            raise StoreUnavailable(f"archive {name}: {exc}") from exc

    async def read(self, name: str) -> tuple[ArchivedOrder, ...]:
        await self.ensure_container()
        try:
            stream = await self._container.download_blob(name, decompress=False)
            data = await stream.readall()
        except ResourceNotFoundError:
            return ()
        except AzureError as exc:
            raise StoreUnavailable(f"archive {name}: {exc}") from exc
        return decode(data)

    async def pages(
        self, day: date, limit: int, continuation: str | None
    ) -> tuple[tuple[str, ...], str | None]:
        await self.ensure_container()
        names: list[str] = []
        try:
            pager: Any = self._container.list_blobs(
                name_starts_with=day_prefix(day), results_per_page=limit
            ).by_page(continuation_token=continuation)
            async for page in pager:
                names.extend([str(b.name) async for b in page if str(b.name).endswith(SUFFIX)])
                break
            token = pager.continuation_token
        except AzureError as exc:
            raise StoreUnavailable(f"archive {day_prefix(day)}: {exc}") from exc
        return tuple(names), token or None
