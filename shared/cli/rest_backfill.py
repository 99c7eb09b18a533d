"""`python -m shared.cli.rest_backfill --against settings|CONNECTION [--table NAME]`: give
every order stored at rest before the rest index its entry (shared/usecases/
rest_backfill.py). Run once after the deploy that brings the index; it prints where it
got to after each page, and `--continuation` goes on from there after a stop."""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from collections.abc import Sequence

from shared.catalogue import catalogue_file, load
from shared.cli.workflows import state_store
from shared.usecases.history.rest_backfill import backfill_page


async def run(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m shared.cli.rest_backfill")
    parser.add_argument("--against", required=True, help="a connection string, or settings")
    parser.add_argument("--table", help="the state table (default: the settings' or Orders)")
    parser.add_argument("--page-size", type=int, default=500)
    parser.add_argument("--continuation", help="where a stopped run got to")
    args = parser.parse_args(argv)
    catalogue = load(catalogue_file())
    store = state_store(args.against, args.table, dict(os.environ))
    scanned = written = 0
    continuation = args.continuation
    try:
        while True:
            page = await backfill_page(store, catalogue, args.page_size, continuation)
            scanned, written = scanned + page.scanned, written + page.written
            continuation = page.continuation
            print(f"scanned {scanned}, entries written {written}, continuation {continuation}")
            if continuation is None:
                return 0
    finally:
        await store.close()


if __name__ == "__main__":
    sys.exit(asyncio.run(run(sys.argv[1:])))
