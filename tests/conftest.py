"""Fixtures shared by every suite: the real Azurite, started once per session when needed."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from devhost.harness.stack import lone_azurite


@pytest.fixture(scope="session")
def azurite_table_port() -> Iterator[int]:
    with lone_azurite() as port:
        yield port
