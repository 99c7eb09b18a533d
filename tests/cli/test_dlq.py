"""``dlq list/requeue/purge`` against the local broker, through the real SDK."""

from __future__ import annotations

import json
import socket

import pytest
from azure.servicebus import ServiceBusMessage, ServiceBusSubQueue
from azure.servicebus.aio import ServiceBusClient

from devhost.broker import Broker
from shared.cli.deadletters import decoded, requeue_copy, requeue_id
from shared.cli.errors import Exit
from shared.contract import agent_queue
from tests.broker.helpers import body_of, connect, receive_n, sender_and_receiver
from tests.cli.conftest import cli

pytestmark = pytest.mark.broker

QUEUE = agent_queue("payment")


def parked(original: str) -> ServiceBusMessage:
    """Shaped like the bus adapter's copy of a poison message."""
    return ServiceBusMessage(
        json.dumps({"orderId": f"order-{original}", "step": "charge-payment"}),
        message_id=f"poison:{original}",
        content_type="application/json",
        application_properties={
            "poisonCopyOf": original,
            "poisonReason": "unknown-order",
            "poisonDetail": f"no order order-{original}",
            "originalDeliveryCount": 1,
        },
    )


def plain(message_id: str) -> ServiceBusMessage:
    return ServiceBusMessage(
        json.dumps({"orderId": f"order-{message_id}"}),
        message_id=message_id,
        application_properties={"orderId": f"order-{message_id}"},
    )


async def dead_letter(client: ServiceBusClient, *messages: ServiceBusMessage) -> None:
    async with sender_and_receiver(client, QUEUE) as (sender, receiver):
        await sender.send_messages(list(messages))
        for message in await receive_n(receiver, len(messages)):
            await receiver.dead_letter_message(
                message, reason="poison", error_description=f"cannot handle {message.message_id}"
            )


async def test_list_requeue_and_purge_a_dead_lettered_message(broker: Broker) -> None:
    env = {"ServiceBusConnection": broker.connection_string}
    async with connect(broker.connection_string) as client:
        await dead_letter(client, parked("m-1"), plain("m-2"))

        listed = await cli("dlq", "list", "--queue", QUEUE, "--json", env=env)
        assert listed.code == Exit.OK, listed.err
        found = {m["messageId"]: m for m in json.loads(listed.out)}
        assert set(found) == {"poison:m-1", "m-2"}
        poison = found["poison:m-1"]
        assert poison["deadLetterReason"] == "poison"
        assert poison["deadLetterErrorDescription"] == "cannot handle poison:m-1"
        assert poison["applicationProperties"] == {
            "poisonCopyOf": "m-1",
            "poisonReason": "unknown-order",
            "poisonDetail": "no order order-m-1",
            "originalDeliveryCount": 1,
        }
        assert poison["bodyExcerpt"].startswith('{"orderId": "order-m-1"')

        text = await cli("dlq", "list", env=env)
        assert text.code == Exit.OK
        assert f"{QUEUE}/$DeadLetterQueue: 2 messages" in text.out
        assert "properties   poisonCopyOf=m-1 poisonReason=unknown-order" in text.out
        assert "no dead letters on: orders, scheduler, agent-replies" in text.out

        requeued = await cli("dlq", "requeue", "--queue", QUEUE, "--message-id", "m-1", env=env)
        assert requeued.code == Exit.OK, requeued.err
        sequence = poison["sequenceNumber"]
        assert f"to {QUEUE} as m-1~requeue-{sequence}" in requeued.out
        async with client.get_queue_receiver(QUEUE) as receiver:
            [back] = await receive_n(receiver, 1, timeout=3)
            await receiver.complete_message(back)
        assert back.message_id == f"m-1~requeue-{sequence}"
        assert json.loads(body_of(back))["orderId"] == "order-m-1"
        assert not back.application_properties  # the poison bookkeeping is gone
        assert back.content_type == "application/json"

        missing = await cli("dlq", "requeue", "--queue", QUEUE, "--message-id", "m-1", env=env)
        assert missing.code == Exit.NOT_FOUND
        assert "no dead-lettered message with id 'm-1'" in missing.err

        refused = await cli("dlq", "purge", "--queue", QUEUE, "--all", env=env)
        assert refused.code == Exit.USAGE
        purged = await cli("dlq", "purge", "--queue", QUEUE, "--all", "--yes", "--json", env=env)
        assert purged.code == Exit.OK, purged.err
        assert [d["messageId"] for d in json.loads(purged.out)["done"]] == ["m-2"]
        after = await cli("dlq", "list", "--queue", QUEUE, "--json", env=env)
        assert json.loads(after.out) == []


async def test_a_requeue_retried_after_a_crash_is_absorbed_by_duplicate_detection(
    broker: Broker,
) -> None:
    """A crash between send and complete: the retry sends the same id, the queue drops it."""
    env = {"ServiceBusConnection": broker.connection_string}
    async with connect(broker.connection_string) as client:
        await dead_letter(client, plain("m-3"))
        async with (
            client.get_queue_receiver(QUEUE, sub_queue=ServiceBusSubQueue.DEAD_LETTER) as dlq,
            client.get_queue_sender(QUEUE) as sender,
        ):
            [message] = await receive_n(dlq, 1)
            await sender.send_messages(requeue_copy(message, body_of(message)))
            await dlq.abandon_message(message)  # the "crash": never completed
        result = await cli("dlq", "requeue", "--queue", QUEUE, "--all", env=env)
        assert result.code == Exit.OK, result.err
        async with client.get_queue_receiver(QUEUE) as receiver:
            copies = await receive_n(receiver, 2, timeout=1)
        assert [m.message_id for m in copies] == [requeue_id("m-3", message.sequence_number)]
        properties = copies[0].application_properties or {}
        assert {decoded(k): decoded(v) for k, v in properties.items()} == {"orderId": "order-m-3"}


def test_requeue_ids_are_stable_bounded_and_do_not_grow() -> None:
    assert requeue_id("m", 5) == "m~requeue-5"
    assert requeue_id("m~requeue-5", 9) == "m~requeue-9"
    long = requeue_id("x" * 128, 12345)
    assert len(long) == 128 and long.endswith("~requeue-12345")
    assert long == requeue_id("x" * 128, 12345) != requeue_id("x" * 127 + "y", 12345)


async def test_an_unreachable_broker_exits_5_without_printing_the_key() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    connection = (
        f"Endpoint=sb://127.0.0.1:{port};SharedAccessKeyName=RootManageSharedAccessKey;"
        "SharedAccessKey=do-not-print-me;UseDevelopmentEmulator=true;"
    )
    result = await cli("dlq", "list", "--connection", connection)
    assert result.code == Exit.UNREACHABLE
    assert result.err.startswith(
        f"python -m shared.cli: error: cannot reach Service Bus at 127.0.0.1:{port}"
    )
    assert "do-not-print-me" not in result.err + result.out
