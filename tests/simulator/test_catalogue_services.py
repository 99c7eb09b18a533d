"""The services come from the catalogue: one per agent (named as the agent), with the do
and undo of every step the agent may do; operations the simulator has no hand-written
result for answer generic, deterministic results."""

from __future__ import annotations

import hashlib
import json
from collections.abc import AsyncIterator, Iterator
from typing import Any

import aiohttp
import pytest

from devhost.simulator import SimulatorServer, create_app
from devhost.simulator.services import (
    SERVICES,
    Compensation,
    DoOperation,
    ServicesError,
    services_from,
)
from shared.catalogue import DEFAULT_FILE, parse
from shared.domain.workflow import Catalogue
from tests.simulator.conftest import ORDER, SimClient
from tests.workflows import CATALOGUE

PROBLEM = "application/problem+json"
INPUTS = {"create-shipment.trackingNumber": "TRK000000000042", "charge-payment.amount": 25.0}


def _hash(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()[:16]


def _catalogue_with(
    agents: list[dict[str, Any]], workflows: list[dict[str, Any]] | None = None
) -> Catalogue:
    """The repo's catalogue plus ``agents`` (and ``workflows``), parsed (so validated)
    like the file."""
    raw = json.loads(DEFAULT_FILE.read_text(encoding="utf-8"))
    raw["agents"] += agents
    raw["workflows"] += workflows or []
    return parse(json.dumps(raw), "copy of catalogue.json")


def _agent(name: str) -> dict[str, Any]:
    return {"name": name, "serviceUrlSetting": f"{name.title().replace('-', '')}ServiceUrl"}


LOYALTY = _catalogue_with(
    [_agent("loyalty")],
    [
        {
            "name": "loyal-order",
            "version": 1,
            "steps": [
                {
                    "name": "charge-payment",
                    "agent": "payment",
                    "undo": "refund-payment",
                    "results": ["paymentId", "amount"],
                },
                {
                    "name": "award-points",
                    "agent": "loyalty",
                    "kind": "retriable",
                    "inputs": ["charge-payment.amount"],
                    "results": ["points"],
                },
            ],
        }
    ],
)

WALLET = _catalogue_with(
    [_agent("wallet")],
    [
        {
            "name": "wallet-order",
            "version": 1,
            "steps": [
                {
                    "name": "hold-funds",
                    "agent": "wallet",
                    "undo": "release-funds",
                    "results": ["holdId", "amount"],
                },
                {
                    "name": "capture-funds",
                    "agent": "wallet",
                    "undo": "void-capture",
                    "results": ["captureId"],
                },
            ],
        }
    ],
)
"""One agent doing two compensatable steps: a service with two dos and two undos."""


def _operations(found: Catalogue) -> dict[str, set[str]]:
    """What the services must offer, read from the catalogue independently."""
    expected: dict[str, set[str]] = {agent: set() for agent in found.agents}
    for workflow in found.workflows:
        for step in workflow.steps:
            for agent in step.candidates:
                expected[agent] |= {step.name} | (
                    {step.compensation} if step.compensation else set()
                )
    return expected


@pytest.fixture
def loyalty_simulator() -> Iterator[SimulatorServer]:
    with SimulatorServer(seed=1, catalogue=LOYALTY) as server:
        yield server


@pytest.fixture
async def loyal(
    loyalty_simulator: SimulatorServer, session: aiohttp.ClientSession
) -> AsyncIterator[SimClient]:
    yield SimClient(session, loyalty_simulator.url)


@pytest.fixture
def wallet(session: aiohttp.ClientSession) -> Iterator[SimClient]:
    with SimulatorServer(seed=1, services=services_from(WALLET)) as server:
        yield SimClient(session, server.url)


def test_the_services_are_exactly_the_catalogue_agents() -> None:
    found = CATALOGUE

    assert list(SERVICES) == list(found.agents)
    assert {name: set(s.operations) for name, s in SERVICES.items()} == _operations(found)
    assert {name: set(s.operations) for name, s in SERVICES.items()} == {
        "inventory": {"reserve-inventory", "release-inventory"},
        "payment": {"charge-payment", "refund-payment"},
        "payment-secondary": {"charge-payment", "refund-payment"},
        "shipping": {"create-shipment", "cancel-shipment"},
        "notifications": {"notify-customer"},
    }


async def test_the_control_api_knows_every_agent(sim: SimClient) -> None:
    faults = (await sim.request("GET", "/_sim/faults")).body
    stats = (await sim.request("GET", "/_sim/stats")).body

    assert list(faults) == list(CATALOGUE.agents)
    assert list(stats) == list(CATALOGUE.agents)


def test_an_undo_knows_the_do_it_undoes() -> None:
    wallet = services_from(WALLET)["wallet"]

    assert [op.name for op in wallet.dos] == ["hold-funds", "capture-funds"]
    undos = {op.name: op.do for op in wallet.operations.values() if isinstance(op, Compensation)}
    assert undos == {"release-funds": "hold-funds", "void-capture": "capture-funds"}


def test_operations_known_only_from_the_catalogue_take_any_payload() -> None:
    notifications = SERVICES["notifications"].operations["notify-customer"]
    payment = SERVICES["payment"].operations["charge-payment"]

    assert isinstance(notifications, DoOperation) and not notifications.needs_order
    assert isinstance(payment, DoOperation) and payment.needs_order


def test_an_undo_naming_two_dos_cannot_be_served() -> None:
    clash = _catalogue_with(
        [_agent("ledger")],
        [
            {
                "name": "one",
                "version": 1,
                "steps": [{"name": "book", "agent": "ledger", "undo": "unbook"}],
            },
            {
                "name": "two",
                "version": 1,
                "steps": [{"name": "post", "agent": "ledger", "undo": "unbook"}],
            },
        ],
    )

    with pytest.raises(ServicesError, match="unbook undoes both book and post"):
        services_from(clash)
    with pytest.raises(ServicesError):
        create_app(catalogue=clash)


def test_create_app_takes_services_or_a_catalogue_not_both() -> None:
    with pytest.raises(ValueError, match="not both"):
        create_app(services=SERVICES, catalogue=LOYALTY)


async def test_notify_customer_echoes_the_inputs_it_received(sim: SimClient) -> None:
    key = "o-1:notify-customer"

    reply = await sim.call("notifications", "notify-customer", "o-1", key, {"inputs": INPUTS})

    assert reply.status == 200
    assert reply.body == {
        "result": {"notificationId": f"notificationid-{_hash(key)}", "inputs": INPUTS}
    }


async def test_notify_customer_takes_the_order_along_and_needs_no_inputs(sim: SimClient) -> None:
    with_order = await sim.call(
        "notifications", "notify-customer", "o-1", "k-1", {"inputs": INPUTS} | ORDER
    )
    bare = await sim.call("notifications", "notify-customer", "o-2", "k-2", {})

    assert with_order.status == 200
    assert with_order.body["result"]["inputs"] == INPUTS
    assert bare.status == 200
    assert bare.body == {"result": {"notificationId": f"notificationid-{_hash('k-2')}"}}


async def test_notify_customer_is_idempotent(sim: SimClient) -> None:
    first = await sim.call("notifications", "notify-customer", "o-1", "k-1", {"inputs": INPUTS})
    again = await sim.call("notifications", "notify-customer", "o-1", "k-1", {"inputs": {}})

    assert again.body == first.body
    assert again.headers.get("Idempotent-Replayed") == "true"
    assert (await sim.effect("k-1"))["applied"] == 1


async def test_notify_customer_outcome_query(sim: SimClient) -> None:
    key = "o-1:notify-customer"
    call = await sim.call("notifications", "notify-customer", "o-1", key, {"inputs": INPUTS})

    reply = await sim.outcome("notifications", key)

    assert reply.status == 200
    assert reply.body == {"applied": True, "result": call.body["result"]}
    assert (await sim.outcome("notifications", "o-2:notify-customer")).status == 404


async def test_notify_customer_abandon(sim: SimClient) -> None:
    applied = await sim.call("notifications", "notify-customer", "o-1", "o-1:notify-customer")

    too_late = await sim.abandon("notifications", "o-1:notify-customer")
    abandoned = await sim.abandon("notifications", "o-2:notify-customer")
    after = await sim.call("notifications", "notify-customer", "o-2", "o-2:notify-customer")

    assert too_late.body == {"applied": True, "result": applied.body["result"]}
    assert abandoned.body == {"applied": False, "abandoned": True}
    assert after.status == 409
    assert after.body["code"] == "operation-abandoned"
    effect = await sim.effect("o-2:notify-customer")
    assert (effect["abandoned"], effect["applied"]) == (True, 0)


async def test_a_retriable_step_has_no_undo(sim: SimClient) -> None:
    reply = await sim.call("notifications", "cancel-notification", "o-1", "k-1", {"result": {}})

    assert reply.status == 404
    assert reply.body["code"] == "unknown-operation"


async def test_a_blocked_sku_in_a_generic_payload_is_rejected(sim: SimClient) -> None:
    await sim.put_faults("notifications", {"permanentFailureSkus": ["SKU-2"]})

    reply = await sim.call("notifications", "notify-customer", "o-1", "k-1", ORDER)

    assert reply.status == 422
    assert reply.content_type == PROBLEM
    assert reply.body["code"] == "rejected"


async def test_a_catalogue_copy_with_a_new_agent_serves_it_end_to_end(loyal: SimClient) -> None:
    key = "o-1:award-points"
    payload = {"inputs": {"charge-payment.amount": 25.0}}

    done = await loyal.call("loyalty", "award-points", "o-1", key, payload)
    again = await loyal.call("loyalty", "award-points", "o-1", key, payload)
    asked = await loyal.outcome("loyalty", key)
    abandoned = await loyal.abandon("loyalty", "o-2:award-points")
    refused = await loyal.call("loyalty", "award-points", "o-2", "o-2:award-points", payload)
    health = await loyal.request("GET", "/loyalty/health")
    faults = (await loyal.request("GET", "/_sim/faults")).body

    assert done.status == 200
    assert done.body == {"result": {"points": f"points-{_hash(key)}", "inputs": payload["inputs"]}}
    assert again.body == done.body and again.headers.get("Idempotent-Replayed") == "true"
    assert asked.body == {"applied": True, "result": done.body["result"]}
    assert abandoned.body == {"applied": False, "abandoned": True}
    assert refused.body["code"] == "operation-abandoned"
    assert health.body == {"status": "ok", "service": "loyalty"}
    assert list(faults) == [*CATALOGUE.agents, "loyalty"]


async def test_an_undo_without_undoes_falls_back_to_its_own_do(wallet: SimClient) -> None:
    hold = await wallet.call("wallet", "hold-funds", "o-1", "o-1:hold-funds", {})

    released = await wallet.call(
        "wallet", "release-funds", "o-1", "o-1:release-funds", {"result": hold.body["result"]}
    )
    voided = await wallet.call("wallet", "void-capture", "o-1", "o-1:void-capture", {})

    assert released.status == 200
    assert released.body == {"result": {"undone": True} | hold.body["result"]}
    assert (await wallet.effect("o-1:release-funds"))["undoes"] == "o-1:hold-funds"
    # The capture never applied: nothing to undo, although the hold did.
    assert voided.body == {"undone": False, "reason": "nothing-to-undo"}
    assert (await wallet.effect("o-1:void-capture"))["undoes"] == "o-1:capture-funds"
