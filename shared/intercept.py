"""One way to decorate a port: every method the port declares goes through one hook.

Chaos faults (shared/adapters/chaos.py), spans (shared/adapters/traced.py) and the
bench's counters (bench/_instrument.py) each wrap the state store and the bus. Written
method by method, each had to forward every method of the port, and learn every new
one. Through `Intercepted` a method added to the port reaches all three with their
defaults (no fault, a span named after it, a count under its name); only a method that
needs more than the default is named in their tables.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable
from typing import Any, Generic, TypeVar

P = TypeVar("P")


class Call:
    """One call of a port method, as a hook sees it: which method, with what, and the
    way on to the wrapped port (`proceed`, at most once)."""

    __slots__ = ("_method", "_parameters", "args", "kwargs", "name")

    def __init__(
        self,
        name: str,
        parameters: tuple[str, ...],
        method: Callable[..., Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> None:
        self.name = name
        self.args = args
        self.kwargs = kwargs
        self._parameters = parameters
        self._method = method

    def proceed(self) -> Any:
        """The wrapped port's method on the same arguments: its awaitable, for an async
        method of the port."""
        return self._method(*self.args, **self.kwargs)

    def argument(self, parameter: str) -> Any:
        """What the caller passed for the port's parameter of that name; None when the
        method has no such parameter or the caller left it to its default."""
        if parameter in self.kwargs:
            return self.kwargs[parameter]
        try:
            at = self._parameters.index(parameter)
        except ValueError:
            return None
        return self.args[at] if at < len(self.args) else None


class Intercepted(Generic[P]):
    """`inner` seen through `port`: each method the port declares calls `around` (an
    async one) or `around_sync` (a plain one) with the `Call`; everything else (`close`,
    an adapter's own helpers) is the inner's own. A subclass overrides the hooks.

    The inner's method is looked up at each call, as a hand-written forward did, so a
    test that replaces a method of the inner is still seen through the wrapper."""

    def __init__(self, inner: P, port: type[Any]) -> None:
        self.inner = inner
        for name, parameters, is_async in _methods(port):
            setattr(self, name, self._forward(name, parameters, is_async))

    def _forward(
        self, name: str, parameters: tuple[str, ...], is_async: bool
    ) -> Callable[..., Any]:
        inner: Any = self.inner
        if is_async:

            async def forward_async(*args: Any, **kwargs: Any) -> Any:
                return await self.around(Call(name, parameters, getattr(inner, name), args, kwargs))

            return forward_async

        def forward(*args: Any, **kwargs: Any) -> Any:
            return self.around_sync(Call(name, parameters, getattr(inner, name), args, kwargs))

        return forward

    async def around(self, call: Call) -> Any:
        """An async method of the port; by default straight through."""
        result: Awaitable[Any] = call.proceed()
        return await result

    def around_sync(self, call: Call) -> Any:
        """A plain method of the port; by default straight through."""
        return call.proceed()

    async def close(self) -> None:
        """Closing the wrapper closes what it wraps, when that has anything to close."""
        closer = getattr(self.inner, "close", None)
        if closer is not None:
            await closer()

    def __getattr__(self, name: str) -> Any:
        if name == "inner":
            raise AttributeError(name)
        return getattr(self.inner, name)


Method = tuple[str, tuple[str, ...], bool]
_PORTS: dict[type[Any], tuple[Method, ...]] = {}


def _methods(port: type[Any]) -> tuple[Method, ...]:
    """The port's methods, its own and those of the ports it composes: each with its
    parameters' names (past `self`) and whether it is async. Read once per port."""
    if port in _PORTS:
        return _PORTS[port]
    found: dict[str, Method] = {}
    for klass in reversed(port.__mro__):
        if klass is object or not getattr(klass, "_is_protocol", False):
            continue
        for name, member in vars(klass).items():
            if name.startswith("_") or not inspect.isfunction(member):
                continue
            parameters = tuple(inspect.signature(member).parameters)[1:]
            found[name] = (name, parameters, inspect.iscoroutinefunction(member))
    _PORTS[port] = tuple(found.values())
    return _PORTS[port]
