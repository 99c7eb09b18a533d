"""The rest index on Table Storage (shared/domain/rest_index.py): one `~rest-{state}`
partition per rest state in the state table, row key `{created day}|{order id}`. A page
is one range read of one partition; the customer filter is a property filter inside it,
so the service never walks another partition (order ids never start with `~`)."""

from __future__ import annotations

from typing import Any, Final

from azure.core import MatchConditions
from azure.core.exceptions import HttpResponseError, ResourceModifiedError, ResourceNotFoundError
from azure.data.tables import UpdateMode
from azure.data.tables.aio import TableClient

from shared.adapters.table import rows
from shared.adapters.table.errors import translated_errors
from shared.domain.model import Phase, ProcessState
from shared.domain.rest_index import RestEntry, RestPage, RestRange

PREFIX: Final = "~rest-"


def partition(state: ProcessState) -> str:
    return f"{PREFIX}{state.value}"


def entity(entry: RestEntry) -> dict[str, Any]:
    found: dict[str, Any] = {
        "PartitionKey": partition(entry.state),
        "RowKey": entry.key,
        "OrderID": entry.order_id,
        "Version": entry.version,
        "CreatedAt": entry.created_at,
        "UpdatedAt": entry.updated_at,
        "Customer": entry.customer_id,
        "Workflow": entry.workflow,
        "WorkflowVersion": entry.workflow_version,
        "CurrentStep": entry.current_step,
        "FailureCount": entry.failure_count,
        "Phase": entry.phase.value,
        "Attempt": entry.attempt,
    }
    optional = {
        "LastError": entry.last_error,
        "Step": entry.step,
        "ErrorCode": entry.error_code,
        "LockedBy": entry.locked_by,
        "CompleteBy": entry.complete_by,
    }
    found.update({k: v for k, v in optional.items() if v is not None})
    return found


def to_entry(state: ProcessState, found: Any) -> RestEntry:
    return RestEntry(
        order_id=str(found["OrderID"]),
        state=state,
        version=int(found.get("Version", 0)),
        created_at=rows.utc(found["CreatedAt"]),
        updated_at=rows.utc(found["UpdatedAt"]),
        customer_id=str(found.get("Customer") or ""),
        workflow=str(found["Workflow"]),
        workflow_version=int(found.get("WorkflowVersion", 1)),
        current_step=int(found.get("CurrentStep", 0)),
        failure_count=int(found.get("FailureCount", 0)),
        last_error=found.get("LastError"),
        step=found.get("Step"),
        error_code=found.get("ErrorCode"),
        phase=Phase(found.get("Phase") or Phase.FORWARD.value),
        attempt=int(found.get("Attempt", 0)),
        locked_by=found.get("LockedBy"),
        complete_by=rows.utc_or_none(found.get("CompleteBy")),
    )


async def put(table: TableClient, entry: RestEntry) -> None:
    with translated_errors():
        await table.upsert_entity(entity(entry), mode=UpdateMode.REPLACE)


async def drop(table: TableClient, state: ProcessState, key: str, below: int | None) -> None:
    """With `below`: a point read, then a delete conditional on that read's ETag."""
    with translated_errors(when=_gone):
        if below is None:
            await table.delete_entity(partition(state), key)
            return
        found = await table.get_entity(partition(state), key, select=["Version"])
        if int(found.get("Version", 0)) >= below:
            return
        await table.delete_entity(
            partition(state),
            key,
            etag=found.metadata["etag"],
            match_condition=MatchConditions.IfNotModified,
        )


def _gone(exc: HttpResponseError) -> bool:
    """The entry went, or changed (a newer rest wrote it) since it was read."""
    return isinstance(exc, (ResourceNotFoundError, ResourceModifiedError)) or (
        exc.status_code in (404, 412)
    )


async def read(
    table: TableClient, keys: RestRange, limit: int, continuation: str | None
) -> RestPage:
    """Pages of the service are followed until `limit` entries (a page may come back
    short or empty, with a continuation, when the customer filter skips many). A
    customer id with a lone surrogate (a bulk job's filter stored before the edge
    refused them, issue 41) cannot go into the filter's URL: its entries are compared
    as they are read instead, the same answer for more reads."""
    start, inclusive = keys.start(continuation)
    query = f"PartitionKey eq @pk and RowKey {'ge' if inclusive else 'gt'} @lo and RowKey lt @hi"
    parameters: dict[str, Any] = {"pk": partition(keys.state), "lo": start, "hi": keys.hi}
    customer = keys.customer_id
    if customer is not None and rows.in_url(customer):
        query += " and Customer eq @customer"
        parameters["customer"] = customer
    if keys.changed_since is not None:
        query += " and UpdatedAt ge @since"
        parameters["since"] = keys.changed_since
    if keys.changed_before is not None:
        query += " and UpdatedAt lt @before"
        parameters["before"] = keys.changed_before
    chosen: list[RestEntry] = []
    if limit <= 0:
        return RestPage((), None)
    with translated_errors():
        async for found in table.query_entities(
            query, parameters=parameters, results_per_page=min(limit + 1, 1000)
        ):
            entry = to_entry(keys.state, found)
            if customer is not None and entry.customer_id != customer:
                continue  # a customer no URL can name, compared here
            if len(chosen) >= limit:
                return RestPage(tuple(chosen), chosen[-1].key)
            chosen.append(entry)
    return RestPage(tuple(chosen), None)
