"""At the edges, the server accepts exactly what its published document accepts, and
answers what the document says it answers (issue 27, item 2).

A client generated from the document validates before it sends: where the two disagree,
it either refuses an order the server would take or sends one it is sure of and gets a
400. Each edge input is validated with a JSON Schema validator against the request
schema of the document the running app serves; the server must answer 2xx exactly when
that validation passes, and every answer, problem+json included, must match the
response the document gives for its status.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import pytest
from jsonschema import Draft202012Validator
from referencing import Registry
from referencing.jsonschema import DRAFT202012

from tests.functions.conftest import Harness

DOCUMENT = "urn:published-openapi"
ITEM = {"sku": "SKU-1", "quantity": 2, "unitPrice": 9.5}
ORDER = {"customerId": "c-1", "items": [ITEM]}
BULK = {"action": "cancel", "filter": {"state": "Error"}, "dryRun": True}
HUGE = "1" + "0" * 400
NOT_BEFORE = "2030-01-31T00:00:00Z"


def order(**item: Any) -> bytes:
    return json.dumps({**ORDER, "items": [{**ITEM, **item}]}).encode()


def bulk(**fields: Any) -> bytes:
    return json.dumps({**BULK, **fields}).encode()


@dataclass(frozen=True)
class Operation:
    function: str
    method: str
    path: str
    pointer: str


SUBMIT = Operation("submit_order_http", "POST", "orders", "/paths/~1orders/post")
BULK_ORDERS = Operation("bulk_orders", "POST", "orders/bulk", "/paths/~1orders~1bulk/post")

EDGES: dict[str, tuple[Operation, bytes]] = {
    "quantity 0": (SUBMIT, order(quantity=0)),
    "quantity 1": (SUBMIT, order(quantity=1)),
    "quantity 1000000": (SUBMIT, order(quantity=1_000_000)),
    "quantity 1000001": (SUBMIT, order(quantity=1_000_001)),
    "quantity 2.0": (SUBMIT, order(quantity=2.0)),
    "quantity 2.5": (SUBMIT, order(quantity=2.5)),
    "quantity huge": (SUBMIT, order().replace(b'"quantity": 2', b'"quantity": ' + HUGE.encode())),
    "quantity 1e400": (SUBMIT, order().replace(b'"quantity": 2', b'"quantity": 1e400')),
    "unitPrice 1e400": (SUBMIT, order().replace(b'"unitPrice": 9.5', b'"unitPrice": 1e400')),
    "order unknown field": (SUBMIT, json.dumps({**ORDER, "colour": "red"}).encode()),
    "item unknown field": (SUBMIT, order(colour="red")),
    "order without customerId": (SUBMIT, json.dumps({"items": [ITEM]}).encode()),
    "order without items": (SUBMIT, json.dumps({"customerId": "c-1"}).encode()),
    "notBefore a date-time": (SUBMIT, json.dumps({**ORDER, "notBefore": NOT_BEFORE}).encode()),
    "notBefore a number": (SUBMIT, json.dumps({**ORDER, "notBefore": 1_900_000_000}).encode()),
    "notBefore without offset": (
        SUBMIT,
        json.dumps({**ORDER, "notBefore": NOT_BEFORE.rstrip("Z")}).encode(),
    ),
    "order empty body": (SUBMIT, b""),
    "order null": (SUBMIT, b"null"),
    "bulk limit 303": (BULK_ORDERS, bulk(limit=303)),
    "bulk limit 303.0": (BULK_ORDERS, bulk(limit=303.0)),
    "bulk limit 303.5": (BULK_ORDERS, bulk(limit=303.5)),
    "bulk limit 0": (BULK_ORDERS, bulk(limit=0)),
    "bulk limit 100001": (BULK_ORDERS, bulk(limit=100_001)),
    "bulk limit huge": (BULK_ORDERS, bulk(limit=303).replace(b"303", HUGE.encode())),
    "bulk createdTo null": (
        BULK_ORDERS,
        bulk(filter={"state": "Error", "createdTo": None}),
    ),
    "bulk createdTo only, null": (BULK_ORDERS, bulk(filter={"createdTo": None})),
    "bulk every filter field null": (
        BULK_ORDERS,
        bulk(filter={"state": None, "step": None, "customerId": None}),
    ),
    "bulk empty filter": (BULK_ORDERS, bulk(filter={})),
    "bulk createdTo a date-time": (
        BULK_ORDERS,
        bulk(filter={"createdTo": "2026-01-31T00:00:00Z"}),
    ),
    "bulk createdTo not a date": (BULK_ORDERS, bulk(filter={"createdTo": "31/01/2026"})),
    **{
        f"bulk createdFrom {text}": (BULK_ORDERS, bulk(filter={"createdFrom": text}))
        for text in (
            "2026-01-31",
            "2026-01-31T00:00:00",
            "2026-W05-1",
            "20260131",
            "2026-01-31 00:00:00Z",
            "2026-01-31T00:00Z",
            "2026-01-31T00:00:00+0100",
            "2026-01-31T24:00:00Z",
            "2026-02-30T00:00:00Z",
            "2026-01-31T00:00:60Z",
            "2026-01-31T00:00:00+24:00",
            "0000-01-31T00:00:00Z",
            "2026-01-31t00:00:00z",
            "2026-01-31T00:00:00.1234567-05:30",
            "2026-01-31T00:00:00+01:00",
        )
    },
    **{
        f"notBefore {text}": (SUBMIT, json.dumps({**ORDER, "notBefore": text}).encode())
        for text in ("2030-01-31", "20300131", "1900000000", "2030-01-31 00:00:00Z")
    },
    "bulk unknown field": (BULK_ORDERS, bulk(colour="red")),
    "bulk unknown filter field": (BULK_ORDERS, bulk(filter={"state": "Error", "colour": "red"})),
    "bulk without action": (BULK_ORDERS, json.dumps({"filter": {"state": "Error"}}).encode()),
    "bulk without filter": (BULK_ORDERS, json.dumps({"action": "cancel"}).encode()),
    "bulk empty body": (BULK_ORDERS, b""),
}


def validator(document: dict[str, Any], pointer: str) -> Draft202012Validator:
    """The document's own schema at `pointer`, its `#/components` references resolved
    in the document, and formats (date-time) checked as the server checks them."""
    registry: Registry[Any] = Registry().with_resource(
        DOCUMENT, DRAFT202012.create_resource(document)
    )
    return Draft202012Validator(
        {"$ref": f"{DOCUMENT}#{pointer}"},
        registry=registry,
        format_checker=Draft202012Validator.FORMAT_CHECKER,
    )


def at(document: dict[str, Any], pointer: str) -> Any:
    node: Any = document
    for part in pointer.split("/")[1:]:
        node = node[part.replace("~1", "/").replace("~0", "~")]
    return node


def documented_request_accepts(document: dict[str, Any], op: Operation, raw: bytes) -> bool:
    request_body = at(document, op.pointer)["requestBody"]
    if not raw:
        return not request_body.get("required", False)
    try:
        instance = json.loads(raw)
    except ValueError:
        return False
    pointer = f"{op.pointer}/requestBody/content/application~1json/schema"
    return bool(validator(document, pointer).is_valid(instance))


@pytest.fixture
async def published(harness: Harness) -> dict[str, Any]:
    response = await harness.http("openapi", "GET", "openapi.json")
    assert response.status_code == 200
    document: dict[str, Any] = json.loads(response.get_body())
    return document


@pytest.mark.parametrize("edge", EDGES)
async def test_the_server_accepts_exactly_what_the_document_accepts(
    harness: Harness, published: dict[str, Any], edge: str
) -> None:
    op, raw = EDGES[edge]
    accepted = documented_request_accepts(published, op, raw)
    response = await harness.http(op.function, op.method, op.path, raw=raw)
    status = response.status_code
    answer = response.get_body().decode()
    assert (200 <= status < 300) == accepted, f"document accepts: {accepted}; {status} {answer}"
    assert 400 <= status < 500 or accepted

    responses = at(published, op.pointer)["responses"]
    assert str(status) in responses, f"{status} is not documented"
    (media_type,) = responses[str(status)]["content"]
    assert response.mimetype == media_type
    pointer = f"{op.pointer}/responses/{status}/content/{media_type.replace('/', '~1')}/schema"
    errors = [e.message for e in validator(published, pointer).iter_errors(json.loads(answer))]
    assert errors == [], answer
