"""docs/contract.md against the code, so that the page users read cannot drift from it.

Every table in the page has the names in backticks in its first column; each test reads
one kind of table and compares its names with what the code declares, both ways.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from types import SimpleNamespace
from typing import Any, cast

import pytest
from aiohttp import web

from devhost import services
from devhost.__main__ import DEFAULT_PORT, add_demo_options, add_run_options
from devhost.broker.control import build_app as broker_control_app
from devhost.broker.engine import Engine
from devhost.broker.faults import FaultConfig
from devhost.simulator.app import create_app
from devhost.simulator.faults import FaultSettings
from shared.adapters.table import rows as table_rows
from shared.contract import (
    QUEUE_PROPERTIES,
    AgentLimitSetting,
    ChaosSetting,
    DevhostSetting,
    PoisonProperty,
    Route,
    Setting,
)
from shared.domain.machine.forward import start
from shared.domain.messages import (
    AgentReply,
    AgentRequest,
    Nudge,
    OperatorAlert,
    OrderSubmission,
    StatusNotification,
)
from shared.domain.model import (
    Action,
    ErrorInfo,
    ExhaustedPolicy,
    NotificationStatus,
    Notify,
    Outcome,
    Priority,
    ProcessState,
    ReceivedEvent,
    StepRecord,
    StepStatus,
)
from shared.openapi import document
from tests.app_functions import registered_functions
from tests.builders import an_order
from tests.infra.deployment import ROOT
from tests.workflows import ALL_QUEUES, ORDER_FULFILMENT, SERVICE_URL_SETTINGS

DOC = ROOT / "docs" / "contract.md"
API_PREFIX = "/api"
_HEADING = re.compile(r"^#{2,4}\s+(.*?)\s*$")
_CELL_SPLIT = re.compile(r"(?<!\\)\|")
_TICKED = re.compile(r"`([^`]+)`")


@dataclass(frozen=True)
class Table:
    heading: str
    rows: tuple[tuple[str, ...], ...]

    def names(self) -> list[str]:
        """The first backticked name of each row's first column."""
        found = []
        for row in self.rows:
            match = _TICKED.search(row[0])
            assert match, f"{self.heading}: row without a `name` in its first column: {row}"
            found.append(match.group(1))
        return found

    def by_name(self) -> dict[str, tuple[str, ...]]:
        names = self.names()
        duplicates = sorted({n for n in names if names.count(n) > 1})
        assert not duplicates, f"{self.heading}: listed twice: {duplicates}"
        return dict(zip(names, self.rows, strict=True))


def _cells(line: str) -> tuple[str, ...]:
    return tuple(c.strip() for c in _CELL_SPLIT.split(line.strip().strip("|")))


def parse_tables(markdown: str) -> list[Table]:
    """Markdown tables with the heading they sit under (header and rule rows dropped)."""
    tables: list[Table] = []
    heading = ""
    block: list[str] = []

    def flush() -> None:
        if len(block) >= 2:
            width = len(_cells(block[0]))
            rows = tuple(_cells(line) for line in block[2:])
            for row in rows:
                assert len(row) == width, f"{heading}: a row with {len(row)} cells: {row}"
            tables.append(Table(heading, rows))
        block.clear()

    for line in markdown.splitlines():
        if line.lstrip().startswith("|"):
            block.append(line)
            continue
        flush()
        if match := _HEADING.match(line):
            heading = match.group(1)
    flush()
    return tables


TABLES = parse_tables(DOC.read_text(encoding="utf-8"))


def tables(heading: str) -> list[Table]:
    found = [t for t in TABLES if t.heading == heading]
    assert found, f"docs/contract.md has no table under the heading {heading!r}"
    return found


def table(heading: str) -> Table:
    (only,) = tables(heading)
    return only


def documented(heading: str) -> set[str]:
    return set(table(heading).by_name())


def ticked(cell: str) -> list[str]:
    return _TICKED.findall(cell)


def missing_and_extra(doc: set[str], code: set[str]) -> str:
    return f"in the code only: {sorted(code - doc)}; in the doc only: {sorted(doc - code)}"


# Queues ---------------------------------------------------------------------------------


def test_queues_are_exactly_the_contract_queues() -> None:
    doc, code = documented("1. Queues"), set(ALL_QUEUES)
    assert doc == code, missing_and_extra(doc, code)


def test_each_queue_names_the_function_that_consumes_it() -> None:
    consumers = {
        f.trigger["queueName"]: f.name
        for f in registered_functions()
        if f.trigger_type == "serviceBusTrigger"
    }
    for queue, row in table("1. Queues").by_name().items():
        named = ticked(row[2])
        expected = [consumers[queue]] if queue in consumers else []
        assert named == expected, f"queue {queue}: the doc says {named}, the code {expected}"


def test_queue_properties_match_the_code() -> None:
    rows = table("1.1 Queue properties").by_name()
    code = {k: json.dumps(v) for k, v in dataclasses.asdict(QUEUE_PROPERTIES).items()}
    doc = {name: ticked(row[1])[0] for name, row in rows.items()}
    assert doc == code


