"""Alerts and diagnostic settings in the Bicep: each rule watches what the code names, and
every rule reaches the action group the deployment's alertEmail parameter feeds.

What the rules read is checked against the code: the operator-alerts queue
(shared/contract.py), the metric names and attribute (shared/telemetry/metrics.py), the
Error state and the Supervisor's function name (the registered functions).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from shared.contract import Queue
from shared.domain.model import ProcessState
from shared.telemetry import metrics
from tests.app_functions import registered_functions
from tests.infra.bicep import Ref, Resource, Value
from tests.infra.deployment import (
    INFRA,
    Bound,
    bound,
    deployed_queues,
    load_json,
    main,
    walk_values,
)

METRIC_ALERT = "Microsoft.Insights/metricAlerts"
LOG_ALERT = "Microsoft.Insights/scheduledQueryRules"
ACTION_GROUP = "Microsoft.Insights/actionGroups"
DIAGNOSTICS = "Microsoft.Insights/diagnosticSettings"
NAMESPACE = "Microsoft.ServiceBus/namespaces"
# The workspace Application Insights writes to (monitoring.bicep), as main.bicep passes it.
WORKSPACE = Ref(("monitoring", "outputs", "logAnalyticsId"))


def _alerts() -> Bound:
    return bound("app/alerts.bicep")


def _rules() -> dict[str, Resource]:
    file = _alerts().file
    rules = file.resources_of_type(METRIC_ALERT) + file.resources_of_type(LOG_ALERT)
    return {r.symbol: r for r in rules}


def _known(module: Bound, value: Value) -> Any:
    """``value`` evaluated in ``module``, for reading as plain JSON-like data."""
    evaluated = module.evaluate(value)
    assert isinstance(evaluated, dict | list | str), f"not known at build time: {evaluated!r}"
    return evaluated


def _evaluated(resource: Resource) -> dict[str, Any]:
    properties = _known(_alerts(), resource.properties)
    assert isinstance(properties, dict)
    return properties


def _criterion(resource: Resource) -> dict[str, Any]:
    criteria = _evaluated(resource)["criteria"]
    (criterion,) = criteria["allOf"]
    assert isinstance(criterion, dict)
    return criterion


def _action_group() -> Resource:
    (group,) = [r for r in _alerts().file.resources_of_type(ACTION_GROUP) if not r.existing]
    return group


def _rule(metric_or_query: str) -> Resource:
    """The one rule whose metric name or query mentions ``metric_or_query``."""
    found = [
        rule
        for rule in _rules().values()
        if metric_or_query
        in (_criterion(rule).get("metricName") or "") + (_criterion(rule).get("query") or "")
    ]
    assert len(found) == 1, f"expected one rule on {metric_or_query}, found {len(found)}"
    return found[0]


def _dimension(criterion: dict[str, Any], name: str) -> list[Value]:
    (dimension,) = [d for d in criterion.get("dimensions", []) if d["name"] == name]
    assert dimension["operator"] == "Include"
    values = dimension["values"]
    assert isinstance(values, list)
    return values


# ---------------------------------------------------------------------------
# The action group: someone is told
# ---------------------------------------------------------------------------


def test_the_action_group_mails_the_address_the_deployment_names() -> None:
    properties = _known(_alerts(), _action_group().properties)
    assert properties["enabled"] is True
    (receiver,) = properties["emailReceivers"]
    assert receiver["emailAddress"] == Ref(("alertEmail",)), "not the main parameter's address"
    assert main().params["alertEmail"].required, "an alert with nobody to tell reaches no one"
    parameters = load_json(INFRA / "main.parameters.json")["parameters"]
    assert parameters["alertEmail"]["value"] == "${ALERT_EMAIL}"
    assert len(str(properties["groupShortName"])) <= 12


def test_there_are_the_four_rules_and_each_notifies_the_action_group() -> None:
    assert len(_rules()) == 4
    group = Ref((_action_group().symbol, "id"))
    for symbol, rule in _rules().items():
        properties = _evaluated(rule)
        assert properties["enabled"] is True, symbol
        actions = properties["actions"]
        ids = (
            [a["actionGroupId"] for a in actions]
            if isinstance(actions, list)
            else actions["actionGroups"]
        )
        assert group in ids, f"{symbol} notifies {ids}, not the action group"


def test_extra_action_groups_are_notified_by_every_rule_too() -> None:
    oncall = "/subscriptions/s/resourceGroups/r/providers/microsoft.insights/actionGroups/oncall"
    alerts = _alerts()
    params: dict[str, Value] = {**alerts.call.params, "extraActionGroupIds": [oncall]}
    body: dict[str, Value] = {**alerts.call.body, "params": params}
    call = dataclasses.replace(alerts.call, body=body)
    passing = Bound(file=alerts.file, files=alerts.files, call=call, caller=alerts.caller)
    for rule in _rules().values():
        actions = passing.evaluate(rule.properties["actions"])
        assert oncall in list(walk_values(actions)), f"{rule.symbol} leaves out the extra groups"
    assert alerts.call.params["extraActionGroupIds"] == Ref(("alertActionGroupIds",))


# ---------------------------------------------------------------------------
# What each rule watches
# ---------------------------------------------------------------------------


def _watches_the_namespace(rule: Resource) -> None:
    (scope,) = _evaluated(rule)["scopes"]
    assert isinstance(scope, Ref) and scope.path[1:] == ("id",)
    target = _alerts().file.resources[scope.name]
    assert target.type == NAMESPACE and target.existing
    assert target.name == Ref(("serviceBusNamespaceName",))
    assert _alerts().call.params["serviceBusNamespaceName"] == Ref(
        ("serviceBus", "outputs", "name")
    )


def test_an_operator_alert_raised_fires_on_any_message_arriving_on_operator_alerts() -> None:
    rule = _rule("IncomingMessages")
    criterion = _criterion(rule)
    assert _dimension(criterion, "EntityName") == [Queue.OPERATOR_ALERTS]
    assert Queue.OPERATOR_ALERTS in deployed_queues()
    assert (criterion["operator"], criterion["threshold"]) == ("GreaterThan", 0)
    assert criterion["timeAggregation"] == "Total"
    _watches_the_namespace(rule)


def test_dead_letters_on_any_queue_fire_one_alert_per_queue() -> None:
    rule = _rule("DeadletteredMessages")
    criterion = _criterion(rule)
    assert _dimension(criterion, "EntityName") == ["*"], "some queue's dead letters go unseen"
    assert (criterion["operator"], criterion["threshold"]) == ("GreaterThan", 0)
    assert criterion["timeAggregation"] == "Maximum"
    _watches_the_namespace(rule)


def _watches_the_workspace(rule: Resource) -> None:
    (scope,) = _evaluated(rule)["scopes"]
    assert scope == WORKSPACE, f"{rule.symbol} queries {scope}, not the app's workspace"


def test_orders_held_in_error_are_counted_from_the_apps_own_metric() -> None:
    rule = _rule(metrics.ORDERS_COMPLETED)
    query = _criterion(rule)["query"]
    assert isinstance(query, str), f"the query is not known at build time: {query!r}"
    assert f'Name == "{metrics.ORDERS_COMPLETED}"' in query
    assert f'Properties["{metrics.OUTCOME}"]) == "{ProcessState.ERROR.value}"' in query
    criterion = _criterion(rule)
    assert (criterion["operator"], criterion["threshold"]) == ("GreaterThan", 0)
    _watches_the_workspace(rule)


def test_the_supervisor_not_running_fires_when_neither_an_invocation_nor_a_sweep_shows() -> None:
    (supervisor,) = [
        f
        for f in registered_functions()
        if f.trigger_type == "timerTrigger"
        and "SupervisorSchedule" in str(f.trigger.get("schedule"))
    ]
    rule = _rule(metrics.SWEEP_DURATION)
    criterion = _criterion(rule)
    query = criterion["query"]
    assert isinstance(query, str)
    assert f'AppRequests | where Name == "{supervisor.name}"' in query
    assert f'AppMetrics | where Name == "{metrics.SWEEP_DURATION}"' in query
    assert query.startswith("union "), "both signals count: either one means it runs"
    assert (criterion["timeAggregation"], criterion["operator"], criterion["threshold"]) == (
        "Count",
        "LessThan",
        1,
    )
    window = _evaluated(rule)["windowSize"]
    assert window == main().params["supervisorSilence"].default
    _watches_the_workspace(rule)


# ---------------------------------------------------------------------------
# Diagnostic settings
# ---------------------------------------------------------------------------


def _diagnostics() -> Bound:
    return bound("app/diagnostics.bicep")


@pytest.mark.parametrize(
    ("resource_type", "passed"),
    [
        ("Microsoft.Web/sites", Ref(("api", "outputs", "name"))),
        (NAMESPACE, Ref(("serviceBus", "outputs", "name"))),
        ("Microsoft.Storage/storageAccounts", Ref(("storage", "outputs", "name"))),
        ("Microsoft.Storage/storageAccounts/blobServices", None),
        ("Microsoft.Storage/storageAccounts/tableServices", None),
    ],
)
def test_each_resource_sends_its_logs_and_metrics_to_the_workspace(
    resource_type: str, passed: Ref | None
) -> None:
    module = _diagnostics()
    file = module.file
    (target,) = [r for r in file.resources_of_type(resource_type) if r.existing]
    settings = [
        r
        for r in file.resources_of_type(DIAGNOSTICS)
        if r.body.get("scope") == Ref((target.symbol,))
    ]
    assert len(settings) == 1, f"{resource_type}: {len(settings)} diagnostic settings"
    properties = _known(module, settings[0].properties)
    assert properties["workspaceId"] == WORKSPACE
    assert any(m["enabled"] is True for m in properties["metrics"]), "no metrics"
    if resource_type != "Microsoft.Storage/storageAccounts":  # the account itself has no logs
        assert any(entry["enabled"] is True for entry in properties["logs"]), "no logs"
    if passed is not None:
        assert isinstance(target.name, Ref)
        assert module.call.params[target.name.name] == passed


def test_storage_reads_are_logged_only_when_asked() -> None:
    module = _diagnostics()
    logs = module.evaluate(Ref(("storageLogs",)))
    assert isinstance(logs, list)
    enabled = {entry["category"]: entry["enabled"] for entry in logs if isinstance(entry, dict)}
    assert enabled == {"StorageRead": False, "StorageWrite": True, "StorageDelete": True}
