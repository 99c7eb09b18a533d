"""Rows stored before the rule for text at the edge (issue 41) still load, archive and
filter, on real Azurite. An older version took a lone surrogate in a customer id, a
cancel reason or an approval's `by`, and stored it: the Tables SDK sends entities as
ASCII JSON (`"\\ud800"`), so the write went through, and reads give it back. What broke
was text going on in UTF-8 or in a URL: the archive's blob (`UnicodeEncodeError`, the
same page failing on every run, nothing after it archived again), a filter or a key in
a request's URL (the SDK's quoting raises). Each test plants such rows as that version
wrote them and goes where they go."""

from __future__ import annotations

import gzip
import json
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta

import pytest
from azure.data.tables.aio import TableServiceClient
from azure.storage.blob.aio import BlobServiceClient

from shared.adapters.blob_archive import BlobArchive
from shared.adapters.clock import FakeClock
from shared.adapters.table.archive import TableArchiveStore
from shared.adapters.table.bulk import TableBulkStore
from shared.adapters.table.customers import TableCustomerLedger
from shared.adapters.table.store import TableStateStore
from shared.domain.archive import RetentionPolicy
from shared.domain.bulk import BulkJob, JobState
from shared.domain.bulk_request import BulkAction, BulkFilter
from shared.domain.fairness import Admission, CustomerPolicy
from shared.domain.machine.forward import start
from shared.domain.model import HistoryEntry, OrderProcess, ProcessState, ReceivedEvent
from shared.domain.rest_index import RestRange, rest_entry
from shared.functions.archive import archived_view
from shared.settings import azurite_connection_string
from shared.usecases.history.archive import Archiver, archived_order
from shared.usecases.operations.bulk import BulkDeps, job_status, work_jobs
from tests.builders import World, an_order
from tests.workflows import CATALOGUE, ORDER_FULFILMENT

pytestmark = pytest.mark.azurite

NOW = datetime(2026, 12, 31, 12, 0, tzinfo=UTC)
OLD = NOW - timedelta(days=40)
LONE = "c-\ud800x"
"""A customer id an older version stored: a lone high surrogate, then a letter."""


@dataclass
class Parts:
    store: TableStateStore
    blobs: BlobArchive
    service: TableServiceClient


@pytest.fixture
async def parts(azurite_table_port: int, azurite_blob_port: int) -> AsyncIterator[Parts]:
    connection = azurite_connection_string(azurite_table_port, blob_port=azurite_blob_port)
    name = f"o{uuid.uuid4().hex[:20]}"
    store = TableStateStore(TableServiceClient.from_connection_string(connection), name)
    blobs = BlobArchive(
        BlobServiceClient.from_connection_string(connection), f"o{uuid.uuid4().hex[:20]}"
    )
    service = TableServiceClient.from_connection_string(connection)
    try:
        yield Parts(store, blobs, service)
    finally:
        await store.close()
        await blobs.close()
        await service.close()


async def plant(
    store: TableStateStore, order_id: str, state: ProcessState, customer: str = LONE
) -> OrderProcess:
    """A finished order as an older version stored it: lone surrogates in its customer,
    its last error (a cancel reason), an approval's `by` and a history detail."""
    order = replace(an_order(order_id), customer_id=customer)
    process = start(order, ORDER_FULFILMENT, OLD).process
    approval = ReceivedEvent("ev-1", "review", OLD, {"approved": True, "by": "\ud800x"}, "review")
    record = replace(
        process.state,
        process_state=state,
        updated_at=OLD,
        last_error="cancelled: \udfff",
        events=(approval,),
    )
    stored = replace(process, state=record)
    history = [HistoryEntry(OLD, "cancel-requested", "reason \ud800", state, 0, 0)]
    await store.create(stored, history)
    await store.put_rest(rest_entry(stored, ORDER_FULFILMENT))
    loaded = await store.load(order_id)
    assert loaded is not None and loaded.order.customer_id == customer, "stored as it was"
    return loaded


