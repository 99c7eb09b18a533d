"""Route templates: precedence, parameters, constraints, 404 and 405."""

from __future__ import annotations

import pytest

from devhost.host.routing import Matched, MethodNotAllowed, NotFound, Router, compile_route


def make_router() -> Router[str]:
    router: Router[str] = Router()
    # Registered parameter-first on purpose: order must not decide precedence.
    router.add("orders/{orderId}", ["GET"], "get_order")
    router.add("orders/{orderId}/resubmit", ["POST"], "resubmit")
    router.add("orders", ["POST"], "submit")
    router.add("orders/health", ["GET"], "health")
    router.add("health", None, "any_method")
    return router


def test_literal_segment_wins_over_parameter() -> None:
    found = make_router().match("GET", "/orders/health")
    assert isinstance(found, Matched)
    assert found.target == "health"
    assert found.params == {}


def test_parameter_is_captured_and_decoded() -> None:
    found = make_router().match("GET", "orders/ord%2D42/")
    assert isinstance(found, Matched)
    assert found.target == "get_order"
    assert found.params == {"orderId": "ord-42"}


def test_literals_are_case_insensitive() -> None:
    found = make_router().match("POST", "Orders/abc/RESUBMIT")
    assert isinstance(found, Matched)
    assert (found.target, found.params) == ("resubmit", {"orderId": "abc"})


def test_unknown_path_is_not_found() -> None:
    router = make_router()
    assert isinstance(router.match("GET", "orders/1/2/3"), NotFound)
    assert isinstance(router.match("GET", "nothing"), NotFound)


def test_known_path_wrong_method_lists_allowed_methods() -> None:
    found = make_router().match("DELETE", "orders")
    assert found == MethodNotAllowed(("POST",))


def test_a_405_allows_what_the_most_specific_route_allows() -> None:
    router = make_router()
    router.add("orders/bulk", ["POST"], "bulk")
    assert router.match("OPTIONS", "orders/bulk") == MethodNotAllowed(("POST",))
    found = router.match("GET", "orders/bulk")
    assert isinstance(found, Matched) and found.target == "get_order", "as the host routes it"


def test_route_without_methods_accepts_any() -> None:
    router = make_router()
    for method in ("GET", "PUT", "PATCH"):
        found = router.match(method, "health")
        assert isinstance(found, Matched)
        assert found.target == "any_method"


def test_method_match_falls_through_to_next_route() -> None:
    router: Router[str] = Router()
    router.add("things/{id}", ["GET"], "read")
    router.add("things/{id}", ["PUT"], "write")
    found = router.match("PUT", "things/1")
    assert isinstance(found, Matched)
    assert found.target == "write"


@pytest.mark.parametrize(
    ("template", "path", "expected"),
    [
        ("items/{id:int}", "items/42", {"id": "42"}),
        ("items/{id:int}", "items/x", None),
        (
            "items/{id:guid}",
            "items/0f8fad5b-d9cb-469f-a165-70867728950e",
            {"id": "0f8fad5b-d9cb-469f-a165-70867728950e"},
        ),
        ("items/{id:minlength(3)}", "items/ab", {"id": "ab"}),
        ("items/{id?}", "items", {}),
        ("items/{id?}", "items/7", {"id": "7"}),
        ("files/{*path}", "files/a/b/c.txt", {"path": "a/b/c.txt"}),
        ("files/{name}.{ext}", "files/report.pdf", {"name": "report", "ext": "pdf"}),
        ("{first}/{second}", "a/b", {"first": "a", "second": "b"}),
    ],
)
def test_template_forms(template: str, path: str, expected: dict[str, str] | None) -> None:
    assert compile_route(template).match(path) == expected


def test_constrained_parameter_beats_plain_parameter() -> None:
    router: Router[str] = Router()
    router.add("items/{name}", ["GET"], "by_name")
    router.add("items/{id:int}", ["GET"], "by_id")
    by_id = router.match("GET", "items/5")
    by_name = router.match("GET", "items/five")
    assert isinstance(by_id, Matched) and by_id.target == "by_id"
    assert isinstance(by_name, Matched) and by_name.target == "by_name"
