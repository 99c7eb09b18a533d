"""Argument parsing: ``orders``, ``agents`` and ``failures`` (the HTTP API) and ``dlq``
(dead-letter sub-queues).

Common options are accepted before or after the command (``orders list --json`` and
``--json orders list`` alike), because people type them wherever they remember them.
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Sequence
from typing import NoReturn

from shared.catalogue import catalogue_file, load
from shared.catalogue.derive import all_queues
from shared.cli.config import (
    API_KEY_ENV,
    API_URL_ENV,
    OPERATOR_ENV,
    PRINCIPAL_ENV,
    ROLES_ENV,
    TOKEN_ENV,
)
from shared.cli.errors import Usage
from shared.contract import Setting
from shared.domain.model import ProcessState
from shared.domain.principal import Role
from shared.domain.rfc3339 import parse_date_time

PROG = "python -m shared.cli"
ALL_QUEUES = all_queues(load(catalogue_file()))
"""Every queue of the catalogue the app runs (`CatalogueFile`, else catalogue.json)."""
MAX_PAGE_SIZE = 1000
EPILOG = (
    "exit codes: 0 ok, 1 failed or refused (e.g. 409), 2 usage, 3 not found, "
    "4 key or credentials refused, 5 API or broker unreachable"
)


class Parser(argparse.ArgumentParser):
    """Errors as one line (the entry point prints it), not usage plus a message."""

    def error(self, message: str) -> NoReturn:
        raise Usage(f"{message} (see {self.prog} --help)")


def process_state(text: str) -> str:
    """A state name in any letter case, as the API spells it."""
    for state in ProcessState:
        if state.value.lower() == text.strip().lower():
            return state.value
    allowed = ", ".join(s.value for s in ProcessState)
    raise argparse.ArgumentTypeError(f"invalid state {text!r}: choose one of {allowed}")


def _bounded(name: str, low: int, high: int | None = None) -> type[int]:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{name} must be a whole number") from None
        if value < low or (high is not None and value > high):
            upper = f" to {high}" if high is not None else " or more"
            raise argparse.ArgumentTypeError(f"{name} must be {low}{upper}, got {value}")
        return value

    parse.__name__ = name
    return parse  # type: ignore[return-value]


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"seconds must be positive, got {text!r}")
    return value


_DATE = re.compile(r"\d{4}-\d{2}-\d{2}", re.ASCII)


def moment(name: str) -> type[str]:
    """A date or an RFC 3339 date-time, as the API takes it. The API takes only the
    date-time with an offset (its document says `format: date-time`); a person types
    a date, which is sent as midnight UTC. A date-time without an offset is refused
    here rather than guessed as UTC or as this machine's zone."""

    def parse(text: str) -> str:
        given = text.strip()
        sent = f"{given}T00:00:00Z" if _DATE.fullmatch(given) else given
        try:
            parse_date_time(sent)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"{name} takes a date (2026-01-31, midnight UTC) or a date-time with an "
                f"offset (2026-01-31T09:30:00Z, 2026-01-31T09:30:00+01:00), got {text!r}"
            ) from None
        return sent

    parse.__name__ = name
    return parse  # type: ignore[return-value]


MAX_REASON = 500
"""As the API takes it (shared/functions/operator.py): refused here, not after a round trip."""


def _reason(text: str) -> str:
    if len(text) > MAX_REASON:
        raise argparse.ArgumentTypeError(f"--reason is at most {MAX_REASON} characters")
    return text


def _common(parser: argparse.ArgumentParser, suppress: bool) -> None:
    def default(value: object) -> object:
        return argparse.SUPPRESS if suppress else value

    group = parser.add_argument_group("output")
    group.add_argument(
        "--json", action="store_true", default=default(False), help="machine-readable output"
    )
    group.add_argument(
        "--timeout",
        type=_seconds,
        default=default(30.0),
        help="seconds to wait for each HTTP answer (default 30)",
    )


