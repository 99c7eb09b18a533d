"""docs/architecture.md against the code, so that the map a newcomer follows cannot
point at code that is gone.

Every `path/file.py:function` and `path/file.py:Class.method` the page names must be
defined in that file, and every relative link must lead to a file (and, for a page, to
one of its headings). The code is parsed with `ast`, never imported: naming a module in
a document must not run it.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path

from tests.infra.deployment import ROOT

DOC = ROOT / "docs" / "architecture.md"

REFERENCE = re.compile(r"(?<![\w/.-])((?:[\w-]+/)*[\w-]+\.py):([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)?)")
"""`shared/usecases/flow/scheduler.py:on_nudge`,
`shared/usecases/flow/unit_of_work.py:UnitOfWork.change`."""

LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")
EXTERNAL = ("http://", "https://", "mailto:")
FENCE = re.compile(r"^\s*(```|~~~)")
HEADING = re.compile(r"^#{1,6}\s+(.*?)\s*#*\s*$")
MERMAID = re.compile(r"^```mermaid\n(\w[\w-]*)", re.MULTILINE)


@dataclass(frozen=True)
class Reference:
    path: str
    name: str
    line: int

    def __str__(self) -> str:
        return f"line {self.line}: {self.path}:{self.name}"


def references(text: str) -> list[Reference]:
    return [
        Reference(m.group(1), m.group(2), text.count("\n", 0, m.start()) + 1)
        for m in REFERENCE.finditer(text)
    ]


def defined(source: str) -> set[str]:
    """The module's functions and classes by name, and each class's methods as
    `Class.method`."""
    names: set[str] = set()
    for node in ast.parse(source).body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            names.add(node.name)
        elif isinstance(node, ast.ClassDef):
            names.add(node.name)
            names.update(
                f"{node.name}.{member.name}"
                for member in node.body
                if isinstance(member, ast.FunctionDef | ast.AsyncFunctionDef)
            )
    return names


def missing_references(text: str, root: Path) -> list[str]:
    problems: list[str] = []
    parsed: dict[str, set[str] | None] = {}
    for ref in references(text):
        if ref.path not in parsed:
            file = root / ref.path
            parsed[ref.path] = defined(file.read_text()) if file.is_file() else None
        names = parsed[ref.path]
        if names is None:
            problems.append(f"{ref}: no such file")
        elif ref.name not in names:
            problems.append(f"{ref}: {ref.path} defines no {ref.name}")
    return problems


def slug(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation dropped, spaces to
    hyphens (`### 3.4 What FailureCount counts` -> `34-what-failurecount-counts`)."""
    text = re.sub(r"`|\*\*|__", "", heading).strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(markdown: str) -> set[str]:
    found: set[str] = set()
    seen: dict[str, int] = {}
    fenced = False
    for line in markdown.splitlines():
        if FENCE.match(line):
            fenced = not fenced
            continue
        heading = HEADING.match(line)
        if fenced or heading is None:
            continue
        base = slug(heading.group(1))
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    return found


def broken_links(text: str, page: Path) -> list[str]:
    problems: list[str] = []
    for match in LINK.finditer(text):
        target = match.group(1)
        if target.startswith(EXTERNAL):
            continue
        line = text.count("\n", 0, match.start()) + 1
        path, _, anchor = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        if not file.exists():
            problems.append(f"line {line}: {target}: no such file")
        elif anchor and file.suffix == ".md" and anchor not in anchors(file.read_text()):
            problems.append(f"line {line}: {target}: no heading #{anchor} in {file.name}")
    return problems


def test_every_function_the_page_names_is_defined_where_it_says() -> None:
    text = DOC.read_text()
    assert len(references(text)) >= 100, "the page names its hops as path/file.py:function"
    assert missing_references(text, ROOT) == []


def test_every_relative_link_of_the_page_resolves() -> None:
    text = DOC.read_text()
    assert LINK.search(text) is not None
    assert broken_links(text, DOC) == []


def test_the_page_draws_the_parts_one_order_and_its_states() -> None:
    assert MERMAID.findall(DOC.read_text()) == ["flowchart", "sequenceDiagram", "stateDiagram-v2"]


def test_a_renamed_function_a_missing_file_and_a_dead_link_are_each_found() -> None:
    """The checks above can fail: each kind of drift, on a page made for it."""
    page = (
        "`shared/usecases/flow/scheduler.py:on_nudge` and "
        "`shared/usecases/flow/unit_of_work.py:UnitOfWork.change` are there; "
        "`shared/usecases/flow/scheduler.py:on_nudge_renamed`, "
        "`shared/usecases/flow/unit_of_work.py:UnitOfWork.gone`, "
        "`shared/usecases/nowhere.py:claim` are not.\n"
        "[ok](in-doubt.md#the-rule) [gone](nowhere.md) "
        "[no heading](in-doubt.md#no-such-heading) [web](https://example.org/x.md)\n"
    )
    assert missing_references(page, ROOT) == [
        "line 1: shared/usecases/flow/scheduler.py:on_nudge_renamed: "
        "shared/usecases/flow/scheduler.py defines no on_nudge_renamed",
        "line 1: shared/usecases/flow/unit_of_work.py:UnitOfWork.gone: "
        "shared/usecases/flow/unit_of_work.py defines no UnitOfWork.gone",
        "line 1: shared/usecases/nowhere.py:claim: no such file",
    ]
    assert broken_links(page, DOC) == [
        "line 2: nowhere.md: no such file",
        "line 2: in-doubt.md#no-such-heading: no heading #no-such-heading in in-doubt.md",
    ]


def test_github_anchors_are_made_as_github_makes_them() -> None:
    page = "# A page\n## 3.4 What `FailureCount` counts\n```\n# not a heading\n```\n## A page\n"
    assert anchors(page) == {"a-page", "34-what-failurecount-counts", "a-page-1"}
