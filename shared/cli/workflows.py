"""`workflows`: the catalogue as a team edits it, checked before it is deployed.

These commands read files and, with `--against`, the state store; they never call the
function app, so they run in a pipeline before the deploy.
"""

from __future__ import annotations

import argparse
import importlib
from collections.abc import Mapping
from pathlib import Path

from shared.adapters.table.client import table_service_client
from shared.adapters.table.store import TableStateStore
from shared.catalogue import CatalogueError, catalogue_file, load
from shared.cli.commands import Console
from shared.cli.config import find_settings
from shared.cli.errors import CliError, Exit
from shared.contract import Setting
from shared.domain.workflow import Catalogue
from shared.functions.workflows import workflows_view
from shared.settings import DEVELOPMENT_STORAGE, azurite_connection_string
from shared.usecases.operations.workflow_versions import (
    Stranded,
    counts,
    stranded,
    versions_in_flight,
)


def _catalogue(path: str | None) -> tuple[Path, Catalogue]:
    chosen = Path(path) if path else catalogue_file()
    try:
        return chosen, load(chosen)
    except CatalogueError as exc:
        raise CliError(str(exc), Exit.FAILED) from None


async def check(args: argparse.Namespace, env: Mapping[str, str], console: Console) -> int:
    path, known = _catalogue(args.file)
    report: dict[str, object] = {
        "file": str(path),
        "valid": True,
        "workflows": [f"{w.name} v{w.version}" for w in known.workflows],
    }
    code = Exit.OK
    gone: list[Stranded] = []
    if args.against:
        in_flight = await _in_flight(args.against, args.table, env)
        gone = stranded(known, in_flight)
        report["inFlight"] = {f"{n} v{v}": c for (n, v), c in sorted(counts(in_flight).items())}
        report["stranded"] = [
            {
                "workflow": s.workflow,
                "version": s.version,
                "orders": s.orders,
                "sampleOrderId": s.sample_order_id,
            }
            for s in gone
        ]
        if gone:
            code = Exit.FAILED
    if args.json:
        console.data(report)
    else:
        versions = ", ".join(f"{w.name} v{w.version}" for w in known.workflows)
        console.show(f"{path}: valid ({versions})")
        for lost in gone:
            console.show(
                f"{path}: drops {lost.workflow} v{lost.version}, which {lost.orders} order(s) in "
                f"flight still run on (e.g. {lost.sample_order_id}): keep it until they finish"
            )
        if args.against and code == Exit.OK:
            console.show("every version that orders in flight run on is kept")
    return code


def state_store(against: str, table: str | None, env: Mapping[str, str]) -> TableStateStore:
    """The state table named by `--against` (a connection string, or `settings`: the
    app's local settings) and `--table`."""
    values: Mapping[str, str] = env
    if against == "settings":
        settings = find_settings()
        values = {**settings.values, **env}
        against = values.get(Setting.STORAGE, "")
    if against == DEVELOPMENT_STORAGE:
        against = azurite_connection_string()
    name = table or values.get(Setting.STATE_TABLE) or "Orders"
    return TableStateStore(table_service_client(connection_string=against), name)


async def _in_flight(
    against: str, table: str | None, env: Mapping[str, str]
) -> dict[tuple[str, int], list[str]]:
    store = state_store(against, table, env)
    try:
        return await versions_in_flight(store)
    except Exception as exc:
        problem = f"cannot read the state store: {type(exc).__name__}"
        raise CliError(problem, Exit.UNREACHABLE) from None
    finally:
        await store.close()


async def list_workflows(args: argparse.Namespace, console: Console) -> int:
    _, known = _catalogue(args.file)
    view = workflows_view(known)
    if args.json:
        console.data(view)
        return Exit.OK
    for flow in view["workflows"]:
        default = " (default)" if flow["default"] else ""
        console.show(f"{flow['name']} v{flow['version']}{default}")
        for step in flow["steps"]:
            undo = f", undo {step['undo']}" if step["undo"] else ""
            inputs = f", inputs {', '.join(step['inputs'])}" if step["inputs"] else ""
            if step.get("event"):
                what = f"waits for event {step['event']}" + (
                    " (an approval)" if step.get("approval") else ""
                )
                console.show(f"  {step['name']}: {what}, on deadline {step['onDeadline']}")
            elif step["kind"] == "timer":
                console.show(f"  {step['name']}: timer until {step.get('until') or 'its duration'}")
            else:
                console.show(f"  {step['name']}: {step['kind']} at {step['agent']}{undo}{inputs}")
    return Exit.OK


async def functions(args: argparse.Namespace, console: Console) -> int:
    """Imports the app the way the Functions host indexes it."""
    app = importlib.import_module("function_app").app
    names = sorted(str(f.get_function_name()) for f in app.get_functions())
    if args.json:
        console.data({"functions": names})
    else:
        for name in names:
            console.show(name)
    return Exit.OK
