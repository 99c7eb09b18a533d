"""The deployment files as the consistency tests see them: parsed once, evaluated across modules.

Everything here reads files of the repository; nothing talks to Azure or Docker.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

import yaml

from tests.infra.bicep import (
    BicepFile,
    Call,
    Index,
    Interpolation,
    Loop,
    Module,
    Ref,
    Resource,
    Value,
    read_bicep,
)

ROOT = Path(__file__).resolve().parents[2]
INFRA = ROOT / "infra"
MAIN = INFRA / "main.bicep"
LOCAL_SETTINGS = ROOT / "local.settings.sample.json"
EMULATOR_AMQP_PORT = 5672

# Built-in role definition ids (the same in every tenant) and their names.
ROLE_NAMES = {
    "b7e6dc6d-f1e8-4753-8033-0f276bb0955b": "Storage Blob Data Owner",
    "ba92f5b4-2d11-453d-a403-e96b0029c9fe": "Storage Blob Data Contributor",
    "0a9a7e1f-b9d0-4cc4-a60d-0319b160aaa3": "Storage Table Data Contributor",
    "974c5e8b-45b9-4653-ba55-5f855dd0fb88": "Storage Queue Data Contributor",
    "69a216fc-b8fb-44d8-bc22-1f3c2cd27a39": "Azure Service Bus Data Sender",
    "4f6d3b9b-027b-4f4c-9142-0e5a2a2247e0": "Azure Service Bus Data Receiver",
    "090c5cfd-751d-490a-894a-3ce6f1109419": "Azure Service Bus Data Owner",
    "3913510d-42f4-4e42-8a64-420c390055eb": "Monitoring Metrics Publisher",
}


def bicep_paths() -> list[Path]:
    return sorted(INFRA.rglob("*.bicep"))


@cache
def bicep(path: Path) -> BicepFile:
    return read_bicep(path)


def main() -> BicepFile:
    return bicep(MAIN)


def module_file(caller: BicepFile, call: Module) -> BicepFile:
    """The parsed file of a local module call."""
    return bicep((caller.path.parent / call.source).resolve())


def only_call(caller: BicepFile, source: str) -> Module:
    calls = caller.module_calls(source)
    assert len(calls) == 1, f"{caller.path.name}: expected one call of {source}, found {len(calls)}"
    return calls[0]


def only_resource(file: BicepFile, resource_type: str) -> Resource:
    found = [r for r in file.resources_of_type(resource_type) if not r.existing]
    assert len(found) == 1, f"{file.path.name}: expected one {resource_type}, found {len(found)}"
    return found[0]


# ---------------------------------------------------------------------------
# Evaluating expressions: a module's with the parameters its caller passes
# ---------------------------------------------------------------------------

CATALOGUE = ROOT / "catalogue.json"
Files = Mapping[Path, Any]
"""Content to use instead of a file's for ``loadJsonContent``, by resolved path."""
_NO_FILES: Files = {}
_NO_LOCALS: Mapping[str, Value] = {}


