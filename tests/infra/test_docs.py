"""The README and docs/ against the code, beyond docs/contract.md (test_contract_doc.py):
the counts the README states (agents, workflows, service URLs) are catalogue.json's, every
setting the pages name is one the code reads, and every route they name is served."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from types import SimpleNamespace
from typing import cast

import pytest

from devhost.otlp.app import create_app as trace_receiver_app
from devhost.otlp.store import SpanStore
from shared.contract import AgentLimitSetting, ChaosSetting, DevhostSetting, Setting
from tests.app_functions import registered_functions
from tests.infra.deployment import INFRA, ROOT, load_json
from tests.infra.test_contract_doc import TABLES, Table, parse_tables
from tests.workflows import CATALOGUE, SERVICE_URL_SETTINGS

README = ROOT / "README.md"
PAGES = (README, *sorted((ROOT / "docs").glob("*.md")))
_WORDS = "zero one two three four five six seven eight nine ten eleven twelve"
NUMBERS = {word: n for n, word in enumerate(_WORDS.split(" "))}
_TICKED = re.compile(r"`([^`]+)`")


def _text(page: Path) -> str:
    """The page with its line breaks as spaces, so a phrase split over two lines is one."""
    return re.sub(r"\s+", " ", page.read_text(encoding="utf-8"))


def _ticked(page: Path) -> set[str]:
    """What the page has in backticks; fence lines (three backticks each) left out, so
    they do not pair the inline spans wrongly."""
    lines = page.read_text(encoding="utf-8").splitlines()
    text = "\n".join(line for line in lines if not line.lstrip().startswith("```"))
    return set(_TICKED.findall(text))


def _number(word: str) -> int:
    return int(word) if word.isdigit() else NUMBERS[word.lower()]


def _relative(page: Path) -> str:
    return str(page.relative_to(ROOT))


# Counts ---------------------------------------------------------------------------------

AGENTS = tuple(CATALOGUE.agents)
WORKFLOWS = tuple(dict.fromkeys(w.name for w in CATALOGUE.workflows))
_SHIPS = re.compile(
    r"(\w+) agents \(([^)]*)\) and (\w+) workflows ship: (.*?)`python -m", re.IGNORECASE
)


def test_the_readme_names_the_agents_and_workflows_that_ship_and_counts_them() -> None:
    match = _SHIPS.search(_text(README))
    assert match, "README: no '<n> agents (...) and <m> workflows ship: ...' sentence"
    agents, named_agents, workflows, named_workflows = match.groups()
    assert _number(agents) == len(AGENTS) and _TICKED.findall(named_agents) == list(AGENTS)
    assert _number(workflows) == len(WORKFLOWS)
    named = [name for name in _TICKED.findall(named_workflows) if name in WORKFLOWS]
    assert named == list(WORKFLOWS), f"README names {named}, catalogue.json has {WORKFLOWS}"


COUNTED = {
    "agents": len(AGENTS),
    "remote services": len(AGENTS),
    "service urls": len(SERVICE_URL_SETTINGS),
    "workflows": len(WORKFLOWS),
}
_COUNT = re.compile(
    rf"\b({'|'.join(NUMBERS)}|\d+) ({'|'.join(COUNTED)})\b".replace(" ", r"\s+"), re.IGNORECASE
)


@pytest.mark.parametrize("page", PAGES, ids=_relative)
def test_every_count_of_agents_workflows_and_service_urls_is_the_catalogues(page: Path) -> None:
    counts = [
        (m.group(0), _number(m.group(1)), m.group(2).lower()) for m in _COUNT.finditer(_text(page))
    ]
    wrong = [
        f"{said!r} (catalogue.json: {COUNTED[what]})"
        for said, n, what in counts
        if n != COUNTED[what]
    ]
    assert not wrong, f"{_relative(page)}: {wrong}"


def test_the_readme_counts_the_service_urls_azd_asks_for_in_their_one_variable() -> None:
    parameters = load_json(INFRA / "main.parameters.json")["parameters"]
    variable = parameters["serviceUrls"]["value"].strip("${}")
    azd = re.search(r"azd up +# asks for ([^\n]*)", README.read_text(encoding="utf-8"))
    assert azd, "README: the azd up line says what it asks for"
    asks = azd.group(1)
    assert variable in asks and "one JSON object" in asks, asks
    assert re.search(rf"\b{_word(len(AGENTS))} agents' service URLs", asks), asks


def _word(n: int) -> str:
    return next(word for word, value in NUMBERS.items() if value == n)


# Settings -------------------------------------------------------------------------------

CODE_SETTINGS = (
    {v for k, v in vars(Setting).items() if k.isupper() and isinstance(v, str)}
    | {v for k, v in vars(ChaosSetting).items() if k.isupper() and isinstance(v, str)}
    | {v for k, v in vars(DevhostSetting).items() if k.isupper() and isinstance(v, str)}
    | {AgentLimitSetting.MAX_CONCURRENT, AgentLimitSetting.CALLS_PER_SECOND}
    | set(AgentLimitSetting.names(CATALOGUE.agents))
    | set(SERVICE_URL_SETTINGS)
)
IDENTITY_CONNECTIONS = {Setting.STORAGE, Setting.SERVICE_BUS}
"""Read in their identity form too: `<name>__fullyQualifiedNamespace`, `__clientId`, ..."""


def read_by_the_code(name: str) -> bool:
    base, separator, _ = name.partition("__")
    return name in CODE_SETTINGS or bool(separator and base in IDENTITY_CONNECTIONS)


def _first_column_names(table: Table) -> list[str]:
    """The names in backticks in the first column that are identifiers (not a file name
    or a catalogue field mentioned beside them)."""
    return [
        name
        for row in table.rows
        for name in _TICKED.findall(row[0])
        if re.fullmatch(r"[A-Z][A-Za-z0-9_{}.<>]*", name) and not name.endswith(".json")
    ]


@pytest.mark.parametrize(
    ("page", "heading"),
    [
        (README, "Configuration reference"),
        (ROOT / "docs" / "configuration.md", "Settings the code reads"),
    ],
    ids=lambda v: v if isinstance(v, str) else _relative(v),
)
def test_every_setting_a_settings_table_lists_is_read_by_the_code(page: Path, heading: str) -> None:
    tables = [t for t in parse_tables(page.read_text(encoding="utf-8")) if t.heading == heading]
    assert len(tables) == 1, f"{_relative(page)}: one table under {heading!r}"
    names = _first_column_names(tables[0])
    assert names, f"{_relative(page)}: {heading} lists no setting"
    unknown = sorted(n for n in names if not read_by_the_code(n))
    assert not unknown, f"{_relative(page)} lists settings the code never reads: {unknown}"


# Names that look like a setting (two or more words, ending as some setting does) but
# that the docs use for something else.
_SUFFIXES = {
    re.findall(r"[A-Z][a-z0-9]*", s.split("__", 1)[0])[-1] for s in CODE_SETTINGS if not s.isupper()
}
_OTHER_KINDS = {
    name
    for table in TABLES
    if not table.heading.startswith(("6.", "7.3"))
    for name in _first_column_names(table)
}
NOT_SETTINGS = {
    "MismatchCount": "a stored field of a reconciliation run (docs/contract.md 3)",
    "PartitionKey": "Table Storage's own key of every entity (docs/capacity.md)",
}


def _setting_shaped(name: str) -> bool:
    words = re.findall(r"[A-Z][a-z0-9]*", name.split("__", 1)[0])
    return (
        re.fullmatch(r"[A-Z][a-z][A-Za-z0-9]*(__\S+)?", name) is not None
        and len(words) >= 2
        and words[-1] in _SUFFIXES
    )


@pytest.mark.parametrize("page", PAGES, ids=_relative)
def test_every_setting_a_page_names_is_read_by_the_code(page: Path) -> None:
    named = {n for n in _ticked(page) if _setting_shaped(n)}
    unknown = sorted(n for n in named - _OTHER_KINDS - set(NOT_SETTINGS) if not read_by_the_code(n))
    assert not unknown, f"{_relative(page)} names settings the code never reads: {unknown}"


def test_a_setting_the_code_does_not_read_is_caught() -> None:
    """The check above can fail: a misspelt or retired setting is setting-shaped."""
    for name in ("HeartbeatSchedule", "BulkSchedule", "StepTimeoutSecond"):
        assert _setting_shaped(name) and not read_by_the_code(name), name


# Routes ---------------------------------------------------------------------------------

_ROUTE = re.compile(r"(?:\b(GET|POST|PUT|DELETE|PATCH) )?(/api/[A-Za-z0-9_{}/.\-]*)")


def _served() -> set[tuple[str, str]]:
    """(method, path) of every route of the function app, and of the local trace receiver
    (`python -m devhost`'s `/api/traces`, which the docs name as the local one)."""
    routes = {
        (method.upper(), f"/api/{f.trigger['route']}")
        for f in registered_functions()
        if f.trigger_type == "httpTrigger"
        for method in f.trigger["methods"]
    }
    receiver = trace_receiver_app(cast(SpanStore, SimpleNamespace()))
    routes |= {
        (route.method, route.resource.canonical)
        for route in receiver.router.routes()
        if route.resource is not None and route.resource.canonical.startswith("/api/")
    }
    return routes


def _pattern(path: str) -> re.Pattern[str]:
    return re.compile(re.sub(r"\\\{[^}]*\\\}", "[^/]+", re.escape(path)))


def _is_served(method: str | None, path: str, served: set[tuple[str, str]]) -> bool:
    return any(
        (method is None or method == m) and (_pattern(p).fullmatch(path) or path == p)
        for m, p in served
    )


@pytest.mark.parametrize("page", PAGES, ids=_relative)
def test_every_route_a_page_names_is_served(page: Path) -> None:
    served = _served()
    named = {
        (m.group(1), m.group(2).rstrip("."))
        for m in _ROUTE.finditer(page.read_text(encoding="utf-8"))
        if not m.group(2).endswith(("/", "..."))
    }
    unserved = sorted(f"{m or ''} {p}".strip() for m, p in named if not _is_served(m, p, served))
    assert not unserved, f"{_relative(page)} names routes nothing serves: {unserved}"


def test_a_route_nothing_serves_is_caught() -> None:
    served = _served()
    assert _is_served("POST", "/api/orders/o-1/cancel", served)
    assert not _is_served("POST", "/api/orders/o-1/refund", served)
    assert not _is_served("DELETE", "/api/orders/o-1", served)


CITES_OUTSIDE = re.compile(r"DESIGN(\.md)?\s+section|\.\./shared/")
"""A citation of the design document that lives outside the repository: a reader of the
repository cannot follow it (its docs/ say the same things, and the code cites those)."""


def _tracked_text_files() -> list[Path]:
    listed = subprocess.run(
        ["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.split()
    suffixes = {".py", ".md", ".bicep", ".json", ".html", ".sh", ".toml", ".yml", ".yaml"}
    return [ROOT / f for f in listed if Path(f).suffix in suffixes and (ROOT / f).is_file()]


def test_nothing_cites_a_document_outside_the_repository() -> None:
    cited = [
        f"{path.relative_to(ROOT)}:{n}: {line.strip()}"
        for path in _tracked_text_files()
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if CITES_OUTSIDE.search(line)
    ]
    assert not cited, "\n".join(cited)


def test_a_citation_outside_the_repository_is_caught() -> None:
    # Built from parts, so this file holds no citation itself and is checked like any other.
    design = "DESIGN"
    assert CITES_OUTSIDE.search(f'"""Events ({design} section 13)."""')
    assert CITES_OUTSIDE.search(f"see ../{'shared'}/{design}.md")
    assert not CITES_OUTSIDE.search("see docs/catalogue.md and shared/domain/model.py")
