"""`python -m shared.cli.rest_shards --against settings|CONNECTION [--table NAME]`: move
the rest entries written before the rest index was sharded into their shards
(shared/usecases/history/rest_shards.py). Run once after the deploy that brings the
shards; it prints its progress after each page, and a repeat after a stop goes on with
what is left."""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from collections.abc import Sequence

from shared.catalogue import catalogue_file, load
from shared.cli.workflows import state_store
from shared.usecases.history.rest_shards import Moved, move_all


def _print(moved: Moved, total: int) -> None:
    left = "done" if moved.done else "more left"
    print(f"{moved.state.value}: {moved.moved} moved ({moved.filed} filed), {total} in all, {left}")


async def run(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m shared.cli.rest_shards")
    parser.add_argument("--against", required=True, help="a connection string, or settings")
    parser.add_argument("--table", help="the state table (default: the settings' or Orders)")
    parser.add_argument("--page-size", type=int, default=200)
    args = parser.parse_args(argv)
    catalogue = load(catalogue_file())
    store = state_store(args.against, args.table, dict(os.environ))
    try:
        total = await move_all(store, catalogue, args.page_size, _print)
    finally:
        await store.close()
    print(f"moved {total} unsharded rest entries")
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(run(sys.argv[1:])))
