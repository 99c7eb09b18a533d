"""Application Insights in the Bicep: identity-based ingestion, sampling, no secret out.

The app exports with the Azure Monitor OpenTelemetry distro (shared/telemetry/setup.py),
which reads the settings checked here; local auth is off on the component, so the
connection string only says where to send and the identity's role is what lets it in.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from azure.monitor.opentelemetry._constants import SUPPORTED_OTEL_SAMPLERS

from tests.infra.bicep import BicepFile, Interpolation, Module, Ref, Resource, Value
from tests.infra.deployment import (
    bicep,
    bicep_paths,
    bound,
    deployed_app_settings,
    function_module,
    grants,
    identity_output,
    main,
    module_file,
    only_call,
    walk_values,
)

CONNECTION_STRING = "APPLICATIONINSIGHTS_CONNECTION_STRING"
AUTHENTICATION_STRING = "APPLICATIONINSIGHTS_AUTHENTICATION_STRING"
SAMPLER = "OTEL_TRACES_SAMPLER"
SAMPLER_ARG = "OTEL_TRACES_SAMPLER_ARG"
COMPONENT = "Microsoft.Insights/components"
WORKSPACE = "Microsoft.OperationalInsights/workspaces"
SECRET_MEMBER = re.compile(r"connectionstring|instrumentationkey|key$|keys$", re.I)
# Samplers that follow the parent's decision: a trace kept because a span failed or the
# Supervisor recovered the order stays kept in the hops after it.
PARENT_BASED = {"parentbased_trace_id_ratio", "parentbased_always_on", "always_on"}


def _monitoring() -> BicepFile:
    return module_file(main(), only_call(main(), "app/monitoring.bicep"))


def _component_module(file: BicepFile) -> Module:
    found = [m for m in file.modules.values() if "insights/component" in m.source]
    assert len(found) == 1, "monitoring.bicep: expected one Application Insights component"
    return found[0]


def _workspace_module(file: BicepFile) -> Module:
    found = [m for m in file.modules.values() if "operational-insights/workspace" in m.source]
    assert len(found) == 1, "monitoring.bicep: expected one Log Analytics workspace"
    return found[0]


# ---------------------------------------------------------------------------
# The component
# ---------------------------------------------------------------------------


def test_application_insights_is_workspace_based_and_refuses_keys() -> None:
    file = _monitoring()
    plain = file.resources_of_type(COMPONENT)
    if plain:
        (component,) = plain
        assert component.properties.get("DisableLocalAuth") is True
        assert component.properties.get("WorkspaceResourceId") is not None
        return
    component_module = _component_module(file)
    workspace = _workspace_module(file)
    assert component_module.params.get("disableLocalAuth") is True, "local (key) auth is on"
    assert component_module.params.get("workspaceResourceId") == Ref(
        (workspace.symbol, "outputs", "resourceId")
    ), "not workspace-based, or on another workspace"


def test_the_app_reports_to_and_is_granted_on_the_component_monitoring_creates() -> None:
    created = Ref(("monitoring", "outputs", "applicationInsightsName"))
    assert only_call(main(), "app/monitoring.bicep").symbol == "monitoring"
    assert function_module().call.params["applicationInsightsName"] == created
    assert bound("app/rbac.bicep").call.params["applicationInsightsName"] == created
    output = _monitoring().outputs["applicationInsightsName"].value
    assert output == Ref((_component_module(_monitoring()).symbol, "outputs", "name"))
    for source in ("app/function.bicep", "app/rbac.bicep"):
        component = _existing_component(bound(source).file)
        assert component.name == Ref(("applicationInsightsName",)), f"{source}: another one"


def _existing_component(file: BicepFile) -> Resource:
    found = [r for r in file.resources_of_type(COMPONENT) if r.existing]
    assert len(found) == 1, f"{file.path.name}: expected one existing Application Insights"
    return found[0]


# ---------------------------------------------------------------------------
# Identity-based ingestion
# ---------------------------------------------------------------------------


def test_the_connection_string_is_the_components_own() -> None:
    component = _existing_component(function_module().file)
    assert deployed_app_settings()[CONNECTION_STRING] == Ref(
        (component.symbol, "properties", "ConnectionString")
    )


def test_ingestion_authenticates_as_the_identity_that_holds_the_publisher_role() -> None:
    """The ClientId the distro takes its ManagedIdentityCredential from, and the principal
    granted Monitoring Metrics Publisher, are the same user-assigned identity."""
    auth = deployed_app_settings()[AUTHENTICATION_STRING]
    assert isinstance(auth, Interpolation)
    assert identity_output("clientId") in auth.parts
    assert auth.literal_text.replace("=", "").split(";") in (
        ["ClientId", "AuthorizationAAD"],
        ["AuthorizationAAD", "ClientId"],
    ), f"not Authorization=AAD;ClientId=<id>: {auth}"
    rbac = bound("app/rbac.bicep")
    publisher = [
        g
        for g in grants()
        if g.role == "Monitoring Metrics Publisher" and g.principal == "appPrincipalId"
    ]
    assert len(publisher) == 1, "the app identity needs exactly one Monitoring Metrics Publisher"
    (grant,) = publisher
    assert grant.scope_type == COMPONENT and not grant.conditional
    assert grant.scope == _existing_component(rbac.file).symbol
    assert grant.principal_type == "ServicePrincipal"
    assert rbac.call.params["appPrincipalId"] == identity_output("principalId")


# ---------------------------------------------------------------------------
# Sampling
# ---------------------------------------------------------------------------


def test_sampling_is_set_from_parameters_the_distro_understands() -> None:
    settings = deployed_app_settings()
    sampler, argument = settings.get(SAMPLER), settings.get(SAMPLER_ARG)
    assert isinstance(sampler, str) and isinstance(argument, str), "sampling is not deployed"
    for file in (main(), function_module().file):
        allowed = file.params["tracesSampler"].allowed
        assert allowed, f"{file.path.name}: tracesSampler takes any string"
        unknown = set(allowed) - set(SUPPORTED_OTEL_SAMPLERS)
        assert not unknown, f"{file.path.name}: the distro falls back to 5 traces/s on {unknown}"
        assert set(allowed) <= PARENT_BASED, f"{file.path.name}: a kept order may lose hops"
    assert (
        main().params["tracesSampler"].allowed
        == function_module().file.params["tracesSampler"].allowed
    )


def test_the_default_sampling_keeps_a_share_of_orders_and_every_hop_of_a_kept_one() -> None:
    settings = deployed_app_settings()
    assert settings[SAMPLER] == "parentbased_trace_id_ratio"
    ratio = float(str(settings[SAMPLER_ARG]))
    assert 0.0 < ratio <= 1.0
    assert settings[SAMPLER] in PARENT_BASED


# ---------------------------------------------------------------------------
# Nothing secret leaves a template
# ---------------------------------------------------------------------------


def _secret_reads(value: Value) -> list[str]:
    return [
        str(v)
        for v in walk_values(value)
        if isinstance(v, Ref) and any(SECRET_MEMBER.search(m) for m in v.path[1:])
    ]


def _output_value(file: BicepFile, value: Value, depth: int = 0) -> list[Value]:
    """The value with every `module.outputs.x` replaced by that module's output, across files."""
    found: list[Value] = [file.resolve(value, defaults=False)]
    if depth > 5:
        return found
    for part in walk_values(value):
        if not isinstance(part, Ref) or len(part.path) < 3 or part.path[1] != "outputs":
            continue
        call = file.modules.get(part.name)
        if call is None or call.is_registry:
            continue
        callee = module_file(file, call)
        output = callee.outputs.get(part.path[2])
        if output is not None:
            found += _output_value(callee, output.value, depth + 1)
    return found


