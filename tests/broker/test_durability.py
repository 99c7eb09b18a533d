"""Restart on the same SQLite file: queued, scheduled, dead-lettered and locked messages survive."""

from __future__ import annotations

import sqlite3
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from azure.servicebus import ServiceBusMessage, ServiceBusSubQueue

from .conftest import QUEUE, BrokerFactory
from .helpers import connect, open_sender, opened, receive_n, sender_and_receiver

pytestmark = pytest.mark.broker


async def test_restart_keeps_queued_scheduled_dead_lettered_and_locked_messages(
    make_broker: BrokerFactory, tmp_path: Path
) -> None:
    db = str(tmp_path / "broker.db")
    first = make_broker(db_path=db)
    at = datetime.now(UTC) + timedelta(hours=1)
    async with (
        connect(first.connection_string) as client,
        sender_and_receiver(client, QUEUE) as (sender, receiver),
    ):
        await sender.send_messages(
            [
                ServiceBusMessage("dead", message_id="dead"),
                ServiceBusMessage("locked", message_id="locked"),
                ServiceBusMessage("waiting", message_id="waiting", application_properties={"n": 1}),
            ]
        )
        [scheduled_seq] = await sender.schedule_messages(ServiceBusMessage("scheduled"), at)
        dead, locked = await receive_n(receiver, 2)
        await receiver.dead_letter_message(dead, reason="Broken", error_description="why")
        assert str(locked) == "locked"  # left unsettled: locked when the broker stops
        before = first.stats()[QUEUE]
        assert (before["active"], before["locked"], before["scheduled"]) == (1, 1, 1)
        first.stop()

    second = make_broker(db_path=db)
    after = second.stats()[QUEUE]
    counts = (after["active"], after["locked"], after["scheduled"], after["deadLettered"])
    assert counts == (2, 0, 1, 1)
    async with connect(second.connection_string) as client:
        sender, receiver = open_sender(client, QUEUE), client.get_queue_receiver(QUEUE)
        dlq = client.get_queue_receiver(QUEUE, sub_queue=ServiceBusSubQueue.DEAD_LETTER)
        async with opened(sender, receiver, dlq):
            messages = await receive_n(receiver, 2)
            assert [str(m) for m in messages] == ["locked", "waiting"]
            assert messages[1].application_properties == {b"n": 1}
            for message in messages:
                await receiver.complete_message(message)
            [scheduled] = await receiver.peek_messages(sequence_number=scheduled_seq)
            assert str(scheduled) == "scheduled"
            assert scheduled.scheduled_enqueue_time_utc is not None
            assert abs(scheduled.scheduled_enqueue_time_utc - at) < timedelta(milliseconds=5)
            await sender.cancel_scheduled_messages(scheduled_seq)
            [dead_letter] = await receive_n(dlq, 1)
            assert dead_letter.dead_letter_reason == "Broken"
            assert dead_letter.dead_letter_error_description == "why"
            await dlq.complete_message(dead_letter)
            # Sequence numbers continue, and duplicate detection remembers ids across restarts.
            await sender.send_messages(ServiceBusMessage("waiting", message_id="waiting"))
            await sender.send_messages(ServiceBusMessage("new", message_id="new"))
            [new] = await receive_n(receiver, 1)
            assert new.sequence_number == scheduled_seq + 1
            await receiver.complete_message(new)
    stats = second.stats()[QUEUE]
    assert stats["duplicatesSuppressed"] == 1
    second.stop()
    with sqlite3.connect(db) as conn:
        assert conn.execute("SELECT COUNT(*) FROM messages").fetchone() == (0,)


async def test_sends_are_committed_before_they_are_acknowledged(
    make_broker: BrokerFactory, tmp_path: Path
) -> None:
    db = str(tmp_path / "broker.db")
    broker = make_broker(db_path=db)
    async with (
        connect(broker.connection_string) as client,
        open_sender(client, QUEUE) as sender,
    ):
        await sender.send_messages([ServiceBusMessage(f"m{i}") for i in range(10)])
        await sender.send_messages(ServiceBusMessage("last"))
        # Read through a separate connection while the broker still runs: no stop/flush needed.
        with sqlite3.connect(db) as conn:
            assert conn.execute("SELECT COUNT(*) FROM messages").fetchone() == (11,)
            mode = conn.execute("PRAGMA journal_mode").fetchone()
            assert mode == ("wal",)


async def test_completions_are_committed_before_they_are_acknowledged(
    make_broker: BrokerFactory, tmp_path: Path
) -> None:
    db = str(tmp_path / "broker.db")
    broker = make_broker(db_path=db)
    async with (
        connect(broker.connection_string) as client,
        sender_and_receiver(client, QUEUE) as (sender, receiver),
    ):
        await sender.send_messages([ServiceBusMessage(f"m{i}") for i in range(3)])
        messages = await receive_n(receiver, 3)
        assert len(messages) == 3
        for done, message in enumerate(messages, start=1):
            await receiver.complete_message(message)
            # Once the broker confirmed the completion, a crash cannot bring the message back.
            with sqlite3.connect(db) as conn:
                assert conn.execute("SELECT COUNT(*) FROM messages").fetchone() == (3 - done,)
