"""The HTTP API described as OpenAPI 3.1. The order submission's schema is generated from
the model that validates it (`OrderSubmission`); every other body and response schema is
written here by hand, and kept true by the tests: the routes and auth levels against the
registered functions (tests/functions), the status codes against docs/contract.md
(tests/infra), and the running API against the document (schemathesis,
tests/e2e/test_api_schema.py)."""

from shared.openapi.document import document

__all__ = ["document"]
