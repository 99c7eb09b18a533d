"""Calling a function the way the Python worker does: its trigger argument, a context
when it declares one, and a GUID per invocation."""

from __future__ import annotations

import threading
import uuid
from typing import Any

from devhost.host.invoke import InvocationContext, invoke, new_invocation_id
from devhost.host.loader import FunctionSpec


def spec(func: Any) -> FunctionSpec:
    return FunctionSpec("f", func, ({"type": "queueTrigger", "name": "msg"},))


def test_each_invocation_id_is_a_new_version_4_guid() -> None:
    ids = [new_invocation_id() for _ in range(2000)]

    assert len(set(ids)) == len(ids)
    for text in ids:
        parsed = uuid.UUID(text)
        assert str(parsed) == text
        assert parsed.version == 4
        assert parsed.variant == uuid.RFC_4122


async def test_a_function_gets_a_context_only_when_it_declares_one() -> None:
    seen: list[tuple[Any, ...]] = []

    async def with_context(msg: str, context: InvocationContext) -> None:
        seen.append((msg, context.invocation_id, context.function_name))

    async def without(msg: str) -> None:
        seen.append((msg,))

    for _ in range(2):  # the second call asks the same function again
        await invoke(spec(with_context), "m", "id-1")
        await invoke(spec(without), "n", "id-2")

    assert seen == [("m", "id-1", "f"), ("n",), ("m", "id-1", "f"), ("n",)]


async def test_a_plain_function_runs_off_the_loops_thread_and_returns() -> None:
    def plain(msg: str) -> str:
        return f"{msg} on {threading.current_thread() is threading.main_thread()}"

    assert await invoke(spec(plain), "m", "id") == "m on False"


async def test_an_unhashable_callable_is_called_too() -> None:
    class Handler:
        __hash__ = None  # type: ignore[assignment]

        async def __call__(self, msg: str, context: InvocationContext) -> str:
            return f"{msg} {context.invocation_id}"

    assert await invoke(spec(Handler()), "m", "id-3") == "m id-3"
