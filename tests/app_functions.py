"""The Function App's functions, indexed once for the whole test session.

`FunctionApp.get_functions()` raises when called twice on one app, so every test that
needs them (function-level, e2e, infra consistency) goes through the local runtime's
memoised loader, exactly as `python -m devhost` does.
"""

from __future__ import annotations

import function_app
from devhost.host.loader import FunctionSpec, functions_of


def registered_functions() -> list[FunctionSpec]:
    return functions_of(function_app.app)
