"""Argument parsing: states in any case, bounds, options on either side of the command."""

from __future__ import annotations

import pytest

from shared.cli.args import parse
from shared.cli.errors import Exit, Usage


def test_list_accepts_a_state_in_any_case_and_options_after_the_command() -> None:
    args = parse(["orders", "list", "--state", "error", "--page-size", "5", "--all", "--json"])
    assert (args.group, args.command) == ("orders", "list")
    assert (args.state, args.page_size, args.all, args.json) == ("Error", 5, True, True)


def test_common_options_also_work_before_the_command() -> None:
    args = parse(["--json", "--url", "http://h:1", "orders", "show", "o-1"])
    assert (args.json, args.url, args.order_id) == (True, "http://h:1", "o-1")
    assert parse(["orders", "show", "o-1"]).json is False


def test_an_option_after_the_command_wins_over_the_default_not_the_reverse() -> None:
    args = parse(["orders", "list", "--url", "http://late:2"])
    assert args.url == "http://late:2"
    assert args.timeout == 30.0


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["orders", "list", "--state", "Eror"], "invalid state 'Eror': choose one of Pending"),
        (["orders", "list", "--page-size", "0"], "--page-size must be 1 to 1000, got 0"),
        (["orders", "list", "--page-size", "x"], "--page-size must be a whole number"),
        (["orders", "resubmit"], "the following arguments are required: ORDER_ID"),
        (["orders", "cancel"], "the following arguments are required: ORDER_ID"),
        (["orders", "suspend"], "the following arguments are required: ORDER_ID"),
        (["orders", "resume"], "the following arguments are required: ORDER_ID"),
        (["orders", "cancel", "o-1", "--reason", "x" * 501], "--reason is at most 500"),
        (["dlq", "list", "--queue", "nope"], "invalid choice: 'nope'"),
        (["dlq", "requeue", "--queue", "orders"], "one of the arguments --message-id --all"),
        (
            ["dlq", "purge", "--queue", "orders", "--all", "--message-id", "m"],
            "not allowed with argument",
        ),
        (["orders", "watch", "o", "--interval", "-1"], "seconds must be positive"),
        ([], "required: {orders,agents,failures,dlq}"),
    ],
)
def test_bad_arguments_raise_one_line_usage_errors(argv: list[str], message: str) -> None:
    with pytest.raises(Usage) as caught:
        parse(argv)
    assert message in caught.value.message
    assert "\n" not in caught.value.message
    assert caught.value.code == Exit.USAGE


def test_dlq_defaults() -> None:
    listing = parse(["dlq", "list", "--queue", "orders", "--queue", "agent-payment"])
    assert (listing.queue, listing.max, listing.excerpt) == (["orders", "agent-payment"], 100, 120)
    requeue = parse(["dlq", "requeue", "--queue", "scheduler", "--message-id", "m-1"])
    assert (requeue.queue, requeue.message_id, requeue.all, requeue.max) == (
        "scheduler",
        "m-1",
        False,
        1000,
    )
    purge = parse(["dlq", "purge", "--queue", "scheduler", "--all"])
    assert (purge.all, purge.yes) == (True, False)
