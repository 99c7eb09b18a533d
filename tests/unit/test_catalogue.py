"""The catalogue is validated when loaded: each broken rule is refused with an error that
names the file, the workflow, the step and the rule."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from shared.catalogue import DEFAULT_FILE, CatalogueError, load, parse
from shared.domain.workflow import StepKind

SHIPPED: dict[str, Any] = json.loads(DEFAULT_FILE.read_text(encoding="utf-8"))


def edited(change: Any) -> str:
    raw = copy.deepcopy(SHIPPED)
    change(raw)
    return json.dumps(raw)


def express(raw: dict[str, Any]) -> dict[str, Any]:
    return next(w for w in raw["workflows"] if w["name"] == "express-delivery")


def refused(text: str) -> str:
    with pytest.raises(CatalogueError) as error:
        parse(text, "my-catalogue.json")
    return str(error.value)


def test_the_shipped_catalogue_is_valid_with_its_workflows_one_default() -> None:
    known = load(DEFAULT_FILE)
    assert known.default == "order-fulfilment"
    assert set(known.names) == {
        "order-fulfilment",
        "express-delivery",
        "reviewed-order",
        "scheduled-delivery",
    }
    flow = known.get("express-delivery")
    assert flow is not None
    assert [s.kind for s in flow.steps] == [
        StepKind.COMPENSATABLE,
        StepKind.COMPENSATABLE,
        StepKind.PIVOT,
        StepKind.RETRIABLE,
    ]
    assert flow.pivot == 2
    shared_agents = known.get("order-fulfilment").agents & flow.agents  # type: ignore[union-attr]
    assert "payment" in shared_agents


def test_a_compensatable_step_after_the_pivot_is_refused() -> None:
    def move(raw: dict[str, Any]) -> None:
        steps = express(raw)["steps"]
        steps.append(
            {"name": "gift-wrap", "agent": "shipping", "kind": "compensatable", "undo": "unwrap"}
        )

    message = refused(edited(move))
    assert "my-catalogue.json: workflow express-delivery v1: step gift-wrap" in message
    assert "[rule: compensatable-after-pivot]" in message


def test_a_compensatable_step_without_an_undo_is_refused() -> None:
    def drop(raw: dict[str, Any]) -> None:
        del raw["workflows"][0]["steps"][1]["undo"]

    message = refused(edited(drop))
    assert "workflow order-fulfilment v1: step charge-payment" in message
    assert "[rule: missing-undo]" in message


def test_a_pivot_with_an_undo_is_refused() -> None:
    def add(raw: dict[str, Any]) -> None:
        express(raw)["steps"][2]["undo"] = "cancel-shipment"

    assert "[rule: undo-on-pivot]" in refused(edited(add))


def test_an_unknown_agent_is_refused() -> None:
    def rename(raw: dict[str, Any]) -> None:
        raw["workflows"][0]["steps"][0]["agent"] = "warehouse"

    message = refused(edited(rename))
    assert "step reserve-inventory: agent 'warehouse' is not declared [rule: unknown-agent]" in (
        message
    )


def test_an_input_that_names_a_later_step_is_refused() -> None:
    def forward_ref(raw: dict[str, Any]) -> None:
        express(raw)["steps"][0]["inputs"] = ["notify-customer.notificationId"]

    message = refused(edited(forward_ref))
    assert "step reserve-inventory: input 'notify-customer.notificationId'" in message
    assert "[rule: input-from-later-step]" in message


def test_an_input_of_an_undeclared_result_is_refused() -> None:
    def typo(raw: dict[str, Any]) -> None:
        express(raw)["steps"][3]["inputs"] = ["create-shipment.trackingId"]

    assert "[rule: unknown-result]" in refused(edited(typo))


def test_two_defaults_or_a_repeated_version_are_refused() -> None:
    def both(raw: dict[str, Any]) -> None:
        express(raw)["default"] = True
        raw["workflows"].append(copy.deepcopy(raw["workflows"][0]))

    message = refused(edited(both))
    assert "[rule: one-default]" in message
    assert "workflow order-fulfilment v1: declared twice [rule: unique-version]" in message


def test_a_misspelt_field_is_refused_by_the_schema_with_its_path() -> None:
    def misspell(raw: dict[str, Any]) -> None:
        raw["workflows"][0]["steps"][0]["undoo"] = "x"

    message = refused(edited(misspell))
    assert "workflows.0.steps.0.undoo" in message and "[rule: schema]" in message


def test_every_problem_is_reported_at_once() -> None:
    def two(raw: dict[str, Any]) -> None:
        raw["workflows"][0]["steps"][0]["agent"] = "nobody"
        del raw["workflows"][0]["steps"][2]["undo"]

    with pytest.raises(CatalogueError) as error:
        parse(edited(two))
    assert len(error.value.problems) == 2


def test_a_missing_file_names_the_file(tmp_path: Path) -> None:
    with pytest.raises(CatalogueError, match=r"nothing-here\.json: cannot read"):
        load(tmp_path / "nothing-here.json")


def test_the_newest_version_is_the_one_new_orders_start_on() -> None:
    def v2(raw: dict[str, Any]) -> None:
        newer = copy.deepcopy(raw["workflows"][0])
        newer["version"] = 2
        newer["default"] = False
        raw["workflows"].append(newer)

    known = parse(edited(v2))
    assert known.default_workflow().version == 2
    assert known.get("order-fulfilment", 1) is not None


def reviewed(raw: dict[str, Any]) -> dict[str, Any]:
    return next(w for w in raw["workflows"] if w["name"] == "reviewed-order")


def test_an_event_step_without_its_event_or_with_an_agent_is_refused() -> None:
    def broken(raw: dict[str, Any]) -> None:
        review = reviewed(raw)["steps"][1]
        del review["event"]
        review["agent"] = "payment"

    message = refused(edited(broken))
    assert "workflow reviewed-order v1: step manual-review" in message
    assert "[rule: missing-event]" in message and "[rule: agent-on-wait]" in message


def test_a_timer_without_a_time_and_an_unknown_order_field_are_refused() -> None:
    def no_time(raw: dict[str, Any]) -> None:
        del next(w for w in raw["workflows"] if w["name"] == "scheduled-delivery")["steps"][2][
            "until"
        ]

    assert "[rule: missing-time]" in refused(edited(no_time))

    def unknown(raw: dict[str, Any]) -> None:
        flow = next(w for w in raw["workflows"] if w["name"] == "scheduled-delivery")
        flow["steps"][2]["until"] = "shipDate"

    assert "until 'shipDate' is not an order time (notBefore)" in refused(edited(unknown))


def test_a_wait_that_compensates_after_the_pivot_is_refused() -> None:
    def late_review(raw: dict[str, Any]) -> None:
        express(raw)["steps"].append(
            {"name": "confirm", "kind": "event", "event": "confirm", "onDeadline": "compensate"}
        )

    assert "[rule: compensate-after-pivot]" in refused(edited(late_review))


def test_a_final_deadline_goes_with_alert_only() -> None:
    def mismatch(raw: dict[str, Any]) -> None:
        reviewed(raw)["steps"][1]["finalDeadlineSeconds"] = 172800

    assert "[rule: final-deadline]" in refused(edited(mismatch))

    def fine(raw: dict[str, Any]) -> None:
        review = reviewed(raw)["steps"][1]
        review["onDeadline"] = "alert"
        review["finalDeadlineSeconds"] = 172800

    flow = parse(edited(fine)).get("reviewed-order")
    assert flow is not None and flow.steps[1].final_deadline_seconds == 172800


def test_an_agent_steps_wait_field_is_refused() -> None:
    def stray(raw: dict[str, Any]) -> None:
        raw["workflows"][0]["steps"][0]["event"] = "review"

    assert "takes no event [rule: wait-field]" in refused(edited(stray))