def test_poison_properties_match_the_code() -> None:
    code = {v for k, v in vars(PoisonProperty).items() if k.isupper()}
    doc = documented("1.2 Poison messages")
    assert doc == code, missing_and_extra(doc, code)


# HTTP routes ----------------------------------------------------------------------------


def _routes() -> dict[tuple[str, str], tuple[str, ...]]:
    routes = {}
    for name, row in table("2. HTTP API").by_name().items():
        method, path = name.split(" ", 1)
        routes[(method, path)] = row
    return routes


def test_routes_are_exactly_the_openapi_paths_and_methods() -> None:
    code = {
        (method.upper(), f"{API_PREFIX}{path}")
        for path, operations in document()["paths"].items()
        for method in operations
    }
    doc = set(_routes())
    assert doc == code, missing_and_extra({str(r) for r in doc}, {str(r) for r in code})


def test_every_declared_route_is_documented() -> None:
    code = {f"{API_PREFIX}/{v}" for k, v in vars(Route).items() if k.isupper()}
    doc = {path for _, path in _routes()}
    assert doc == code, missing_and_extra(doc, code)


def test_route_status_codes_are_the_openapi_responses() -> None:
    paths = document()["paths"]
    for (method, path), row in _routes().items():
        responses = paths[path.removeprefix(API_PREFIX)][method.lower()]["responses"]
        assert sorted(ticked(row[2])) == sorted(responses), f"{method} {path}"


def test_route_auth_levels_are_the_bindings() -> None:
    bindings = {
        (method, f"{API_PREFIX}/{f.trigger['route']}"): str(f.trigger["authLevel"]).lower()
        for f in registered_functions()
        if f.trigger_type == "httpTrigger"
        for method in f.trigger["methods"]
    }
    doc = {route: row[1] for route, row in _routes().items()}
    assert doc == bindings


def test_order_submission_fields_match_the_validating_model() -> None:
    code = set(OrderSubmission.model_json_schema(by_alias=True)["properties"])
    for heading in ("2.1 Order submission body", "5.1 Order message"):
        doc = documented(heading)
        assert doc == code, f"{heading}: {missing_and_extra(doc, code)}"


# State store ----------------------------------------------------------------------------

NOW = datetime(2026, 1, 1, tzinfo=UTC)


def test_state_record_properties_are_what_the_table_adapter_writes() -> None:
    process = start(an_order(reply_to="order-status"), ORDER_FULFILMENT, NOW, cause="m-1").process
    # Every optional property set, so none is left out as a null.
    full = replace(
        process,
        order=replace(
            process.order,
            trace_parent=f"00-{'1' * 32}-{'2' * 16}-01",
            not_before=NOW,
            notify=Notify.FINAL,
        ),
        state=replace(
            process.state,
            locked_by="i-1",
            complete_by=NOW,
            last_error="boom",
            events=(ReceivedEvent("e-1", "review", NOW),),
        ),
    )
    code = set(table_rows.state_entity(full)) - {"PartitionKey", "RowKey"}
    doc = documented("3.1 State record")
    assert doc == code, missing_and_extra(doc, code)


def test_step_record_fields_match_the_domain() -> None:
    code = {f.name for f in dataclasses.fields(StepRecord)}
    doc = documented("3.2 Step record")
    assert doc == code, missing_and_extra(doc, code)


# Status values --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("heading", "values"),
    [
        ("4.1 Process states", ProcessState),
        ("4.2 Step statuses", StepStatus),
        ("4.3 Notification statuses", NotificationStatus),
    ],
)
def test_status_values_match_the_domain(heading: str, values: type[Any]) -> None:
    code = {v.value for v in values}
    doc = documented(heading)
    assert doc == code, missing_and_extra(doc, code)


def test_other_values_match_the_domain() -> None:
    enums = {"action": Action, "outcome": Outcome, "priority": Priority}
    code = {(v.value, of) for of, e in enums.items() for v in e}
    code |= {(v.value, "ExhaustedPolicy") for v in ExhaustedPolicy}
    doc = {(ticked(row[0])[0], ticked(row[1])[0]) for row in table("4.4 Other values").rows}
    assert doc == code


# Messages -------------------------------------------------------------------------------


def _message_fields() -> dict[str, set[str]]:
    request = AgentRequest("o", "s", Action.DO, 1, NOW, "o:op", {})
    undo = AgentRequest("o", "s", Action.COMPENSATE, 1, NOW, "o:u", {}, "o:op", "u")
    handed_back = dataclasses.replace(request, start_at=NOW)
    succeeded = AgentReply("o", "s", Action.DO, 1, Outcome.SUCCEEDED)
    failed = AgentReply("o", "s", Action.DO, 1, Outcome.FAILED, error=ErrorInfo("c", "m"))
    status = StatusNotification("o", NotificationStatus.FAILED, NOW, detail="why")
    alert = OperatorAlert("o", "r", 3, "e", NOW)
    poison_alert = dataclasses.replace(alert, failure_count=0, queue="q", body="{}")
    return {
        "5.2 Nudge": set(Nudge("o", "r").to_body()),
        "5.3 Agent request": set(request.to_body())
        | set(undo.to_body())
        | set(handed_back.to_body()),
        "5.4 Agent reply": set(succeeded.to_body()) | set(failed.to_body()),
        "5.5 Status notification": set(status.to_body()),
        "5.6 Operator alert": set(alert.to_body()) | set(poison_alert.to_body()),
    }


