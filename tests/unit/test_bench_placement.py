"""`bench --placement roles`: each of the app's functions runs in exactly one runtime."""

from __future__ import annotations

import pytest

from bench._placement import EVERYWHERE, app_functions, role, runtime_settings, takes_orders


@pytest.mark.parametrize("count", [1, 2, 3])
def test_roles_place_every_function_once(count: int) -> None:
    functions = app_functions()
    names = "abc"[:count]
    settings = runtime_settings("roles", names, functions)
    for spec in functions:
        running = [
            n for n in names if settings[n].get(f"AzureWebJobs.{spec.name}.Disabled") != "true"
        ]
        expected = count if spec.name in EVERYWHERE else 1
        assert len(running) == expected, (spec.name, running)
    assert [n for n in names if takes_orders(settings[n])] == ["a"]


def test_roles_are_the_pattern_s_parts() -> None:
    roles = {spec.name: role(spec) for spec in app_functions()}
    assert roles["scheduler_reply"] == roles["scheduler_nudge_high"] == "scheduler"
    assert roles["payment_agent"] == roles["shipping_agent_high"] == "agents"
    assert roles["agent_heartbeat"] == "agents"
    assert roles["submit_order_http"] == roles["supervisor"] == "front"


def test_all_turns_nothing_off_and_roles_needs_one_to_three() -> None:
    functions = app_functions()
    assert runtime_settings("all", "abcd", functions) == {}
    with pytest.raises(ValueError, match="1 to 3"):
        runtime_settings("roles", "abcd", functions)
