"""The catalogue of agents and workflows the app runs: `catalogue.json` at the repo root.

The environment variable `CatalogueFile` points at another file, which is how a test or a
deploy tries a new catalogue without editing this one. Reading it is the composition
root's (shared/bootstrap.py), which hands the result to whatever needs it; a tool with
an entry of its own (the CLI, the local runtime, bench) reads it with `load`.
"""

from __future__ import annotations

import os
from pathlib import Path

from shared.catalogue.load import CatalogueError, load, parse

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_FILE = ROOT / "catalogue.json"
FILE_SETTING = "CatalogueFile"

__all__ = ["CatalogueError", "catalogue_file", "load", "parse"]


def catalogue_file() -> Path:
    configured = os.environ.get(FILE_SETTING)
    return Path(configured) if configured else DEFAULT_FILE
