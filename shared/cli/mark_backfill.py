"""`python -m shared.cli.mark_backfill --against settings|CONNECTION [--table NAME]`: give
every order archived before the purge left a mark its mark, so its id stays taken
(shared/usecases/history/archive_marks.py). The connection string must name the blob endpoint
too (the archive's copies hold what a mark keeps). Run once after the deploy that brings
marks; it prints where it got to after each page, and `--continuation` goes on from
there after a stop. Ids a newer order holds already are printed for an operator."""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from collections.abc import Mapping, Sequence

from shared.adapters.blob_archive import BlobArchive, blob_service_client
from shared.adapters.table.archive import TableArchiveStore
from shared.cli.config import find_settings
from shared.cli.workflows import state_store
from shared.contract import Setting
from shared.settings import DEVELOPMENT_STORAGE, azurite_connection_string
from shared.usecases.history.archive_marks import backfill_marks


async def run(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m shared.cli.mark_backfill")
    parser.add_argument("--against", required=True, help="a connection string, or settings")
    parser.add_argument("--table", help="the state table (default: the settings' or Orders)")
    parser.add_argument("--blobs", help="the blob connection string, when --against has none")
    parser.add_argument("--page-size", type=int, default=500)
    parser.add_argument("--continuation", help="where a stopped run got to")
    args = parser.parse_args(argv)
    store = state_store(args.against, args.table, dict(os.environ))
    blobs = BlobArchive(blob_service_client(connection_string=_blobs(args, os.environ)))
    scanned = written = 0
    continuation = args.continuation
    try:
        while True:
            page = await backfill_marks(
                store, TableArchiveStore(store), blobs, args.page_size, continuation
            )
            scanned, written = scanned + page.scanned, written + page.written
            continuation = page.continuation
            for order_id in page.reused:
                print(f"{order_id}: archived, and a newer order holds its id: check it")
            print(f"scanned {scanned}, marks written {written}, continuation {continuation}")
            if continuation is None:
                return 0
    finally:
        await store.close()
        await blobs.close()


def _blobs(args: argparse.Namespace, env: Mapping[str, str]) -> str:
    """The blob service: `--blobs`, else the storage `--against` names (Azurite's own
    blob port for development storage, as the app's settings take it)."""
    if args.blobs:
        return str(args.blobs)
    against = str(args.against)
    if against == "settings":
        against = {**find_settings().values, **env}.get(Setting.STORAGE, "")
    if against == DEVELOPMENT_STORAGE:
        return azurite_connection_string(blob_port=10000)
    return against


if __name__ == "__main__":
    sys.exit(asyncio.run(run(sys.argv[1:])))
