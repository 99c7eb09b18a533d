"""Call a user function the way the Python worker does.

The worker passes the trigger under the binding's argument name and a ``context``
when the function asks for one, awaits coroutines on the event loop and runs plain
functions in a thread so a blocking handler cannot stall every other trigger.
"""

from __future__ import annotations

import asyncio
import inspect
import threading
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from devhost.host.loader import FunctionSpec

_thread_local = threading.local()


@dataclass(frozen=True)
class RetryContext:
    retry_count: int = 0
    max_retry_count: int = 0
    exception: Any = None


@dataclass(frozen=True)
class TraceContext:
    trace_parent: str = ""
    trace_state: str = ""
    attributes: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class InvocationContext:
    """Duck-typed ``azure.functions.Context`` for functions that declare ``context``."""

    invocation_id: str
    function_name: str
    function_directory: str = "."
    trace_context: TraceContext = field(default_factory=TraceContext)
    retry_context: RetryContext = field(default_factory=RetryContext)

    @property
    def thread_local_storage(self) -> threading.local:
        return _thread_local


def new_invocation_id() -> str:
    return str(uuid.uuid4())


def _wants_context(spec: FunctionSpec) -> bool:
    try:
        return "context" in inspect.signature(spec.func).parameters
    except (TypeError, ValueError):
        return False


async def invoke(
    spec: FunctionSpec, trigger_value: Any, invocation_id: str, trace: TraceContext | None = None
) -> Any:
    """Run the function with its trigger argument and return what it returned. `trace`
    is the host's invocation span (see tracing.py), handed over as the worker does."""
    kwargs: dict[str, Any] = {str(spec.trigger["name"]): trigger_value}
    if _wants_context(spec) and "context" not in kwargs:
        kwargs["context"] = InvocationContext(
            invocation_id=invocation_id,
            function_name=spec.name,
            trace_context=trace or TraceContext(),
        )
    if inspect.iscoroutinefunction(spec.func):
        return await spec.func(**kwargs)
    result = await asyncio.to_thread(spec.func, **kwargs)
    if inspect.isawaitable(result):
        return await result
    return result
