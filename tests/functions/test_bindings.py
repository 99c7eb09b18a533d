"""The trigger bindings as the Functions host sees them (function_app.app.get_functions())."""

from __future__ import annotations

from collections.abc import Mapping

from shared.contract import Queue, Route, Setting, agent_queue, high_priority
from tests.app_functions import registered_functions
from tests.workflows import AGENT_QUEUES, AGENTS, ALL_QUEUES


def triggers() -> dict[str, Mapping[str, object]]:
    return {f.name: f.trigger for f in registered_functions()}


def test_http_routes_methods_and_auth_levels() -> None:
    http: dict[tuple[object, tuple[str, ...]], object] = {
        (t["route"], tuple(t["methods"])): t["authLevel"]  # type: ignore[arg-type]
        for t in triggers().values()
        if t["type"] == "httpTrigger"
    }
    assert http == {
        (Route.ORDERS, ("POST",)): "FUNCTION",
        (Route.ORDER, ("GET",)): "FUNCTION",
        (Route.ORDER_EVENT, ("POST",)): "FUNCTION",
        (Route.ORDER_APPROVAL, ("POST",)): "ADMIN",
        (Route.ORDERS, ("GET",)): "ADMIN",
        (Route.RESUBMIT, ("POST",)): "ADMIN",
        (Route.CANCEL, ("POST",)): "ADMIN",
        (Route.SUSPEND, ("POST",)): "ADMIN",
        (Route.RESUME, ("POST",)): "ADMIN",
        (Route.HEALTH, ("GET",)): "ANONYMOUS",
        (Route.OPENAPI, ("GET",)): "ANONYMOUS",
        (Route.OPS_PAGE, ("GET",)): "ADMIN",
        (Route.OPS_DATA, ("GET",)): "ADMIN",
        (Route.OPS_ORDER, ("GET",)): "ADMIN",
        (Route.AGENTS, ("GET",)): "ADMIN",
        (Route.AGENT_DRAIN, ("PUT",)): "ADMIN",
        (Route.FAILURES, ("GET",)): "ADMIN",
        (Route.WORKFLOWS, ("GET",)): "ADMIN",
        (Route.BULK, ("POST",)): "ADMIN",
        (Route.BULK_JOB, ("GET",)): "ADMIN",
        (Route.RECONCILE, ("POST",)): "ADMIN",
        (Route.ARCHIVE, ("POST",)): "ADMIN",
        (Route.ARCHIVE_DAY, ("GET",)): "ADMIN",
    }


def test_openapi_document_describes_exactly_the_registered_routes() -> None:
    from shared.openapi import document  # noqa: PLC0415

    described = {
        (path.lstrip("/"), method.upper())
        for path, operations in document()["paths"].items()
        for method in operations
    }
    registered = {
        (t["route"], method)
        for t in triggers().values()
        if t["type"] == "httpTrigger"
        for method in t["methods"]  # type: ignore[attr-defined]
    }
    assert described == registered


def test_every_consumed_queue_has_one_trigger_on_the_service_bus_connection() -> None:
    queues = [
        (t["queueName"], t["connection"])
        for t in triggers().values()
        if t["type"] == "serviceBusTrigger"
    ]
    consumed = {
        Queue.ORDERS,
        Queue.SCHEDULER,
        Queue.AGENT_REPLIES,
        *AGENT_QUEUES,
        *(high_priority(q) for q in AGENT_QUEUES),
        Queue.SCHEDULER_HIGH,
        Queue.AGENT_REPLIES_HIGH,
    }
    assert sorted(queues) == sorted((q, Setting.SERVICE_BUS) for q in consumed)
    assert consumed <= set(ALL_QUEUES)


def test_every_timer_runs_on_the_schedule_of_an_app_setting() -> None:
    timers = {n: t for n, t in triggers().items() if t["type"] == "timerTrigger"}
    assert timers == {
        "supervisor": {
            "type": "timerTrigger",
            "direction": "IN",
            "name": "timer",
            "schedule": f"%{Setting.SUPERVISOR_SCHEDULE}%",
            "runOnStartup": False,
        },
        "reconcile": {
            "type": "timerTrigger",
            "direction": "IN",
            "name": "timer",
            "schedule": f"%{Setting.RECONCILE_SCHEDULE}%",
            "runOnStartup": False,
        },
        "archive": {
            "type": "timerTrigger",
            "direction": "IN",
            "name": "timer",
            "schedule": f"%{Setting.ARCHIVE_SCHEDULE}%",
            "runOnStartup": False,
        },
        "agent_heartbeat": {
            "type": "timerTrigger",
            "direction": "IN",
            "name": "timer",
            "schedule": f"%{Setting.AGENT_HEARTBEAT_SCHEDULE}%",
            "runOnStartup": False,
        },
        "bulk_actions": {
            "type": "timerTrigger",
            "direction": "IN",
            "name": "timer",
            "schedule": f"%{Setting.BULK_ACTIONS_SCHEDULE}%",
            "runOnStartup": False,
        },
    }


def test_function_names_are_unique_and_name_their_role() -> None:
    names = [f.name for f in registered_functions()]
    assert len(names) == len(set(names))
    assert {"scheduler_nudge", "scheduler_reply", "supervisor"} <= set(names)
    assert {"inventory_agent", "payment_agent", "shipping_agent"} <= set(names)


def test_each_agent_lane_has_its_named_trigger_on_the_queue_the_scheduler_sends_to() -> None:
    bound = {
        name: t["queueName"]
        for name, t in triggers().items()
        if t["type"] == "serviceBusTrigger" and name.endswith(("_agent", "_agent_high"))
    }
    expected = {
        f"{agent.replace('-', '_')}_agent{'_high' if high else ''}": agent_queue(agent, high)
        for agent, spec in AGENTS.items()
        for high in (False, True)
    }
    assert bound == expected
