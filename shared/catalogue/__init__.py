"""The catalogue of agents and workflows the app runs: `catalogue.json` at the repo root.

Read once, when first asked (the triggers are registered from it at import). The
environment variable `CatalogueFile` points at another file, which is how a test or a
deploy tries a new catalogue without editing this one.
"""

from __future__ import annotations

import os
from functools import cache
from pathlib import Path

from shared.catalogue.load import CatalogueError, load, parse
from shared.domain.workflow import Catalogue

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_FILE = ROOT / "catalogue.json"
FILE_SETTING = "CatalogueFile"

__all__ = ["CatalogueError", "catalogue", "catalogue_file", "load", "parse"]


def catalogue_file() -> Path:
    configured = os.environ.get(FILE_SETTING)
    return Path(configured) if configured else DEFAULT_FILE


@cache
def catalogue() -> Catalogue:
    return load(catalogue_file())
