"""docs/capacity.md against the pinned per-order counts (bench/order_counts.py), which
tests/integration/test_order_counts.py measures: the page's per-order table must be
those counts, and its ceilings the limits its column headers name divided by them."""

from __future__ import annotations

import re

from bench.order_counts import HEADERS, PINNED, rows
from tests.infra.deployment import ROOT

DOC = ROOT / "docs" / "capacity.md"

LIMIT = re.compile(r"\(([\d,]+) (credits|requests)/s\)")
"""The limit a ceiling column divides: `... (1,000 credits/s)`."""


def tables(text: str, heading: str) -> list[list[list[str]]]:
    """The Markdown tables under `## {heading}` (up to the next heading of that level
    or above), each as rows of cells, the header row first and the rule left out."""
    section = f"\n{text}".split(f"\n## {heading}\n", 1)[1]
    section = re.split(r"\n#{1,2} ", section, maxsplit=1)[0]
    found: list[list[list[str]]] = []
    current: list[list[str]] = []
    for line in [*section.splitlines(), ""]:
        if line.startswith("|"):
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if not all(set(c) <= {"-", ":"} for c in cells):
                current.append(cells)
        elif current:
            found.append(current)
            current = []
    return found


def test_tables_are_read_cell_by_cell_and_section_by_section() -> None:
    text = "## A\n\n| x | y |\n|---|---|\n| 1 | 2 |\n\n## B\n\n| z |\n|---|\n| 3 |\n"
    assert tables(text, "A") == [[["x", "y"], ["1", "2"]]]
    assert tables(text, "B") == [[["z"], ["3"]]]


def test_the_per_order_table_is_the_pinned_counts() -> None:
    (table,) = tables(DOC.read_text(encoding="utf-8"), "Per order")
    assert table[0] == list(HEADERS)
    assert [tuple(row) for row in table[1:]] == rows(PINNED)


def test_each_ceiling_is_its_limit_divided_by_the_pinned_count() -> None:
    (table,) = tables(DOC.read_text(encoding="utf-8"), "Ceilings")
    header, body = table[0], table[1:]
    assert [row[0] for row in body] == list(PINNED)
    limits = [LIMIT.search(column) for column in header[1:]]
    assert all(limits), header
    for row in body:
        counts = PINNED[row[0]]
        for limit, cell in zip(limits, row[1:], strict=True):
            assert limit is not None
            per_order = counts.credits if limit[2] == "credits" else counts.total_table
            assert int(cell) == int(limit[1].replace(",", "")) // per_order, (row[0], limit[0])