async def test_an_order_stored_with_lone_surrogates_is_archived_and_readable(
    parts: Parts,
) -> None:
    planted = await plant(parts.store, "old-1", ProcessState.PROCESSED)
    archive = TableArchiveStore(parts.store)
    archiver = Archiver(
        parts.store, archive, parts.blobs, FakeClock(NOW), "test", RetentionPolicy()
    )

    run = await archiver.run()

    assert (run.archived, run.skipped) == (1, False)
    assert await parts.store.load("old-1") is None, "its rows went: the table stays bounded"
    copy = await archived_order(archive, parts.blobs, "old-1")
    assert copy is not None
    assert copy.process.order.customer_id == LONE, "the text is kept exactly"
    assert copy.process.state.last_error == "cancelled: \udfff"
    assert copy.process.state.events == planted.state.events
    assert [h.detail for h in copy.process.history] == ["reason \ud800"]
    view = json.loads(json.dumps(archived_view(copy, CATALOGUE)))
    assert view["customerId"] == LONE and view["events"][0]["by"] == "\ud800x"
    name = await archive.pointer("old-1")
    assert name is not None
    blob = await (await parts.blobs._container.download_blob(name)).readall()
    text = gzip.decompress(blob).decode("utf-8")  # strict: zcat | jq reads it
    assert "\\ud800" in text and "\ud800" not in text


async def test_a_customer_filter_with_a_lone_surrogate_finds_its_orders(parts: Parts) -> None:
    """The bulk scan's filter, from a job stored before the rule: a value no URL can
    carry is compared after the read instead of by the service."""
    await plant(parts.store, "old-1", ProcessState.CANCELLED)
    await plant(parts.store, "old-2", ProcessState.CANCELLED, customer="c-other")
    page = await parts.store.rest_entries(RestRange(ProcessState.CANCELLED, LONE), 10, None)
    assert [e.order_id for e in page.items] == ["old-1"]
    assert (
        await parts.store.rest_entries(RestRange(ProcessState.CANCELLED, "c-\udfff"), 10, None)
    ).items == ()


async def test_a_bulk_job_stored_with_such_a_filter_acts_on_its_orders(parts: Parts) -> None:
    """A job an older version accepted: the runner pages its customer's orders and
    resubmits them, rather than fail on the filter (the scan's ValueError skipped the
    state, and the job ended having done nothing)."""
    await plant(parts.store, "old-1", ProcessState.ERROR)
    await plant(parts.store, "old-2", ProcessState.ERROR, customer="c-other")
    bulk = TableBulkStore(parts.store)
    world = World(clock=FakeClock(NOW))
    job = BulkJob(
        bulk_id="b" * 32,
        action=BulkAction.RESUBMIT,
        filter=BulkFilter(state=ProcessState.ERROR, customer_id=LONE),
        matched=1,
        created_at=NOW,
        updated_at=NOW,
        operator="ops-\udcff",
    )
    await bulk.create_job(job)
    deps = BulkDeps(replace(world.deps(), store=parts.store), bulk, 100.0)
    for _ in range(5):
        await work_jobs(deps)
    finished = await job_status(deps, job.bulk_id)
    assert (finished.state, finished.done) == (JobState.DONE, 1)
    resubmitted = await parts.store.load("old-1")
    assert resubmitted is not None
    assert resubmitted.state.process_state is ProcessState.PENDING
    other = await parts.store.load("old-2")
    assert other is not None and other.state.process_state is ProcessState.ERROR


async def test_the_customer_ledger_keys_a_lone_surrogate_without_raising(parts: Parts) -> None:
    """An order of such a customer, entering or leaving its ledger, or asked about by
    the Supervisor: its partition key goes into a URL."""
    name = f"l{uuid.uuid4().hex[:20]}"
    await parts.service.create_table(name)
    ledger = TableCustomerLedger(parts.service, name)
    policy = CustomerPolicy(max_pending=4, fair_share=2)
    entered = await ledger.enter(LONE, "old-1", NOW, policy, high=False)
    assert entered.admission is Admission.RUN
    assert await ledger.standing(LONE, "old-1") is Admission.RUN
    await ledger.leave(LONE, "old-1", policy, NOW)
    assert await ledger.standing(LONE, "old-1") is None