@pytest.mark.parametrize("heading", sorted(_message_fields()))
def test_message_fields_match_what_the_domain_sends(heading: str) -> None:
    code = _message_fields()[heading]
    doc = documented(heading)
    assert doc == code, missing_and_extra(doc, code)


# Settings -------------------------------------------------------------------------------


def test_settings_are_exactly_the_settings_the_code_reads() -> None:
    code = {v for k, v in vars(Setting).items() if k.isupper() and isinstance(v, str)}
    code |= set(SERVICE_URL_SETTINGS)
    code.add(ChaosSetting.FAULT_RATE)
    code |= {AgentLimitSetting.MAX_CONCURRENT, AgentLimitSetting.CALLS_PER_SECOND}
    doc = documented("6. Settings")
    assert doc == code, missing_and_extra(doc, code)


# Local runtime and control APIs ---------------------------------------------------------

_LONG_OPTION = re.compile(r"(?<![\w-])--[a-z][a-z-]*")


def _options(configure: Any) -> set[str]:
    parser = argparse.ArgumentParser()
    configure(parser)
    return set(_LONG_OPTION.findall(parser.format_help())) - {"--help"}


def test_devhost_flags_match_its_parser() -> None:
    run_table, demo_table = tables("7.2 Flags")
    run = _options(add_run_options)
    assert set(run_table.by_name()) == run
    assert set(demo_table.by_name()) == _options(add_demo_options) - run


def test_local_ports_match_the_code() -> None:
    code = {
        "runtime": {DEFAULT_PORT},
        "simulator": {services.SIMULATOR_DEFAULT_PORT},
        "broker": {services.BROKER_DEFAULT_PORT},
        "broker-control": {services.BROKER_CONTROL_PORT},
        "azurite": set(services.AZURITE_PORTS.values()),
        "otlp": {services.OTLP_DEFAULT_PORT},
    }
    rows = table("7.1 Ports").by_name()
    doc = {name: {int(p) for p in ticked(row[1]) if p.isdigit()} for name, row in rows.items()}
    assert doc == code


def _routes_of(app: web.Application) -> set[str]:
    return {
        f"{route.method} {route.resource.canonical}"
        for route in app.router.routes()
        if route.method != "HEAD" and route.resource is not None
    }


def test_simulator_routes_match_the_code() -> None:
    routes = _routes_of(create_app())
    control = {r for r in routes if r.split(" ", 1)[1].startswith("/_sim/")}
    for heading, code in (
        ("8.1 Simulator services (port 7072)", routes - control),
        ("8.2 Simulator control API", control),
    ):
        doc = documented(heading)
        assert doc == code, f"{heading}: {missing_and_extra(doc, code)}"


def test_simulator_fault_settings_match_the_code() -> None:
    code = set(FaultSettings().to_json())
    doc = documented("8.3 Simulator fault settings")
    assert doc == code, missing_and_extra(doc, code)


def test_broker_control_routes_match_the_code() -> None:
    engine = cast(Engine, SimpleNamespace(queue_names={}))
    doc = documented("8.4 Local broker control API (port 7073)")
    code = _routes_of(broker_control_app(engine))
    assert doc == code, missing_and_extra(doc, code)


def test_broker_fault_settings_match_the_code() -> None:
    code = set(FaultConfig().to_json())
    doc = documented("8.5 Broker fault settings")
    assert doc == code, missing_and_extra(doc, code)


def test_local_runtime_settings_match_the_code() -> None:
    code = {v for k, v in vars(DevhostSetting).items() if k.isupper()}
    doc = documented("7.3 Local front door")
    assert doc == code, missing_and_extra(doc, code)


# References to the page -----------------------------------------------------------------

_REFERENCE = re.compile(r"contract\.md#([A-Za-z0-9_-]+)")
REFERRING = ("shared", "devhost", "tests", "docs", "infra", "chaos", "bench")


def _anchor(heading: str) -> str:
    """The anchor a Markdown renderer gives a heading (GitHub's rule, ASCII headings)."""
    return re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")


def test_every_reference_to_a_section_of_the_page_resolves() -> None:
    text = DOC.read_text(encoding="utf-8")
    anchors = {_anchor(m.group(1)) for line in text.splitlines() if (m := _HEADING.match(line))}
    files = [ROOT / "README.md"] + [
        path
        for folder in REFERRING
        for path in (ROOT / folder).rglob("*")
        if path.suffix in {".py", ".md", ".bicep"} and "__pycache__" not in path.parts
    ]
    dangling = sorted(
        f"{path.relative_to(ROOT)}: #{anchor}"
        for path in files
        for anchor in _REFERENCE.findall(path.read_text(encoding="utf-8"))
        if anchor not in anchors
    )
    assert not dangling, f"links to sections docs/contract.md does not have: {dangling}"
