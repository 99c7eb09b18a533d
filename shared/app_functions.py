"""The Function App's registered functions, indexed once per process.

`FunctionApp.get_functions()` raises when called twice on the same app, so every
reader (the local runtime, the tests, the consistency checks) goes through here.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cache
from typing import Any


@dataclass(frozen=True)
class RegisteredFunction:
    name: str
    handler: Any
    bindings: tuple[dict[str, Any], ...]

    @property
    def trigger(self) -> dict[str, Any]:
        return next(b for b in self.bindings if str(b.get("type", "")).endswith("Trigger"))


@cache
def registered_functions() -> tuple[RegisteredFunction, ...]:
    import function_app  # noqa: PLC0415 - importing the app indexes it: only on demand

    return tuple(
        RegisteredFunction(
            name=str(f.get_function_name()),
            handler=f.get_user_function(),
            bindings=tuple(json.loads(f.get_function_json())["bindings"]),
        )
        for f in function_app.app.get_functions()
    )
