"""Composition root of the Function App: the blueprints of each role, nothing else.

No settings are read and no clients are created here, so indexing never fails on a
missing setting; clients are built on the first invocation (shared.bootstrap).
"""

import azure.functions as func

from shared.functions import (
    agents,
    archive,
    bulk,
    events,
    failures,
    fleet,
    intake,
    operator,
    operator_page,
    reconcile,
    scheduler,
    supervisor,
    workflows,
)

app = func.FunctionApp(http_auth_level=func.AuthLevel.FUNCTION)

for blueprint in (
    intake.bp,
    operator.bp,
    operator_page.bp,
    bulk.bp,
    events.bp,
    fleet.bp,
    failures.bp,
    scheduler.bp,
    agents.bp,
    supervisor.bp,
    reconcile.bp,
    archive.bp,
    workflows.bp,
):
    app.register_functions(blueprint)