def _api(parser: argparse.ArgumentParser, suppress: bool) -> None:
    default = argparse.SUPPRESS if suppress else None
    group = parser.add_argument_group("operator API")
    group.add_argument(
        "--url",
        default=default,
        help=f"function app address (env {API_URL_ENV}; default http://127.0.0.1:7071)",
    )
    group.add_argument(
        "--key",
        default=default,
        help=f"admin or function key, sent as x-functions-key (prefer env {API_KEY_ENV})",
    )
    group.add_argument(
        "--operator",
        default=default,
        help=f"a name kept as a note beside who acted (env {OPERATOR_ENV}; default your login)",
    )
    group.add_argument(
        "--token",
        default=default,
        help=f"an Entra access token for the app, sent as a bearer token (prefer env {TOKEN_ENV})",
    )
    group.add_argument(
        "--principal",
        default=default,
        help=f"locally, with OperatorAuth=dev-header: act as this name (env {PRINCIPAL_ENV})",
    )
    group.add_argument(
        "--role",
        action="append",
        default=default,
        choices=[r.value for r in Role],
        help=f"with --principal: an app role it holds, repeatable (env {ROLES_ENV}; default both)",
    )


def _bus(parser: argparse.ArgumentParser, suppress: bool) -> None:
    default = argparse.SUPPRESS if suppress else None
    group = parser.add_argument_group("Service Bus")
    group.add_argument(
        "--connection",
        default=default,
        help=f"connection string (prefer env {Setting.SERVICE_BUS}; "
        "default: local.settings.json or the sample)",
    )
    group.add_argument(
        "--namespace",
        default=default,
        help=f"namespace for DefaultAzureCredential "
        f"(env {Setting.SERVICE_BUS}__fullyQualifiedNamespace)",
    )


def _leaf(
    parent: argparse._SubParsersAction[Parser], name: str, help_text: str, *, bus: bool = False
) -> Parser:
    parser = parent.add_parser(name, help=help_text, description=help_text, epilog=EPILOG)
    _common(parser, suppress=True)
    (_bus if bus else _api)(parser, suppress=True)
    return parser


def _queue_selection(parser: Parser, verb: str) -> None:
    parser.add_argument("--queue", required=True, choices=ALL_QUEUES, help="the queue")
    which = parser.add_mutually_exclusive_group(required=True)
    which.add_argument("--message-id", help=f"{verb} only the message(s) with this id")
    which.add_argument("--all", action="store_true", help=f"{verb} every dead letter")
    parser.add_argument(
        "--max",
        type=_bounded("--max", 1),
        default=1000,
        help="look at no more than this many dead letters (default 1000)",
    )


BULK_ACTIONS = ("resubmit", "cancel", "suspend", "resume", "migrate")
MAX_BULK_LIMIT = 100_000


def _bulk(commands: argparse._SubParsersAction[Parser]) -> None:
    bulk = _leaf(
        commands,
        "bulk",
        "act on every order a filter matches: shows a preview and asks first (--yes skips)",
    )
    bulk.add_argument("action", metavar="ACTION", choices=BULK_ACTIONS, help="|".join(BULK_ACTIONS))
    match = bulk.add_argument_group("filter (at least one)")
    match.add_argument("--state", type=process_state, help="e.g. Error")
    match.add_argument("--step", help="the step the order stopped at, e.g. charge-payment")
    match.add_argument("--error-code", help="as `failures` shows it, e.g. timeout")
    match.add_argument("--customer", help="a customer id")
    match.add_argument(
        "--created-from",
        metavar="WHEN",
        type=moment("--created-from"),
        help="orders created at or after: a date (midnight UTC) or a date-time with an offset",
    )
    match.add_argument(
        "--created-to",
        metavar="WHEN",
        type=moment("--created-to"),
        help="orders created before: a date (midnight UTC) or a date-time with an offset",
    )
    match.add_argument("--workflow", metavar="NAME", help="orders of this workflow")
    match.add_argument(
        "--workflow-version",
        metavar="N",
        type=_bounded("--workflow-version", 1),
        help="orders on this version of --workflow",
    )
    bulk.add_argument(
        "--to-version",
        metavar="N",
        type=_bounded("--to-version", 1),
        help="migrate only (required): the version of --workflow the orders move to",
    )
    bulk.add_argument(
        "--limit",
        type=_bounded("--limit", 1, MAX_BULK_LIMIT),
        help=f"act on at most this many orders (1-{MAX_BULK_LIMIT})",
    )
    bulk.add_argument("--dry-run", action="store_true", help="only show the preview")
    bulk.add_argument("--yes", action="store_true", help="act without asking")
    bulk.add_argument("--no-wait", action="store_true", help="return once the job is started")
    bulk.add_argument(
        "--interval", type=_seconds, default=1.0, help="seconds between progress polls (default 1)"
    )


