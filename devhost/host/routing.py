"""Route templates with the matching rules of the Functions host (ASP.NET routing).

Only the parts a Functions app realistically uses are implemented: ``{name}``
parameters, type constraints (``{id:int}``, ``{id:guid}``...; other constraints
are accepted and ignored), optional ``{name?}`` and catch-all ``{*rest}``
parameters, case-insensitive literals, and precedence where a literal segment beats
a parameter so ``orders/health`` is never swallowed by ``orders/{orderId}``.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Generic, TypeVar
from urllib.parse import unquote

log = logging.getLogger("devhost.http")

T = TypeVar("T")

_PARAM = re.compile(r"\{([^{}]+)\}")
_DEFAULT_VALUE = r"[^/]+"
_CONSTRAINTS = {
    "int": r"-?\d+",
    "long": r"-?\d+",
    "bool": r"(?:[Tt][Rr][Uu][Ee]|[Ff][Aa][Ll][Ss][Ee])",
    "guid": r"[0-9A-Fa-f]{8}-?(?:[0-9A-Fa-f]{4}-?){3}[0-9A-Fa-f]{12}",
    "alpha": r"[A-Za-z]+",
    "double": r"-?\d+(?:\.\d+)?",
    "decimal": r"-?\d+(?:\.\d+)?",
    "float": r"-?\d+(?:\.\d+)?",
}

# Lower sorts first, i.e. wins: literal, literal+parameter, constrained, plain,
# optional, catch-all.
_LITERAL, _MIXED, _CONSTRAINED, _PLAIN, _OPTIONAL, _CATCH_ALL = range(6)


class RouteError(ValueError):
    """A route template cannot be understood."""


@dataclass(frozen=True)
class RouteTemplate:
    template: str
    pattern: re.Pattern[str]
    param_names: tuple[str, ...]
    precedence: tuple[int, ...]

    def match(self, path: str) -> dict[str, str] | None:
        found = self.pattern.fullmatch(path)
        if found is None:
            return None
        params: dict[str, str] = {}
        for index, name in enumerate(self.param_names):
            value = found.group(f"p{index}")
            if value is not None:
                params[name] = unquote(value)
        return params


def _parameter(spec: str, group: str, template: str) -> tuple[str, str, int, bool]:
    """Return (name, regex, precedence, optional) for the inside of ``{...}``."""
    body = spec.strip()
    catch_all = body.startswith("*")
    body = body.lstrip("*")
    optional = body.endswith("?")
    body = body.rstrip("?")
    name, _, constraints = body.partition(":")
    name = name.partition("=")[0].strip()
    if not name:
        raise RouteError(f"empty parameter name in route {template!r}")
    value = ".*" if catch_all else _DEFAULT_VALUE
    rank = _CATCH_ALL if catch_all else _OPTIONAL if optional else _PLAIN
    for constraint in filter(None, constraints.split(":")):
        kind = constraint.partition("(")[0].strip().lower()
        if kind in _CONSTRAINTS and not catch_all:
            value = _CONSTRAINTS[kind]
            rank = min(rank, _CONSTRAINED)
        else:
            log.debug("route %r: constraint %r is not enforced locally", template, constraint)
    return name, f"(?P<{group}>{value})", rank, optional or catch_all


def compile_route(template: str) -> RouteTemplate:
    """Compile a template such as ``orders/{orderId:guid}/resubmit``."""
    names: list[str] = []
    precedence: list[int] = []
    regex = ""
    segments = [segment for segment in template.strip("/").split("/") if segment]
    for position, segment in enumerate(segments):
        separator = "/" if position else ""
        params = list(_PARAM.finditer(segment))
        if not params:
            regex += separator + re.escape(segment)
            precedence.append(_LITERAL)
            continue
        if len(params) == 1 and params[0].group(0) == segment:
            name, value, rank, optional = _parameter(params[0].group(1), f"p{len(names)}", template)
            names.append(name)
            precedence.append(rank)
            regex += f"(?:{separator}{value})?" if optional else separator + value
            continue
        # A segment mixing literal text and parameters, e.g. "{name}.{ext}".
        piece, last = "", 0
        for found in params:
            piece += re.escape(segment[last : found.start()])
            name, value, _, _ = _parameter(found.group(1), f"p{len(names)}", template)
            names.append(name)
            piece += value.replace(_DEFAULT_VALUE, r"[^/]+?")
            last = found.end()
        piece += re.escape(segment[last:])
        regex += separator + piece
        precedence.append(_MIXED)
    pattern = re.compile(regex, re.IGNORECASE)
    return RouteTemplate(template, pattern, tuple(names), tuple(precedence))


@dataclass(frozen=True)
class Route(Generic[T]):
    template: RouteTemplate
    methods: frozenset[str] | None
    target: T

    def allows(self, method: str) -> bool:
        return self.methods is None or method.upper() in self.methods


@dataclass(frozen=True)
class Matched(Generic[T]):
    target: T
    params: dict[str, str]
    template: str


@dataclass(frozen=True)
class MethodNotAllowed:
    allowed: tuple[str, ...]


@dataclass(frozen=True)
class NotFound:
    pass


class Router(Generic[T]):
    """All HTTP routes of the app; one lookup decides between match, 404 and 405."""

    def __init__(self) -> None:
        self._routes: list[Route[T]] = []

    def add(self, template: str, methods: Iterable[str] | None, target: T) -> None:
        upper = frozenset(method.upper() for method in methods) if methods else None
        self._routes.append(Route(compile_route(template), upper, target))
        self._routes.sort(key=lambda route: route.template.precedence)

    def match(self, method: str, path: str) -> Matched[T] | MethodNotAllowed | NotFound:
        """``path`` is relative to the route prefix and still percent-encoded. A 405's
        `Allow` names the methods of the most specific routes the path matched: ``OPTIONS
        orders/bulk`` allows POST (the bulk route), not also GET from ``orders/{orderId}``
        reading "bulk" as an id."""
        relative = path.strip("/")
        allowed: set[str] = set()
        best: tuple[int, ...] | None = None
        for route in self._routes:
            params = route.template.match(relative)
            if params is None:
                continue
            if route.allows(method):
                return Matched(route.target, params, route.template.template)
            if best is None:
                best = route.template.precedence
            if route.template.precedence == best:
                allowed.update(route.methods or ())
        if best is not None:
            return MethodNotAllowed(tuple(sorted(allowed)))
        return NotFound()