@pytest.mark.parametrize("path", bicep_paths(), ids=lambda p: p.name)
def test_no_output_carries_a_connection_string_or_key(path: Path) -> None:
    file = bicep(path)
    for output in file.outputs.values():
        assert not SECRET_MEMBER.search(output.name), f"output {output.name}"
        for value in _output_value(file, output.value):
            assert not _secret_reads(value), f"output {output.name} reads {_secret_reads(value)}"


def test_no_registry_module_output_read_is_a_secret() -> None:
    for path in bicep_paths():
        for member_path in bicep(path).member_paths:
            if len(member_path) >= 3 and member_path[1] == "outputs":
                assert not SECRET_MEMBER.search(member_path[2]), f"{path.name} reads {member_path}"


def test_the_connection_string_is_read_only_into_its_app_setting() -> None:
    reads = {
        (path.name, member)
        for path in bicep_paths()
        for member in bicep(path).member_paths
        if any(SECRET_MEMBER.search(m) for m in member[1:])
    }
    component = _existing_component(function_module().file)
    assert reads <= {("function.bicep", (component.symbol, "properties", "ConnectionString"))}
    others = {
        key: _secret_reads(value)
        for key, value in deployed_app_settings().items()
        if key != CONNECTION_STRING and _secret_reads(value)
    }
    assert not others, f"app settings reading secrets: {others}"
