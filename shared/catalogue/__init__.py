"""The catalogue of agents and workflows the app runs: `catalogue.json` at the repo root.

Read once, when first asked (the triggers are registered from it at import). The
environment variable `CatalogueFile` points at another file, which is how a test or a
deploy tries a new catalogue without editing this one.
"""

from __future__ import annotations

import os
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


_loaded: Catalogue | None = None


def catalogue() -> Catalogue:
    global _loaded
    if _loaded is None:
        _loaded = load(catalogue_file())
    return _loaded
