"""Archive glue: a timer on the app setting ArchiveSchedule (NCRONTAB), `POST
/api/archive` (admin) to run it now, and `GET /api/archive/{day}` (admin) to list what a
day holds. `GET /api/orders/{id}` answers an archived order through `archived_view`.

A run that overlaps another (the endpoint during a timer run, two instances) finds the
cursor held and does nothing: the archiver keeps one run at a time itself.
"""

from __future__ import annotations

from typing import Any, Final

import azure.functions as func

from shared.contract import Route, Setting
from shared.domain.archive import ArchivedOrder, ArchiveRun, parse_day
from shared.domain.continuation import InvalidContinuation
from shared.domain.messages import iso
from shared.domain.principal import Role
from shared.domain.workflow import Catalogue
from shared.functions import composition
from shared.functions.http import (
    bounded_int,
    json_response,
    order_not_found,
    order_view,
    problem,
)
from shared.functions.signin import route_level
from shared.ports import ArchiveStore, StateStoreError
from shared.telemetry.spans import serving, timed
from shared.usecases.history.archive import archived_on, was_archived

bp = func.Blueprint()
_UNAVAILABLE: Final = ("Try again", "the state store or the archive is unavailable")
_NO_ARCHIVE: Final = "the archive needs the table store and a blob service (docs/operations.md)"


@bp.timer_trigger(arg_name="timer", schedule=f"%{Setting.ARCHIVE_SCHEDULE}%", run_on_startup=False)
async def archive(timer: func.TimerRequest, context: func.Context) -> None:
    with timed(context):
        found = (await composition.archiving()).archiver
        if found is not None:
            await found.run()


@bp.route(route=Route.ARCHIVE, methods=["POST"], auth_level=route_level())
async def archive_http(req: func.HttpRequest, context: func.Context) -> func.HttpResponse:
    h = await composition.archiving()
    actor = await h.gate.admit(req, Role.OPERATE)
    if isinstance(actor, func.HttpResponse):
        return actor
    with serving(req, context):
        found = h.archiver
        if found is None:  # not a dependency that is down: retrying will not help
            return problem(409, "Not configured", _NO_ARCHIVE)
        try:
            run = await found.run()
        except StateStoreError:
            return problem(503, *_UNAVAILABLE, {"Retry-After": "5"})
        return json_response(run_view(run))


@bp.route(route=Route.ARCHIVE_DAY, methods=["GET"], auth_level=route_level())
async def archive_day(req: func.HttpRequest) -> func.HttpResponse:
    h = await composition.archiving()
    actor = await h.gate.admit(req, Role.READ)
    if isinstance(actor, func.HttpResponse):
        return actor
    try:
        day = parse_day(req.route_params.get("day", ""))
    except ValueError as exc:
        return problem(400, "Invalid day", str(exc))
    pages = bounded_int(req, "pages", 10, 1, 100)
    if isinstance(pages, func.HttpResponse):
        return pages
    try:
        listing = await archived_on(h.archive_blobs, day, pages, req.params.get("continuation"))
    except InvalidContinuation as exc:
        return problem(400, "Invalid continuation", str(exc))
    except StateStoreError:
        return problem(503, *_UNAVAILABLE, {"Retry-After": "5"})
    return json_response(
        {
            "day": day.isoformat(),
            "items": [
                {
                    "orderId": e.order_id,
                    "processState": e.process_state.value,
                    "finishedAt": iso(e.finished_at),
                    "archivedAt": iso(e.archived_at),
                    "blob": e.blob,
                }
                for e in listing.entries
            ],
            "continuation": listing.continuation,
        }
    )


async def missing_order(archive: ArchiveStore | None, order_id: str) -> func.HttpResponse:
    """The answer of an action on an order not in the table. An archived one finished
    (only final orders are archived) and `GET` still shows it: it is a 409 like any
    final order, not a 404 that says it never was."""
    try:
        archived = await was_archived(archive, order_id)
    except StateStoreError:
        return problem(503, *_UNAVAILABLE, {"Retry-After": "5"})
    if not archived:
        return order_not_found(order_id)
    return problem(
        409,
        "Archived",
        f"order {order_id!r} finished and was archived: nothing can change it now "
        f"(GET /api/orders/{order_id} shows it as it finished)",
        code="archived",
    )


def archived_view(order: ArchivedOrder, catalogue: Catalogue) -> dict[str, Any]:
    """The order view as it was when archived; nothing about it is live any more."""
    view = order_view(order.process, catalogue)
    return {**view, "archived": True, "archivedAt": iso(order.archived_at)}


def run_view(run: ArchiveRun) -> dict[str, Any]:
    return {
        "instance": run.instance,
        "startedAt": iso(run.started_at),
        "finishedAt": iso(run.finished_at),
        "archived": run.archived,
        "pages": run.pages,
        "kept": run.kept,
        "resumed": run.resumed,
        "skipped": run.skipped,
    }