@dataclass(frozen=True, kw_only=True)
class Scope:
    """A Bicep file whose expressions are evaluated; its parameters take their defaults.

    ``files`` replaces the content ``loadJsonContent`` reads, e.g. another catalogue.json,
    so a test can see what a changed catalogue would deploy without editing it.
    """

    file: BicepFile
    files: Files = field(default_factory=dict)

    def argument(self, name: str) -> tuple[bool, Value]:
        """(True, value) when the file's caller passes parameter ``name``."""
        return False, None

    def evaluate(self, value: Value, local: Mapping[str, Value] = _NO_LOCALS) -> Value:
        """Literals where the Bicep makes them knowable, the expression itself otherwise.

        Parameters take what the caller passes (evaluated in the caller), else their
        default; variables, for-expressions, ``x[y]`` and the functions in ``FUNCTIONS``
        are evaluated when their inputs are known. A resource, a module output, a parameter
        without default or value stays a ``Ref``; any other call stays as it is.
        """
        if isinstance(value, list):
            return [self.evaluate(v, local) for v in value]
        if isinstance(value, dict):
            return {k: self.evaluate(v, local) for k, v in value.items()}
        if isinstance(value, Interpolation):
            parts = tuple(self.evaluate(part, local) for part in value.parts)
            if all(isinstance(part, str) for part in parts):
                return "".join(part for part in parts if isinstance(part, str))
            return Interpolation(parts)
        if isinstance(value, Loop):
            return self._loop(value, local)
        if isinstance(value, Index):
            return _index(self.evaluate(value.target, local), self.evaluate(value.index, local))
        if isinstance(value, Call):
            return self._call(value, local)
        if isinstance(value, Ref):
            return self._ref(value, local)
        return value

    def _ref(self, value: Ref, local: Mapping[str, Value]) -> Value:
        target: Value
        if value.name in local:
            target = local[value.name]
        elif value.name in self.file.params:
            param = self.file.params[value.name]
            passed, argument = self.argument(value.name)
            if passed:
                target = argument
            elif param.has_default:
                target = self.evaluate(param.default)
            else:
                return value
        elif value.name in self.file.variables:
            target = self.evaluate(self.file.variables[value.name].value)
        else:
            return value  # a resource, a module output
        for member in value.path[1:]:
            if not isinstance(target, dict) or member not in target:
                return value
            target = target[member]
        return target

    def _loop(self, loop: Loop, local: Mapping[str, Value]) -> Value:
        iterable = self.evaluate(loop.iterable, local)
        if not isinstance(iterable, list) or not loop.variables:
            return loop
        items: list[Value] = []
        for position, item in enumerate(iterable):
            inner = {**local, loop.variables[0]: item}
            if len(loop.variables) > 1:
                inner[loop.variables[1]] = position
            items.append(self.evaluate(loop.body, inner))
        return items

    def _call(self, call: Call, local: Mapping[str, Value]) -> Value:
        name = call.function.removeprefix("sys.")
        function = FUNCTIONS.get(name)
        if name == "loadJsonContent" and len(call.args) == 1:
            path = self.evaluate(call.args[0], local)
            if isinstance(path, str):
                return self._load_json(path)
        if function is None:
            return call
        args = [self.evaluate(arg, local) for arg in call.args]
        result = function(args)
        return call if result is None else result

    def _load_json(self, relative: str) -> Value:
        path = (self.file.path.parent / relative).resolve()
        content = self.files[path] if path in self.files else load_json(path)
        return _from_json(content)

    def module(self, source: str) -> Bound:
        """The module this file calls from ``source``, bound to that call."""
        call = only_call(self.file, source)
        return Bound(file=module_file(self.file, call), files=self.files, call=call, caller=self)


@dataclass(frozen=True, kw_only=True)
class Bound(Scope):
    """A module file together with the call that instantiates it."""

    call: Module
    caller: Scope

    def argument(self, name: str) -> tuple[bool, Value]:
        if name in self.call.params:
            return True, self.caller.evaluate(self.call.params[name])
        return False, None


def _index(target: Value, index: Value) -> Value:
    if isinstance(target, dict) and isinstance(index, str) and index in target:
        return target[index]
    if isinstance(target, list) and isinstance(index, int) and 0 <= index < len(target):
        return target[index]
    return Index(target, index)


def _from_json(content: object) -> Value:
    if isinstance(content, dict):
        return {str(k): _from_json(v) for k, v in content.items()}
    if isinstance(content, list):
        return [_from_json(v) for v in content]
    if content is None or isinstance(content, bool | int | str):
        return content
    return str(content)  # a float: no Bicep literal, and nothing here computes with it


def _string(args: list[Value]) -> Value:
    if len(args) == 1 and isinstance(args[0], int) and not isinstance(args[0], bool):
        return str(args[0])
    return args[0] if len(args) == 1 and isinstance(args[0], str) else None


def _concat(args: list[Value]) -> Value:
    if all(isinstance(a, list) for a in args):
        return [item for a in args if isinstance(a, list) for item in a]
    if all(isinstance(a, str) for a in args):
        return "".join(a for a in args if isinstance(a, str))
    return None


def _flatten(args: list[Value]) -> Value:
    if len(args) == 1 and isinstance(args[0], list) and all(isinstance(a, list) for a in args[0]):
        return [item for a in args[0] if isinstance(a, list) for item in a]
    return None


def _items(args: list[Value]) -> Value:
    if len(args) == 1 and isinstance(args[0], dict):
        return [{"key": k, "value": v} for k, v in sorted(args[0].items(), key=lambda kv: kv[0])]
    return None


def _union(args: list[Value]) -> Value:
    if args and all(isinstance(a, dict) for a in args):
        merged: dict[str, Value] = {}
        for a in args:
            if isinstance(a, dict):
                merged.update(a)
        return merged
    return None


