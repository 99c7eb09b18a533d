"""The Bicep reader (tests/infra/bicep.py), on small sources and on the repo's own files."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.infra.bicep import Call, Expr, Interpolation, Loop, Ref, parse_bicep
from tests.infra.deployment import INFRA, ROOT, bicep, bicep_paths, main

SAMPLE = """
targetScope = 'subscription'

@minLength(1)
@description('Name of the environment.')
param environmentName string

@allowed([
  'Standard'
  'Premium'
])
param sku string = 'Standard'

@minValue(40)
param count int = 100
param enabled bool = false
param optional string?
param names string[] = [
  'a'
  'b'
]

var prefix = 'rg-'
var settings = {
  nested: {
    value: count
  }
  'quoted-key': 'it\\'s'
}
var text = '''
two
lines'''

resource rg 'Microsoft.Resources/resourceGroups@2021-04-01' = {
  name: '${prefix}${environmentName}'
  location: 'westeurope'
  tags: { 'azd-env-name': environmentName }
}

module child 'app/child.bicep' = if (enabled) {
  name: 'child'
  scope: rg
  params: {
    names: names
    id: guid(rg.id, environmentName)
  }
}

module avm 'br/public:avm/res/x/y:1.2.3' = {
  name: 'avm'
  scope: rg
}

output groupName string = rg.name
output childValue string = child.outputs.value
output all array = [for (item, i) in names: '${item}-${i}']
"""

CHILD = """
param names string[]

resource sb 'Microsoft.ServiceBus/namespaces@2024-01-01' existing = {
  name: 'sb'
}

resource queues 'Microsoft.ServiceBus/namespaces/queues@2024-01-01' = [for name in names: {
  parent: sb
  name: name
  properties: {
    lockDuration: 'PT1M'
    maxDeliveryCount: -1
    ratio: enabled ? 1 : 2
  }
}]

