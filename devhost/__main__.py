"""``python -m devhost``: the local Functions runtime in the foreground.

Stands in for ``func start`` (Core Tools cannot be installed here): settings, local
services, app indexing, then HTTP, timer and Service Bus triggers until Ctrl-C or
SIGTERM. Subcommands are registered in ``SUBCOMMANDS``; ``run`` is the default, so
``python -m devhost --fresh`` and ``python -m devhost run --fresh`` are the same.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import logging
import os
import signal
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING

from devhost.host import FunctionSpec, HostConfig, LoadError, LocalHost, load_app
from devhost.host.http import HttpStartError
from devhost.host.servicebus import ServiceBusConfigError
from devhost.host.timers import ScheduleError
from devhost.host.tracing import flush_exports
from devhost.instances import extra_instances, stop_all
from devhost.services import (
    OTLP_DEFAULT_PORT,
    Services,
    ServiceStartError,
    plan,
    telemetry_settings,
    wipe_state,
)
from devhost.settings import LocalSettings, SettingsError, apply_to_environ, load_settings
from shared.telemetry.logsafe import make_handlers_safe

if TYPE_CHECKING:
    from devhost.demo import Target

log = logging.getLogger("devhost")

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_PORT = 7071
SERVICE_WATCH_SECONDS = 2.0
DRAIN_TIMEOUT = 4.0
"""Ctrl-C or SIGTERM ends the runtime within 10 s: intake stops, running invocations get
this long, then clients close. A cut invocation's message is abandoned and redelivered,
which every handler tolerates (a crash does the same)."""
# Problems a developer fixes by editing config or starting something: no traceback.
USER_ERRORS = (
    SettingsError,
    LoadError,
    ServiceStartError,
    HttpStartError,
    ServiceBusConfigError,
    ScheduleError,
)
APP_BOOTSTRAP_MODULE = "shared.bootstrap"
SIGNALS = (signal.SIGINT, signal.SIGTERM)
MAX_INSTANCES = 8
NOISY_LOGGERS = ("azure", "uamqp", "azure.servicebus._pyamqp", "azure.identity")


@dataclass(frozen=True)
class Subcommand:
    """A ``python -m devhost <name>`` entry: add its options, then run it."""

    help: str
    configure: Callable[[argparse.ArgumentParser], None]
    handler: Callable[[argparse.Namespace], int]


def add_run_options(parser: argparse.ArgumentParser, *, inherit: bool = False) -> None:
    """Options shared by ``run`` and anything else that brings the runtime up.

    With ``inherit`` (for subcommand parsers) nothing has a default, so
    ``python -m devhost --fresh run`` keeps the ``--fresh`` given before the
    subcommand instead of argparse resetting it from the subparser's defaults.
    """

    def default(value: object) -> object:
        return argparse.SUPPRESS if inherit else value

    parser.add_argument(
        "--fresh",
        action="store_true",
        default=default(False),
        help="forget Azurite, broker, simulator and trace data first",
    )
    parser.add_argument(
        "--state-dir",
        type=Path,
        default=default(None),
        help="emulator state (default: <root>/.devhost)",
    )
    parser.add_argument(
        "--port",
        type=int,
        default=default(None),
        help=f"HTTP port (default: Host.LocalHttpPort or {DEFAULT_PORT}; 0 picks one)",
    )
    parser.add_argument(
        "--no-services",
        action="store_true",
        default=default(False),
        help="do not start Azurite, broker, simulator or OTLP receiver",
    )
    parser.add_argument(
        "--otlp-port",
        type=int,
        default=default(OTLP_DEFAULT_PORT),
        help=(
            "port of the local OTLP receiver, used unless OTEL_EXPORTER_OTLP_ENDPOINT is set "
            f"(default {OTLP_DEFAULT_PORT})"
        ),
    )
    parser.add_argument(
        "--instances",
        type=_instances,
        default=default(1),
        help=(
            "runtime processes competing for the same queues and table, as Azure's "
            "instances do (default 1); the others serve HTTP on free ports"
        ),
    )
    parser.add_argument(
        "--root",
        type=Path,
        default=default(REPO_ROOT),
        help="project root holding function_app.py",
    )
    parser.add_argument(
        "--drain-timeout",
        type=float,
        default=default(DRAIN_TIMEOUT),
        help=f"seconds running invocations get to finish at shutdown (default {DRAIN_TIMEOUT:g})",
    )
    parser.add_argument(
        "-v", "--verbose", action="store_true", default=default(False), help="debug logging"
    )


def _instances(text: str) -> int:
    count = int(text)
    if not 1 <= count <= MAX_INSTANCES:
        raise argparse.ArgumentTypeError(f"must be 1 to {MAX_INSTANCES}")
    return count


def add_subcommand_run_options(parser: argparse.ArgumentParser) -> None:
    add_run_options(parser, inherit=True)


def run_command(args: argparse.Namespace) -> int:
    return asyncio.run(serve(args))


# Another command (e.g. ``demo``) registers here. Its parser already inherits the
# top-level run options; ``add_subcommand_run_options`` and ``running_host`` give it a
# live runtime without duplicating the startup.
def add_demo_options(parser: argparse.ArgumentParser) -> None:
    add_subcommand_run_options(parser)
    parser.add_argument("--orders", type=int, default=200, help="orders to submit (default 200)")
    parser.add_argument("--seed", type=int, default=7, help="seed of the order mix")
    parser.add_argument(
        "--keep", action="store_true", help="leave the runtime running if the demo started it"
    )
    parser.add_argument(
        "--timeout", type=float, default=300, help="seconds to wait for every order to finish"
    )


def demo_command(args: argparse.Namespace) -> int:
    from devhost.demo import main as run_demo  # noqa: PLC0415 - rich loads only for the demo

    if args.orders < 1:
        raise SystemExit("--orders must be at least 1")
    return run_demo(
        orders=args.orders,
        seed=args.seed,
        fresh=getattr(args, "fresh", False),
        keep=args.keep,
        timeout=args.timeout,
        target=demo_target(args),
    )


def demo_target(args: argparse.Namespace) -> Target:
    """The runtime the demo talks to: ``--port`` and ``--state-dir`` are passed to the one it
    starts; the run options it cannot honour are refused rather than ignored."""
    from devhost.demo import Target  # noqa: PLC0415

    refused = [
        option
        for option, given in (
            ("--no-services", getattr(args, "no_services", False)),
            ("--instances", getattr(args, "instances", 1) != 1),
            ("--root", getattr(args, "root", REPO_ROOT) != REPO_ROOT),
            ("--otlp-port", getattr(args, "otlp_port", OTLP_DEFAULT_PORT) != OTLP_DEFAULT_PORT),
        )
        if given
    ]
    if refused:
        raise SystemExit(
            f"python -m devhost demo does not take {', '.join(refused)}: it runs one runtime "
            "of this project with its services on their usual ports (start it yourself with "
            "python -m devhost and those options, then run the demo against its --port)"
        )
    port = getattr(args, "port", None)
    if port == 0:
        raise SystemExit("python -m devhost demo needs a known --port (0 picks one at random)")
    return Target(port=port or DEFAULT_PORT, state_dir=getattr(args, "state_dir", None))


SUBCOMMANDS: dict[str, Subcommand] = {
    "run": Subcommand("run the app locally (default)", add_subcommand_run_options, run_command),
    "demo": Subcommand(
        "run a demo load against the runtime (started if needed) with faults switched on",
        add_demo_options,
        demo_command,
    ),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m devhost",
        description="Run the Function App locally with its emulators (Core Tools stand-in).",
    )
    add_run_options(parser)
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, command in SUBCOMMANDS.items():
        sub = commands.add_parser(name, help=command.help)
        command.configure(sub)
    return parser


def configure_logging(verbose: bool) -> None:
    """One line per event, readable in a terminal; SDK chatter only when it matters."""
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        format="%(asctime)s %(levelname)-7s %(name)s %(message)s",
        datefmt="%H:%M:%S",
        stream=sys.stderr,
        force=True,
    )
    make_handlers_safe()
    for name in NOISY_LOGGERS:
        logging.getLogger(name).setLevel(logging.WARNING)


@dataclass
class Prepared:
    """Everything that exists before the event loop has work: settings, services, app."""

    root: Path
    settings: LocalSettings
    services: Services
    functions: list[FunctionSpec]
    config: HostConfig


def prepare(args: argparse.Namespace) -> Prepared:
    """Blocking startup, in the order Core Tools uses: settings, services, then the app.

    Settings reach ``os.environ`` before ``function_app`` is imported because the app
    reads them lazily from there. On failure every child started so far is stopped.
    """
    root: Path = args.root.resolve()
    state_dir: Path = (args.state_dir or root / ".devhost").resolve()
    if args.fresh:
        wipe_state(state_dir)
    state_dir.mkdir(parents=True, exist_ok=True)
    settings = load_settings(root)
    if not args.no_services:
        telemetry = telemetry_settings(settings.values, os.environ, args.otlp_port)
        settings = dataclasses.replace(settings, values={**settings.values, **telemetry})
    apply_to_environ(settings.values)
    services = Services(root, state_dir)
    try:
        if not args.no_services:
            services.ensure_all(plan(settings.values, root, state_dir))
        if args.fresh:
            for endpoint in services.endpoints:
                if endpoint.status == "already running":
                    log.warning("--fresh did not reset %s: it was already running", endpoint.name)
        return Prepared(root, settings, services, load_app(root), HostConfig.load(root, os.environ))
    except BaseException:
        services.stop()
        raise


@dataclass
class Runtime:
    """A running app: what ``running_host`` hands to ``run`` (or a future ``demo``)."""

    host: LocalHost
    services: Services
    # Set by the first Ctrl-C or SIGTERM; a second one cancels the waiting task.
    stop: asyncio.Event


@contextlib.asynccontextmanager
async def running_host(args: argparse.Namespace) -> AsyncIterator[Runtime]:
    """Settings, services, app and triggers up; everything torn down in reverse on exit."""
    prepared = prepare(args)
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    owner = asyncio.current_task()

    def on_signal(signum: int) -> None:
        if not stop.is_set():
            log.info("%s received: shutting down", signal.Signals(signum).name)
            stop.set()
        elif owner is not None:
            log.warning("second signal: not waiting for running invocations")
            owner.cancel()

    try:
        for signum in SIGNALS:
            loop.add_signal_handler(signum, on_signal, signum)
        settings = prepared.settings
        port = args.port if args.port is not None else settings.local_http_port or DEFAULT_PORT
        host = LocalHost(
            prepared.functions,
            dict(os.environ),
            config=prepared.config,
            port=port,
            drain_timeout=args.drain_timeout,
            shutdown_hooks=app_shutdown_hooks(),
        )
        await host.start()
        state_dir = (args.state_dir or prepared.root / ".devhost").resolve()
        extras = extra_instances(
            getattr(args, "instances", 1), state_dir=state_dir, root=prepared.root
        )
        try:
            for extra in extras:
                extra.child.start()
            print_banner(host, prepared.services, settings, prepared.root)
            for extra in extras:
                print(
                    f"  {extra.child.name} on {extra.url} (log {extra.child.log_path})", flush=True
                )
            yield Runtime(host, prepared.services, stop)
        finally:
            await asyncio.to_thread(stop_all, extras)
            await host.stop()
            await asyncio.to_thread(flush_exports)
    finally:
        prepared.services.stop()
        for signum in SIGNALS:
            loop.remove_signal_handler(signum)
            signal.signal(signum, _interrupt)


def app_shutdown_hooks() -> list[Callable[[], Awaitable[None]]]:
    """The app's own "close my clients" coroutine, if it has one.

    The Functions host simply kills the worker; locally that leaves the app's aiohttp
    sessions unclosed and asyncio complains at exit. ``shared.bootstrap.shutdown``
    exists for the local runtime; it is looked up only among modules the app has
    already imported, so a different app is unaffected.
    """
    bootstrap = sys.modules.get(APP_BOOTSTRAP_MODULE)
    hook = getattr(bootstrap, "shutdown", None)
    return [hook] if callable(hook) else []


def print_banner(host: LocalHost, services: Services, settings: LocalSettings, root: Path) -> None:
    source = settings.source.name if settings.source else "no settings file"
    rows = host.rows()
    lines = [f"devhost: {len(rows)} function(s) from {root / 'function_app.py'} ({source})"]
    width = max((len(row.name) for row in rows), default=0)
    lines += [f"  {row.name:<{width}}  {row.trigger:<10}  {row.detail}" for row in rows]
    if services.endpoints:
        lines.append("services:")
        lines += [
            f"  {endpoint.name:<10} {endpoint.endpoint}  ({endpoint.status})"
            for endpoint in services.endpoints
        ]
    lines.append(f"devhost listening on {host.http_url} (Ctrl-C to stop)")
    print("\n".join(lines), flush=True)


async def serve(args: argparse.Namespace) -> int:
    """Run until Ctrl-C or SIGTERM, watching the children we started."""
    try:
        async with running_host(args) as runtime:
            while not runtime.stop.is_set():
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(runtime.stop.wait(), SERVICE_WATCH_SECONDS)
                runtime.services.check()
    except USER_ERRORS as exc:
        log.error("%s", exc)
        return 1
    except asyncio.CancelledError:
        return 130
    log.info("stopped")
    return 0


def _interrupt(signum: int, frame: FrameType | None) -> None:
    # Until the event loop owns the signals (startup is mostly blocking: waiting for
    # services, importing the app), both signals unwind as KeyboardInterrupt so the
    # children started so far are still stopped. A handler of our own also keeps
    # asyncio.run from installing its cancel-the-main-task SIGINT handler.
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    configure_logging(args.verbose)
    for signum in SIGNALS:
        signal.signal(signum, _interrupt)
    command = SUBCOMMANDS[args.command or "run"]
    try:
        return command.handler(args)
    except KeyboardInterrupt:
        log.info("interrupted")
        return 130


if __name__ == "__main__":
    sys.exit(main())
