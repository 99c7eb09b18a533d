"""Index the app from its own decorators, the way the Python worker does.

``FunctionApp.get_functions()`` is the single source of truth for what runs locally:
the runtime never keeps a second list of functions, so a trigger added in
``function_app.py`` shows up here with no other change. ``get_functions()`` is not
idempotent (it raises on the second call because it re-validates names), hence the
memo keyed by app object.
"""

from __future__ import annotations

import importlib
import json
import logging
import sys
import weakref
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

log = logging.getLogger("devhost.loader")

HTTP_TRIGGER = "httpTrigger"
TIMER_TRIGGER = "timerTrigger"
SERVICE_BUS_TRIGGER = "serviceBusTrigger"
SUPPORTED_TRIGGERS = frozenset({HTTP_TRIGGER, TIMER_TRIGGER, SERVICE_BUS_TRIGGER})

# The http output binding ($return) is implicit in every HTTP function and needs no work.
_IMPLICIT_BINDINGS = frozenset({"http"})

_indexed: weakref.WeakKeyDictionary[Any, list[FunctionSpec]] = weakref.WeakKeyDictionary()


class LoadError(Exception):
    """The app could not be imported or indexed."""


@dataclass(frozen=True)
class FunctionSpec:
    """One function as the host sees it: name, callable and function.json bindings."""

    name: str
    func: Callable[..., Any]
    bindings: tuple[Mapping[str, Any], ...]

    @property
    def trigger(self) -> Mapping[str, Any]:
        for binding in self.bindings:
            if str(binding.get("type", "")).endswith("Trigger"):
                return binding
        raise LoadError(f"function {self.name} has no trigger binding")

    @property
    def trigger_type(self) -> str:
        return str(self.trigger["type"])


def describe(functions: Iterable[Any]) -> list[FunctionSpec]:
    """Turn ``azure.functions.Function`` objects into specs using only their public API."""
    specs: list[FunctionSpec] = []
    for function in functions:
        name = function.get_function_name()
        document = json.loads(function.get_function_json())
        spec = FunctionSpec(
            name=str(name),
            func=function.get_user_function(),
            bindings=tuple(document.get("bindings", [])),
        )
        _warn_unsupported(spec)
        specs.append(spec)
    return specs


def _warn_unsupported(spec: FunctionSpec) -> None:
    if spec.trigger_type not in SUPPORTED_TRIGGERS:
        log.warning("function %s: trigger type %s is not run locally", spec.name, spec.trigger_type)
    for binding in spec.bindings:
        kind = str(binding.get("type", ""))
        if binding is spec.trigger or kind in _IMPLICIT_BINDINGS:
            continue
        log.warning(
            "function %s: %s binding %r is not provided by devhost; the call will fail",
            spec.name,
            kind,
            binding.get("name"),
        )


def functions_of(app: Any) -> list[FunctionSpec]:
    """Index an app exactly once, however many callers ask."""
    cached = _indexed.get(app)
    if cached is None:
        cached = describe(app.get_functions())
        _indexed[app] = cached
    return cached


def load_app(root: Path, module_name: str = "function_app") -> list[FunctionSpec]:
    """Import ``function_app`` from the project root and index its ``app``."""
    root_str = str(root.resolve())
    if root_str not in sys.path:
        sys.path.insert(0, root_str)
    if not (root / f"{module_name}.py").is_file() and not (root / module_name).is_dir():
        raise LoadError(f"no {module_name}.py in {root}")
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:
        raise LoadError(f"importing {module_name} failed: {exc!r}") from exc
    app = getattr(module, "app", None)
    if app is None or not hasattr(app, "get_functions"):
        raise LoadError(f"{module_name}.app is not an azure.functions.FunctionApp")
    return functions_of(app)


@dataclass(frozen=True)
class HostConfig:
    """The few ``host.json`` knobs that change how triggers behave locally."""

    route_prefix: str = "api"
    max_concurrent_calls: int = 16
    prefetch_count: int = 0
    max_auto_lock_renewal_seconds: float = 300.0
    max_message_batch_size: int = 1000
    raw: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def from_dict(cls, document: Mapping[str, Any]) -> HostConfig:
        extensions = document.get("extensions") or {}
        http = extensions.get("http") or {}
        service_bus = extensions.get("serviceBus") or {}
        renewal = service_bus.get("maxAutoLockRenewalDuration")
        return cls(
            route_prefix=str(http.get("routePrefix", "api")).strip("/"),
            max_concurrent_calls=max(1, int(service_bus.get("maxConcurrentCalls", 16))),
            prefetch_count=max(0, int(service_bus.get("prefetchCount", 0))),
            max_message_batch_size=max(1, int(service_bus.get("maxMessageBatchSize", 1000))),
            max_auto_lock_renewal_seconds=(
                parse_timespan(str(renewal)) if renewal is not None else 300.0
            ),
            raw=document,
        )

    @classmethod
    def load(cls, root: Path, settings: Mapping[str, str] | None = None) -> HostConfig:
        """``host.json`` with the app settings' overrides of it applied
        (``AzureFunctionsJobHost__extensions__serviceBus__maxConcurrentCalls``), as the
        host applies them: a value can be changed per environment without a redeploy."""
        path = root / "host.json"
        document: dict[str, Any] = {}
        if path.is_file():
            try:
                document = json.loads(path.read_text(encoding="utf-8"))
            except (OSError, ValueError) as exc:
                raise LoadError(f"cannot use {path}: {exc}") from exc
        else:
            log.info("no host.json in %s: using host defaults", root)
        try:
            return cls.from_dict(with_overrides(document, settings or {}))
        except (ValueError, TypeError, AttributeError) as exc:
            raise LoadError(f"cannot use {path} and its overrides: {exc}") from exc


HOST_OVERRIDE = "AzureFunctionsJobHost__"


def with_overrides(document: Mapping[str, Any], settings: Mapping[str, str]) -> dict[str, Any]:
    """A copy of a ``host.json`` document with every ``AzureFunctionsJobHost__a__b``
    setting written at ``a.b``; keys match case-insensitively, as the host's
    configuration does, and keep the document's spelling where it has one."""
    result: dict[str, Any] = json.loads(json.dumps(document))
    for name, value in sorted(settings.items()):
        if not name.startswith(HOST_OVERRIDE) or len(name) == len(HOST_OVERRIDE):
            continue
        *parents, leaf = name[len(HOST_OVERRIDE) :].split("__")
        node = result
        for part in parents:
            key = _spelled(node, part)
            child = node.get(key)
            if not isinstance(child, dict):
                child = node[key] = {}
            node = child
        node[_spelled(node, leaf)] = value
    return result


def _spelled(node: Mapping[str, Any], key: str) -> str:
    return next((k for k in node if k.lower() == key.lower()), key)


def parse_timespan(text: str) -> float:
    """Parse a .NET ``[d.]hh:mm:ss[.fff]`` TimeSpan, the format host.json uses."""
    days = 0
    body = text.strip()
    head, sep, rest = body.partition(".")
    if sep and ":" not in head:
        days, body = int(head), rest
    parts = body.split(":")
    if len(parts) != 3:
        raise ValueError(f"not a TimeSpan: {text!r}")
    hours, minutes, seconds = int(parts[0]), int(parts[1]), float(parts[2])
    return days * 86400 + hours * 3600 + minutes * 60 + seconds
