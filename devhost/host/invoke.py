"""Call a user function the way the Python worker does.

The worker passes the trigger under the binding's argument name and a ``context``
when the function asks for one, awaits coroutines on the event loop and runs plain
functions in a thread so a blocking handler cannot stall every other trigger.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import os
import threading
from collections.abc import Callable, Mapping
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
    """A random (version 4) GUID, as the Functions host gives each invocation. Spelled out
    from 16 random bytes: ``str(uuid.uuid4())`` builds a ``UUID`` in Python, four times
    the cost, and this runs for every message and request."""
    digits = os.urandom(16).hex()
    variant = "89ab"[int(digits[16], 16) & 3]
    return f"{digits[:8]}-{digits[8:12]}-4{digits[13:16]}-{variant}{digits[17:20]}-{digits[20:]}"


@functools.cache
def _convention(func: Callable[..., Any]) -> tuple[bool, bool]:
    """Whether the function takes ``context``, and whether it is a coroutine function:
    read once per function (``inspect.signature`` costs 20 us, every invocation asked)."""
    try:
        wants_context = "context" in inspect.signature(func).parameters
    except (TypeError, ValueError):
        wants_context = False
    return wants_context, inspect.iscoroutinefunction(func)


def _calling(func: Callable[..., Any]) -> tuple[bool, bool]:
    try:
        return _convention(func)
    except TypeError:  # an unhashable callable: read it every time
        return _convention.__wrapped__(func)


async def invoke(
    spec: FunctionSpec, trigger_value: Any, invocation_id: str, trace: TraceContext | None = None
) -> Any:
    """Run the function with its trigger argument and return what it returned. `trace`
    is the host's invocation span (see tracing.py), handed over as the worker does."""
    kwargs: dict[str, Any] = {str(spec.trigger["name"]): trigger_value}
    wants_context, is_coroutine = _calling(spec.func)
    if wants_context and "context" not in kwargs:
        kwargs["context"] = InvocationContext(
            invocation_id=invocation_id,
            function_name=spec.name,
            trace_context=trace or TraceContext(),
        )
    if is_coroutine:
        return await spec.func(**kwargs)
    result = await asyncio.to_thread(spec.func, **kwargs)
    if inspect.isawaitable(result):
        return await result
    return result
