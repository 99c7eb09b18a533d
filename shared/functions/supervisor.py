"""Supervisor glue: a timer on the app setting SupervisorSchedule (NCRONTAB)."""

from __future__ import annotations

import os

import azure.functions as func

from shared import bootstrap
from shared.contract import Setting
from shared.usecases.supervisor import supervise, sweep_budget

bp = func.Blueprint()


@bp.timer_trigger(
    arg_name="timer", schedule=f"%{Setting.SUPERVISOR_SCHEDULE}%", run_on_startup=False
)
async def supervisor(timer: func.TimerRequest) -> None:
    c = await bootstrap.container()
    budget = sweep_budget(os.environ.get(Setting.SUPERVISOR_SCHEDULE))
    await supervise(c.process, c.health, budget, queries=c.outcome_queries())
