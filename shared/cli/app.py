"""Dispatch, and the single place where failures become a line on stderr and an exit code.

Every message passes through ``redact`` first: SDK and HTTP errors may echo what they
were given, and a key must never reach a terminal's scrollback or a CI log.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from typing import TextIO

from shared.cli import commands, workflows
from shared.cli.args import PROG, parse
from shared.cli.commands import Console
from shared.cli.config import (
    API_KEY_ENV,
    API_URL_ENV,
    TOKEN_ENV,
    ApiConfig,
    BusConfig,
    Identity,
    SettingsFile,
    api_config,
    bus_config,
    find_settings,
)
from shared.cli.errors import CliError, Exit
from shared.contract import Setting

ApiCommand = Callable[..., Awaitable[int]]

_ORDERS: dict[str, ApiCommand] = {
    "list": commands.orders_list,
    "show": commands.orders_show,
    "resubmit": commands.orders_resubmit,
    "cancel": commands.orders_cancel,
    "suspend": commands.orders_suspend,
    "resume": commands.orders_resume,
    "bulk": commands.orders_bulk,
    "watch": commands.orders_watch,
    "send-event": commands.orders_send_event,
    "approve": commands.orders_approve,
    "reject": commands.orders_reject,
}
_AGENTS: dict[str, ApiCommand] = {
    "list": commands.agents_list,
    "drain": commands.agents_drain,
    "undrain": commands.agents_undrain,
}
_DLQ: dict[str, ApiCommand] = {
    "list": commands.dlq_list,
    "requeue": commands.dlq_requeue,
    "purge": commands.dlq_purge,
}


def redact(text: str, secrets: Iterable[str | None]) -> str:
    for secret in sorted((s for s in secrets if s), key=len, reverse=True):
        text = text.replace(secret, "***")
    return text


async def run(
    argv: Sequence[str],
    out: TextIO | None = None,
    err: TextIO | None = None,
    env: Mapping[str, str] | None = None,
) -> int:
    """The whole CLI as a coroutine, so tests can drive it next to an in-process host."""
    out = out or sys.stdout
    err = err or sys.stderr
    values = os.environ if env is None else env
    secrets: list[str | None] = _flag_values(argv, ("--key", "--connection", "--secret", "--token"))
    try:
        try:
            args = parse(argv)
        except SystemExit as done:
            return int(done.code or 0)
        console = Console(out, args.json)
        config: ApiConfig | BusConfig
        if args.group == "workflows":
            return await _workflows(args, values, console)
        if args.group in ("orders", "agents", "failures", "archive"):
            settings = None if (args.url or values.get(API_URL_ENV)) else _lenient()
            identity = Identity(args.token, args.principal, args.role or ())
            config = api_config(
                args.url, args.key, args.operator, args.timeout, values, settings, identity
            )
            secrets += [config.key, config.signing_secret, config.token]
            command = _api_command(args)
        else:
            secrets += [args.connection]
            config = bus_config(args.connection, args.namespace, values)
            secrets += config.secrets
            command = _DLQ[args.command]
        return await command(args, config, console)
    except CliError as exc:
        secrets += [values.get(API_KEY_ENV), values.get(TOKEN_ENV), *_env_secrets(values)]
        print(f"{PROG}: error: {redact(exc.message, secrets)}", file=err, flush=True)
        return int(exc.code)


async def _workflows(args: argparse.Namespace, values: Mapping[str, str], console: Console) -> int:
    if args.command == "check":
        return await workflows.check(args, values, console)
    if args.command == "list":
        return await workflows.list_workflows(args, console)
    return await workflows.functions(args, console)


def _api_command(args: argparse.Namespace) -> ApiCommand:
    if args.group == "failures":
        return commands.failures
    if args.group == "archive":
        return commands.archive_list if args.command == "list" else commands.archive_show
    return (_ORDERS if args.group == "orders" else _AGENTS)[args.command]


def _flag_values(argv: Sequence[str], flags: tuple[str, ...]) -> list[str | None]:
    """Secret flag values straight from argv, so even a usage error cannot echo them."""
    found: list[str | None] = []
    for i, arg in enumerate(argv):
        name, equals, value = arg.partition("=")
        if name in flags:
            found.append(value if equals else (argv[i + 1] if i + 1 < len(argv) else None))
    return found


def _lenient() -> SettingsFile | None:
    """The settings file only picks the default port for the API: a broken one is ignored."""
    try:
        return find_settings()
    except CliError:
        return None


def _env_secrets(values: Mapping[str, str]) -> list[str]:
    connection = values.get(Setting.SERVICE_BUS)
    return list(BusConfig(connection_string=connection).secrets) if connection else []


def main(argv: Sequence[str] | None = None) -> int:
    try:
        return asyncio.run(run(sys.argv[1:] if argv is None else argv))
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted", file=sys.stderr)
        return int(Exit.INTERRUPTED)