resource site 'Microsoft.Web/sites@2024-04-01' = {
  name: 'app'
  resource settings 'config' = {
    name: 'appsettings'
    properties: {
      A__b: 'c' // trailing comment
    }
  }
}
"""


def test_reads_target_scope_params_and_their_decorators() -> None:
    file = parse_bicep(SAMPLE)
    assert file.target_scope == "subscription"
    env = file.params["environmentName"]
    assert env.type == "string" and env.required and not env.has_default
    assert env.description == "Name of the environment."
    assert env.bound("minLength") == 1
    sku = file.params["sku"]
    assert sku.default == "Standard" and not sku.required
    assert sku.allowed == ["Standard", "Premium"]
    assert file.params["count"].default == 100 and file.params["count"].bound("minValue") == 40
    assert file.params["enabled"].default is False
    assert file.params["optional"].nullable and not file.params["optional"].required
    assert file.params["names"].default == ["a", "b"]


def test_reads_variables_strings_and_escapes() -> None:
    file = parse_bicep(SAMPLE)
    assert file.variables["prefix"].value == "rg-"
    assert file.variables["settings"].value == {
        "nested": {"value": Ref(("count",))},
        "quoted-key": "it's",
    }
    assert file.variables["text"].value == "two\nlines"


def test_reads_resources_with_interpolations() -> None:
    file = parse_bicep(SAMPLE)
    rg = file.resources["rg"]
    assert (rg.type, rg.api_version, rg.existing, rg.condition) == (
        "Microsoft.Resources/resourceGroups",
        "2021-04-01",
        False,
        None,
    )
    assert rg.name == Interpolation((Ref(("prefix",)), Ref(("environmentName",))))
    assert rg.body["tags"] == {"azd-env-name": Ref(("environmentName",))}


def test_reads_module_calls_with_condition_and_params() -> None:
    file = parse_bicep(SAMPLE)
    child = file.modules["child"]
    assert child.source == "app/child.bicep" and not child.is_registry
    assert child.condition == Ref(("enabled",))
    assert child.params["names"] == Ref(("names",))
    assert child.params["id"] == Call("guid", (Ref(("rg", "id")), Ref(("environmentName",))))
    assert file.modules["avm"].is_registry and file.modules["avm"].params == {}


def test_reads_outputs_and_loops() -> None:
    file = parse_bicep(SAMPLE)
    assert file.outputs["groupName"].value == Ref(("rg", "name"))
    assert file.outputs["childValue"].value == Ref(("child", "outputs", "value"))
    loop = file.outputs["all"].value
    assert isinstance(loop, Loop)
    assert loop.variables == ("item", "i") and loop.iterable == Ref(("names",))
    assert loop.body == Interpolation((Ref(("item",)), "-", Ref(("i",))))


def test_resolves_variables_and_parameter_defaults() -> None:
    file = parse_bicep(SAMPLE)
    assert file.resolve(Ref(("settings", "nested", "value"))) == 100
    assert file.resolve(Ref(("settings",)), defaults=False) == {
        "nested": {"value": Ref(("count",))},
        "quoted-key": "it's",
    }
    assert file.resolve(Ref(("environmentName",))) == Ref(("environmentName",))
    assert file.resolve(Ref(("rg", "name"))) == Ref(("rg", "name"))


def test_reads_loops_existing_and_nested_child_resources() -> None:
    file = parse_bicep(CHILD)
    assert file.resources["sb"].existing
    queues = file.resources["queues"]
    assert queues.type == "Microsoft.ServiceBus/namespaces/queues"
    assert queues.parent == "sb"
    assert queues.loop is not None and queues.loop.variables == ("name",)
    assert queues.loop.iterable == Ref(("names",))
    assert queues.name == Ref(("name",))
    assert queues.properties["lockDuration"] == "PT1M"
    assert queues.properties["maxDeliveryCount"] == -1
    assert isinstance(queues.properties["ratio"], Expr)
    settings = file.resources["settings"]
    assert (settings.type, settings.api_version, settings.parent) == (
        "Microsoft.Web/sites/config",
        "2024-04-01",
        "site",
    )
    assert settings.properties == {"A__b": "c"}


def test_finds_references_undeclared_names_and_called_functions() -> None:
    file = parse_bicep(CHILD)
    assert "enabled" in file.references and (14, "enabled") in file.undeclared
    assert [name for _, name in file.undeclared] == ["enabled"], "loop variables are in scope"
    sample = parse_bicep(SAMPLE)
    assert sample.undeclared == []
    assert {"guid"} <= sample.functions
    assert ("child", "outputs", "value") in sample.member_paths
    unused = (set(sample.params) | set(sample.variables)) - sample.references
    assert unused == {"sku", "optional", "settings", "text"}


def test_reports_syntax_errors() -> None:
    broken = parse_bicep("param x string = \nresource r 'A/b@1' = {\n  name: 'x'\n")
    assert broken.problems, "an unclosed object is an error"
    assert parse_bicep(SAMPLE).problems == []


# ---------------------------------------------------------------------------
# The repo's own files
# ---------------------------------------------------------------------------


def _relative(path: Path) -> str:
    return str(path.relative_to(ROOT))


def test_the_repo_has_the_expected_bicep_files() -> None:
    assert {_relative(p) for p in bicep_paths()} == {
        "infra/main.bicep",
        "infra/app/alerts.bicep",
        "infra/app/diagnostics.bicep",
        "infra/app/function.bicep",
        "infra/app/monitoring.bicep",
        "infra/app/rbac.bicep",
        "infra/app/servicebus.bicep",
        "infra/app/storage.bicep",
    }


@pytest.mark.parametrize("path", bicep_paths(), ids=_relative)
def test_every_bicep_file_parses_without_errors(path: Path) -> None:
    problems = bicep(path).problems
    assert not problems, (
        f"{_relative(path)} does not parse at {[(p.line, p.column, p.text) for p in problems]} "
        "(note: the grammar reads a string literal starting with // as a comment)"
    )


@pytest.mark.parametrize("path", bicep_paths(), ids=_relative)
def test_every_name_read_is_declared_and_every_declaration_is_read(path: Path) -> None:
    file = bicep(path)
    assert not file.undeclared, f"{_relative(path)} reads undeclared names: {file.undeclared}"
    unused = sorted((set(file.params) | set(file.variables)) - file.references)
    assert not unused, f"{_relative(path)} declares but never reads {unused}"


@pytest.mark.parametrize("path", bicep_paths(), ids=_relative)
def test_every_parameter_is_described(path: Path) -> None:
    file = bicep(path)
    bare = sorted(name for name, param in file.params.items() if not param.description)
    assert not bare, f"{_relative(path)}: add @description to {bare}"


def test_reads_the_main_template() -> None:
    file = main()
    assert file.path == INFRA / "main.bicep"
    assert file.target_scope == "subscription"
    assert [r.type for r in file.resources.values()] == ["Microsoft.Resources/resourceGroups"]
    assert {m.source for m in file.modules.values() if not m.is_registry} == {
        "app/alerts.bicep",
        "app/diagnostics.bicep",
        "app/function.bicep",
        "app/monitoring.bicep",
        "app/rbac.bicep",
        "app/servicebus.bicep",
        "app/storage.bicep",
    }
    assert all(m.body.get("scope") == Ref(("rg",)) for m in file.modules.values())