def build_parser() -> Parser:
    parser = Parser(
        prog=PROG,
        description="Operate the order processing system from a terminal.",
        epilog=EPILOG,
    )
    _common(parser, suppress=False)
    _api(parser, suppress=False)
    _bus(parser, suppress=False)
    groups = parser.add_subparsers(
        dest="group", required=True, metavar="{orders,agents,failures,dlq}"
    )

    orders = groups.add_parser("orders", help="inspect and operate orders (HTTP API)")
    commands = orders.add_subparsers(
        dest="command",
        required=True,
        metavar="{list,show,resubmit,cancel,suspend,resume,approve,reject,bulk,watch,send-event}",
    )
    listing = _leaf(commands, "list", "list orders, optionally in one state")
    listing.add_argument("--state", type=process_state, help="e.g. Error, Pending, Processing")
    listing.add_argument(
        "--page-size",
        type=_bounded("--page-size", 1, MAX_PAGE_SIZE),
        default=100,
        help="orders per request (1-1000, default 100)",
    )
    listing.add_argument("--all", action="store_true", help="follow continuation to the end")
    listing.add_argument("--continuation", help="start from a token a previous page returned")
    show = _leaf(commands, "show", "state, steps and history of one order")
    show.add_argument("order_id", metavar="ORDER_ID")
    resubmit = _leaf(commands, "resubmit", "send orders in Error back to Pending")
    resubmit.add_argument("order_ids", metavar="ORDER_ID", nargs="+")
    cancel = _leaf(commands, "cancel", "stop orders and undo what they did; they end Cancelled")
    cancel.add_argument("order_ids", metavar="ORDER_ID", nargs="+")
    cancel.add_argument("--reason", type=_reason, help="why, recorded in the history")
    suspend = _leaf(commands, "suspend", "pause orders: nothing dispatched, no deadline counts")
    suspend.add_argument("order_ids", metavar="ORDER_ID", nargs="+")
    resume = _leaf(commands, "resume", "continue Suspended orders where they stopped")
    resume.add_argument("order_ids", metavar="ORDER_ID", nargs="+")
    send = _leaf(commands, "send-event", "send an event to an order's waiting step")
    send.add_argument("order_id", metavar="ORDER_ID")
    send.add_argument("event", metavar="EVENT", help="the event's name, e.g. review")
    send.add_argument("--event-id", required=True, help="the event's id: a repeat changes nothing")
    verdict = send.add_mutually_exclusive_group()
    verdict.add_argument("--approve", action="store_true", help='an approval: {"approved": true}')
    verdict.add_argument("--reject", action="store_true", help='an approval: {"approved": false}')
    verdict.add_argument("--data", help="the event's data, a JSON object")
    send.add_argument("--comment", type=_reason, help="with --approve or --reject")
    send.add_argument(
        "--secret", help=f"sign the event (prefer env {Setting.EVENT_SIGNING_SECRET})"
    )
    for verb in ("approve", "reject"):
        answer = _leaf(
            commands,
            verb,
            f"{verb} an order's approval as the operator (no signing secret needed)",
        )
        answer.add_argument("order_id", metavar="ORDER_ID")
        answer.add_argument(
            "--event-id", required=True, help="the answer's id: a repeat changes nothing"
        )
        answer.add_argument("--comment", type=_reason, help="why, recorded with the answer")
        answer.add_argument(
            "--event", help="the approval's event, e.g. review (default: the one it waits for)"
        )
    _bulk(commands)
    watch = _leaf(commands, "watch", "poll an order until it ends, printing each change")
    watch.add_argument("order_id", metavar="ORDER_ID")
    watch.add_argument(
        "--interval", type=_seconds, default=1.0, help="seconds between polls (default 1)"
    )
    watch.add_argument("--max-wait", type=_seconds, help="give up after this many seconds")

    agents = groups.add_parser("agents", help="agents' health; drain one for maintenance")
    agent_commands = agents.add_subparsers(
        dest="command", required=True, metavar="{list,drain,undrain}"
    )
    _leaf(agent_commands, "list", "each agent with its queue, health and drain flag")
    drain = _leaf(
        agent_commands,
        "drain",
        "no new dispatches to AGENT: its steps go to an alternative or wait, uncounted",
    )
    drain.add_argument("agent", metavar="AGENT", help="e.g. payment, shipping")
    drain.add_argument("--reason", type=_reason, help="why, shown to other operators")
    undrain = _leaf(agent_commands, "undrain", "let AGENT take new dispatches again")
    undrain.add_argument("agent", metavar="AGENT")
    failures = groups.add_parser(
        "failures",
        help="the Error orders grouped by step and error code, largest first",
        description="the Error orders grouped by step and error code, largest first",
        epilog=EPILOG,
    )
    _common(failures, suppress=True)
    _api(failures, suppress=True)

    archive = groups.add_parser(
        "archive", help="orders past their retention, moved to the archive (by day)"
    )
    archive_commands = archive.add_subparsers(dest="command", required=True, metavar="{list,show}")
    listing_day = _leaf(archive_commands, "list", "the orders archived under DAY (UTC, yyyy-mm-dd)")
    listing_day.add_argument("day", metavar="DAY", help="the day the orders finished, yyyy-mm-dd")
    listing_day.add_argument(
        "--all", action="store_true", help="follow the continuation to the day's last page"
    )
    shown = _leaf(archive_commands, "show", "one archived order, as it was when archived")
    shown.add_argument("order_id", metavar="ORDER_ID")

    flows = groups.add_parser(
        "workflows", help="the catalogue of agents and workflows: validate, list, what derives"
    )
    flow_commands = flows.add_subparsers(
        dest="command", required=True, metavar="{check,list,functions}"
    )
    check = flow_commands.add_parser(
        "check",
        help="validate a catalogue; with --against, also that it keeps every version "
        "orders still run on",
        epilog=EPILOG,
    )
    check.add_argument("--file", help="the catalogue (default: the app's, catalogue.json)")
    check.add_argument(
        "--against",
        metavar="STORAGE",
        help="the state store's storage connection string, or 'settings' for "
        f"{Setting.STORAGE} from local.settings.json or the sample",
    )
    check.add_argument("--table", help=f"state table (default: {Setting.STATE_TABLE} or Orders)")
    check.add_argument("--json", action="store_true", help="machine-readable output")
    listing = flow_commands.add_parser("list", help="each workflow version and its steps")
    listing.add_argument("--file", help="the catalogue (default: the app's, catalogue.json)")
    listing.add_argument("--json", action="store_true", help="machine-readable output")
    functions = flow_commands.add_parser(
        "functions", help="every function name the app registers (agents from the catalogue)"
    )
    functions.add_argument("--json", action="store_true", help="machine-readable output")

    dlq = groups.add_parser("dlq", help="dead-letter sub-queues (Service Bus)")
    dlq_commands = dlq.add_subparsers(dest="command", required=True, metavar="{list,requeue,purge}")
    peek = _leaf(dlq_commands, "list", "peek (never consume) dead letters", bus=True)
    peek.add_argument(
        "--queue",
        action="append",
        choices=ALL_QUEUES,
        help="a queue to look at (repeatable; default all contract queues)",
    )
    peek.add_argument(
        "--max",
        type=_bounded("--max", 1),
        default=100,
        help="dead letters shown per queue (default 100)",
    )
    peek.add_argument(
        "--excerpt",
        type=_bounded("--excerpt", 0),
        default=120,
        help="characters of each body to show (default 120)",
    )
    requeue = _leaf(dlq_commands, "requeue", "move dead letters back to their queue", bus=True)
    _queue_selection(requeue, "requeue")
    purge = _leaf(dlq_commands, "purge", "delete dead letters for good", bus=True)
    _queue_selection(purge, "purge")
    purge.add_argument("--yes", action="store_true", help="confirm: purge cannot be undone")
    return parser


def parse(argv: Sequence[str]) -> argparse.Namespace:
    return build_parser().parse_args(list(argv))
