"""Supervisor glue: a timer on the app setting SupervisorSchedule (NCRONTAB)."""

from __future__ import annotations

import os
import time

import azure.functions as func

from shared.contract import Setting
from shared.functions import composition
from shared.telemetry.metrics import swept
from shared.telemetry.spans import sweep, timed
from shared.usecases.flow.supervisor import supervise, sweep_budget

bp = func.Blueprint()


@bp.timer_trigger(
    arg_name="timer", schedule=f"%{Setting.SUPERVISOR_SCHEDULE}%", run_on_startup=False
)
async def supervisor(timer: func.TimerRequest, context: func.Context) -> None:
    """A sweep is a trace of its own; each order it recovers rejoins the order's trace."""
    with timed(context):
        h = await composition.supervising()
        budget = sweep_budget(os.environ.get(Setting.SUPERVISOR_SCHEDULE))
        started = time.monotonic()
        with sweep() as span:
            report = await supervise(
                h.process, h.health, budget, outage=h.outage, queries=h.queries
            )
            span.set_attribute("supervisor.due", report.due)
            span.set_attribute("supervisor.recovered", report.recovered)
        swept(time.monotonic() - started, report.recovered)
