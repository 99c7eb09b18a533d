"""schemathesis against the served OpenAPI document: for a few generated requests per
operation, valid and invalid, the running system never answers 5xx, and every answer's
status code, content type and body are the ones the document declares."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis import GenerationMode
from schemathesis.checks import (
    content_type_conformance,
    not_a_server_error,
    response_schema_conformance,
    status_code_conformance,
)
from schemathesis.core.result import Ok

pytestmark = pytest.mark.e2e

EXAMPLES = 8
"""Per operation in the fast suite; the slow suite's run takes THOROUGH."""
THOROUGH = 100
CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
]


def check_every_operation(document: dict[str, Any], api: str, examples: int) -> list[str]:
    """Blocking (schemathesis calls with requests): run it off the event loop that
    serves the API."""
    schema = schemathesis.openapi.from_dict(document)
    checked = []
    for result in schema.get_all_operations():
        assert isinstance(result, Ok), result
        operation = result.ok()
        cases = operation.as_strategy() | operation.as_strategy(GenerationMode.NEGATIVE)

        @settings(
            max_examples=examples,
            deadline=None,
            database=None,
            derandomize=True,
            suppress_health_check=list(HealthCheck),
        )
        @given(case=cases)
        def call(case: schemathesis.Case[Any]) -> None:
            case.call_and_validate(base_url=api, checks=CHECKS, timeout=20)

        call()
        checked.append(operation.label)
    return checked


async def keeps_its_document(system: Any, examples: int) -> None:
    async with system.session.get(f"{system.api}/openapi.json") as response:
        document = await response.json()
    checked = await asyncio.to_thread(check_every_operation, document, system.api, examples)
    assert len(checked) == sum(len(ops) for ops in document["paths"].values())


async def test_the_api_keeps_its_openapi_document(system: Any) -> None:
    await keeps_its_document(system, EXAMPLES)


@pytest.mark.slow
async def test_the_api_keeps_its_openapi_document_over_many_examples(system: Any) -> None:
    await keeps_its_document(system, THOROUGH)