FUNCTIONS: dict[str, Callable[[list[Value]], Value]] = {
    "string": _string,
    "concat": _concat,
    "flatten": _flatten,
    "items": _items,
    "union": _union,
}
"""Functions evaluated when their arguments are known (None: not evaluated)."""


def main_scope(catalogue: Any = None) -> Scope:
    """main.bicep, reading ``catalogue`` (a catalogue.json document) when one is given."""
    files: Files = {CATALOGUE.resolve(): catalogue} if catalogue is not None else _NO_FILES
    return Scope(file=main(), files=files)


def bound(source: str, catalogue: Any = None) -> Bound:
    return main_scope(catalogue).module(source)


def function_module(catalogue: Any = None) -> Bound:
    return bound("app/function.bicep", catalogue)


def function_app() -> Resource:
    return only_resource(function_module().file, "Microsoft.Web/sites")


def deployed_app_settings(catalogue: Any = None) -> dict[str, Value]:
    """The app settings of the Function App (``siteConfig.appSettings``), evaluated as far
    as the Bicep allows; with ``catalogue``, as that catalogue would deploy them."""
    api = function_module(catalogue)
    site_config = function_app().properties.get("siteConfig")
    assert isinstance(site_config, dict), "function.bicep: the site has no siteConfig"
    entries = api.evaluate(site_config.get("appSettings"))
    assert isinstance(entries, list), f"appSettings is not a known list: {entries!r}"
    settings: dict[str, Value] = {}
    for entry in entries:
        assert isinstance(entry, dict) and set(entry) == {"name", "value"}, entry
        name = entry["name"]
        assert isinstance(name, str), f"an app setting name is not known: {name!r}"
        assert name not in settings, f"app setting {name} is set twice"
        settings[name] = entry["value"]
    return settings


def as_environment(settings: dict[str, Value]) -> dict[str, str]:
    """App settings as the process sees them: unknown values become placeholders."""
    return {
        key: value if isinstance(value, str) else f"<{describe(value)}>"
        for key, value in settings.items()
    }


def describe(value: Value) -> str:
    if isinstance(value, Ref):
        return str(value)
    if isinstance(value, Call):
        return f"{value.function}(...)"
    if isinstance(value, Interpolation):
        return "".join(p if isinstance(p, str) else "${" + describe(p) + "}" for p in value.parts)
    return repr(value)


def resolve_variables(file: BicepFile, value: Value) -> Value:
    """``file.resolve`` of variables only, applied inside calls and interpolations too."""
    if isinstance(value, Call):
        return Call(value.function, tuple(resolve_variables(file, a) for a in value.args))
    if isinstance(value, Interpolation):
        return Interpolation(tuple(resolve_variables(file, p) for p in value.parts))
    if isinstance(value, list):
        return [resolve_variables(file, v) for v in value]
    if isinstance(value, dict):
        return {k: resolve_variables(file, v) for k, v in value.items()}
    return file.resolve(value, defaults=False)


def identity_output(name: str) -> Ref:
    """``<identity module>.outputs.<name>`` in main.bicep."""
    symbols = [m.symbol for m in main().modules.values() if "user-assigned-identity" in m.source]
    assert len(symbols) == 1, "main.bicep: expected one user-assigned identity module"
    return Ref((symbols[0], "outputs", name))


def walk_values(value: Value) -> Iterator[Value]:
    """The value and everything nested in it."""
    yield value
    children: list[Value] = []
    if isinstance(value, dict):
        children = list(value.values())
    elif isinstance(value, list):
        children = value
    elif isinstance(value, Call):
        children = list(value.args)
    elif isinstance(value, Interpolation):
        children = list(value.parts)
    elif isinstance(value, Loop):
        children = [value.iterable, value.body]
    elif isinstance(value, Index):
        children = [value.target, value.index]
    for child in children:
        yield from walk_values(child)


# ---------------------------------------------------------------------------
# Queues
# ---------------------------------------------------------------------------


