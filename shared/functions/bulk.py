"""Bulk action glue: the preview and start route, the progress route, and the timer that
works the jobs (shared/usecases/operations/bulk.py)."""

from __future__ import annotations

import re
from typing import Any, Final

import azure.functions as func

from shared.contract import Route, Setting
from shared.domain.bulk import BulkJob
from shared.domain.bulk_request import BulkAction, BulkRequestError, migration_target, parse_request
from shared.domain.principal import Role
from shared.functions import composition
from shared.functions.http import json_response, problem, read_json
from shared.functions.signin import route_level
from shared.ports import StateStoreError
from shared.telemetry.spans import acting_as
from shared.usecases.operations.bulk import (
    BulkJobNotFound,
    job_status,
    preview,
    start_job,
    work_jobs,
)

bp = func.Blueprint()
_BULK_ID: Final = re.compile(r"^[0-9a-f]{32}$")
_UNAVAILABLE: Final = ("Try again", "the state store is unavailable")


def job_view(job: BulkJob) -> dict[str, Any]:
    view: dict[str, Any] = {
        "bulkId": job.bulk_id,
        "action": job.action.value,
        "state": job.state.value,
        "matched": job.matched,
        "done": job.done,
        "skipped": job.skipped,
        "failed": job.failed,
    }
    if job.to_version is not None:
        view["toVersion"] = job.to_version
    return view


@bp.route(route=Route.BULK, methods=["POST"], auth_level=route_level())
async def bulk_orders(req: func.HttpRequest) -> func.HttpResponse:
    h = await composition.bulk()
    actor = await h.gate.admit(req, Role.OPERATE)
    if isinstance(actor, func.HttpResponse):
        return actor
    data, error = read_json(req)
    if error is not None:
        return error
    try:
        request = parse_request(data)
        migration_target(request, h.catalogue)
    except BulkRequestError as exc:
        return problem(400, exc.title, str(exc))
    deps = h.deps
    if deps is None:
        return problem(503, "Try again", "bulk jobs are not available on this store")
    try:
        if request.dry_run:
            found = await preview(deps, request)
            answer: dict[str, Any] = {
                "matched": found.matched,
                "sampleOrderIds": found.sample_order_ids,
                "effects": found.effects_view(),
            }
            if request.action is BulkAction.MIGRATE:
                answer |= {"refused": found.refused, "refusals": found.refusals}
            return json_response(answer)
        job = await start_job(deps, request, actor.recorded)
    except StateStoreError:
        return problem(503, *_UNAVAILABLE, {"Retry-After": "5"})
    location = "/api/" + Route.BULK_JOB.replace("{bulkId}", job.bulk_id)
    return json_response(
        {"bulkId": job.bulk_id, "matched": job.matched}, status=202, headers={"Location": location}
    )


@bp.route(route=Route.BULK_JOB, methods=["GET"], auth_level=route_level())
async def bulk_job(req: func.HttpRequest) -> func.HttpResponse:
    h = await composition.bulk()
    actor = await h.gate.admit(req, Role.READ)
    if isinstance(actor, func.HttpResponse):
        return actor
    bulk_id = req.route_params.get("bulkId", "")
    not_found = problem(404, "Bulk job not found", f"no bulk job with id {bulk_id[:64]!r}")
    if not _BULK_ID.match(bulk_id):
        return not_found
    deps = h.deps
    if deps is None:
        return not_found
    try:
        job = await job_status(deps, bulk_id)
    except BulkJobNotFound:
        return not_found
    except StateStoreError:
        return problem(503, *_UNAVAILABLE, {"Retry-After": "5"})
    return json_response(job_view(job))


@bp.timer_trigger(
    arg_name="timer", schedule=f"%{Setting.BULK_ACTIONS_SCHEDULE}%", run_on_startup=False
)
async def bulk_actions(timer: func.TimerRequest) -> None:
    deps = (await composition.bulk()).deps
    if deps is not None:
        with acting_as("bulk_actions"):  # an order's timeline shows the job's work as such
            await work_jobs(deps)