def deployed_queues(catalogue: Any = None) -> dict[str, dict[str, Value]]:
    """Queue name -> properties, for every queue the Bicep creates (with ``catalogue``: for
    every queue it would create from that catalogue.json document)."""
    servicebus = bound("app/servicebus.bicep", catalogue)
    queues: dict[str, dict[str, Value]] = {}
    for resource in servicebus.file.resources_of_type("Microsoft.ServiceBus/namespaces/queues"):
        locals_: list[Mapping[str, Value]] = [_NO_LOCALS]
        if resource.loop is not None:
            iterable = servicebus.evaluate(resource.loop.iterable)
            assert isinstance(iterable, list), f"queue loop over {iterable!r}: not a known list"
            locals_ = [{resource.loop.variables[0]: item} for item in iterable]
        for local in locals_:
            name = servicebus.evaluate(resource.name, local)
            properties = servicebus.evaluate(resource.properties, local)
            assert isinstance(properties, dict)
            assert isinstance(name, str), f"queue name {name!r} is not known at build time"
            assert name not in queues, f"queue {name} declared twice"
            queues[name] = properties
    return queues


# ---------------------------------------------------------------------------
# Role assignments
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Grant:
    symbol: str
    role: str
    role_id: str
    scope: str
    """Symbol of the (existing) resource the role is granted on."""
    scope_type: str
    principal: str
    """The rbac.bicep parameter holding the principal id."""
    principal_type: Value
    conditional: bool
    name: Value


def rbac() -> Bound:
    return bound("app/rbac.bicep")


def grants() -> list[Grant]:
    module = rbac().file
    found: list[Grant] = []
    for resource in module.resources_of_type("Microsoft.Authorization/roleAssignments"):
        properties = resource.properties
        role_id = next(
            (
                v
                for v in walk_values(resolve_variables(module, properties.get("roleDefinitionId")))
                if isinstance(v, str) and v in ROLE_NAMES
            ),
            None,
        )
        assert role_id is not None, f"rbac.bicep {resource.symbol}: unknown role definition"
        scope = resource.body.get("scope")
        assert isinstance(scope, Ref), f"rbac.bicep {resource.symbol}: scope is not a resource"
        principal = properties.get("principalId")
        assert isinstance(principal, Ref), f"rbac.bicep {resource.symbol}: principal not a param"
        found.append(
            Grant(
                symbol=resource.symbol,
                role=ROLE_NAMES[role_id],
                role_id=role_id,
                scope=scope.name,
                scope_type=module.resources[scope.name].type,
                principal=principal.name,
                principal_type=module.resolve(properties.get("principalType")),
                conditional=resource.condition is not None,
                name=resolve_variables(module, resource.name),
            )
        )
    return found


# ---------------------------------------------------------------------------
# Other files
# ---------------------------------------------------------------------------


def load_json(path: Path) -> Any:
    return json.loads(path.read_text(encoding="utf-8"))


def load_yaml(path: Path) -> Any:
    return yaml.safe_load(path.read_text(encoding="utf-8"))


_DURATION = re.compile(r"^P(?:(?P<d>\d+)D)?(?:T(?:(?P<h>\d+)H)?(?:(?P<m>\d+)M)?(?:(?P<s>\d+)S)?)?$")


def iso_seconds(duration: object) -> int:
    """Seconds in an ISO 8601 duration of days, hours, minutes and seconds (PT1M -> 60)."""
    assert isinstance(duration, str), f"{duration!r} is not an ISO 8601 duration"
    match = _DURATION.match(duration)
    assert match is not None and duration not in ("P", "PT"), f"{duration!r} is not a duration"
    days, hours, minutes, seconds = (int(match[g] or 0) for g in ("d", "h", "m", "s"))
    return ((days * 24 + hours) * 60 + minutes) * 60 + seconds


def timespan_seconds(value: str) -> int:
    """Seconds in a .NET TimeSpan as host.json writes it (00:05:00 -> 300)."""
    days, _, clock = value.rpartition(".")
    hours, minutes, seconds = (int(part) for part in clock.split(":"))
    return (int(days or 0) * 24 + hours) * 3600 + minutes * 60 + seconds


def service_bus_emulator_port() -> int:
    """The AMQP port of local.settings.sample.json's ServiceBusConnection (5672 if unsaid)."""
    connection = load_json(LOCAL_SETTINGS)["Values"]["ServiceBusConnection"]
    match = re.search(r"Endpoint=sb://([^;/]+)", connection)
    assert match is not None, "ServiceBusConnection has no Endpoint=sb://host[:port]"
    _, _, port = match[1].partition(":")
    return int(port) if port else EMULATOR_AMQP_PORT
