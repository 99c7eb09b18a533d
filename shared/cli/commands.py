"""The commands: each takes the parsed arguments and a Console, returns an exit code."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TextIO

from shared import jsonbounds
from shared.cli import output
from shared.cli.api import OperatorApi, View
from shared.cli.args import ALL_QUEUES
from shared.cli.config import ApiConfig, BusConfig
from shared.cli.deadletters import DeadLetterQueues, Settlement
from shared.cli.errors import CliError, Exit, NotFound, Usage
from shared.domain.model import ProcessState

TERMINAL = frozenset(
    s.value for s in ProcessState if s.is_at_rest and s is not ProcessState.SUSPENDED
)
"""Where `orders watch` stops: a Suspended order has not ended, it waits for a resume."""


@dataclass
class Console:
    out: TextIO
    json: bool

    def show(self, text: str) -> None:
        """An order stored before the edge refused lone surrogates (issue 41) may hold
        one, which no terminal encoding can write: it is shown as its escape (the
        same text, in JSON)."""
        print(jsonbounds.escape_surrogates(text), file=self.out, flush=True)

    def data(self, value: Any) -> None:
        self.show(output.to_json(value))


async def orders_list(args: argparse.Namespace, config: ApiConfig, console: Console) -> int:
    items: list[View] = []
    continuation: str | None = None
    async with OperatorApi.open(config) as api:
        if args.all:
            async for page in api.pages(args.state, args.page_size, args.continuation):
                items.extend(page.items)
        else:
            page = await api.page(args.state, args.page_size, args.continuation)
            items, continuation = page.items, page.continuation
    if console.json:
        console.data({"items": items, "continuation": continuation})
        return Exit.OK
    console.show(output.orders_table(items))
    if continuation:
        console.show(f"more orders: add --all, or --continuation {continuation}")
    return Exit.OK


async def orders_show(args: argparse.Namespace, config: ApiConfig, console: Console) -> int:
    async with OperatorApi.open(config) as api:
        view = await api.order(args.order_id)
    if console.json:
        console.data(view)
    else:
        console.show(output.order_details(view))
    return Exit.OK


async def orders_resubmit(args: argparse.Namespace, config: ApiConfig, console: Console) -> int:
    return await _act_on_each(
        args,
        config,
        console,
        lambda api, order_id: api.resubmit(order_id),
        "resubmitted",
        "only an order in Error can be resubmitted",
    )


async def orders_cancel(args: argparse.Namespace, config: ApiConfig, console: Console) -> int:
    return await _act_on_each(
        args,
        config,
        console,
        lambda api, order_id: api.cancel(order_id, args.reason),
        "cancelling",
        "a Processed, Compensated or Cancelled order cannot be cancelled",
    )


async def orders_send_event(args: argparse.Namespace, config: ApiConfig, console: Console) -> int:
    """An approval carries the operator's name (`by`): it is recorded with the event."""
    if args.approve or args.reject:
        data: Any = {"approved": bool(args.approve), "by": config.operator}
        if args.comment:
            data["comment"] = args.comment
    elif args.data is not None:
        try:
            data = json.loads(args.data)
        except json.JSONDecodeError as exc:
            raise Usage(f"--data is not JSON: {exc}") from None
        if not isinstance(data, dict):
            raise Usage("--data is a JSON object")
    else:
        data = None
    body = {"eventId": args.event_id, **({"data": data} if data is not None else {})}
    secret = args.secret or config.signing_secret
    async with OperatorApi.open(config) as api:
        answer = await api.send_event(args.order_id, args.event, body, secret)
    if console.json:
        console.data(answer)
    else:
        console.show(f"{args.order_id}: event {args.event} ({args.event_id}) stored")
    return Exit.OK


async def orders_approve(args: argparse.Namespace, config: ApiConfig, console: Console) -> int:
    return await _answer_approval(args, config, console, approved=True)


async def orders_reject(args: argparse.Namespace, config: ApiConfig, console: Console) -> int:
    return await _answer_approval(args, config, console, approved=False)


async def _answer_approval(
    args: argparse.Namespace, config: ApiConfig, console: Console, *, approved: bool
) -> int:
    """The operator route: recorded `by` the operator, no signing secret needed."""
    async with OperatorApi.open(config) as api:
        answer = await api.answer_approval(
            args.order_id, approved, args.event_id, args.comment, args.event
        )
    if console.json:
        console.data(answer)
    else:
        verdict = "approved" if answer.get("approved") else "rejected"
        console.show(
            f"{args.order_id}: {answer.get('event')} ({answer.get('eventId')}) {verdict} "
            f"by {answer.get('by')}"
        )
    return Exit.OK


async def orders_suspend(args: argparse.Namespace, config: ApiConfig, console: Console) -> int:
    return await _act_on_each(
        args,
        config,
        console,
        lambda api, order_id: api.suspend(order_id),
        "suspended",
        "a finished order or one in Error cannot be suspended",
    )


async def orders_resume(args: argparse.Namespace, config: ApiConfig, console: Console) -> int:
    return await _act_on_each(
        args,
        config,
        console,
        lambda api, order_id: api.resume(order_id),
        "resumed",
        "only a Suspended order can be resumed",
    )


async def _act_on_each(
    args: argparse.Namespace,
    config: ApiConfig,
    console: Console,
    act: Callable[[OperatorApi, str], Awaitable[View]],
    done: str,
    refused: str,
) -> int:
    """Each order gets its own answer; the exit code is that of the first failure.

    Only per-order answers (404, 409) are collected: a refused key or an unreachable API
    would fail every order the same way, so they stop the command at once.
    """
    results: list[dict[str, Any]] = []
    code = Exit.OK
    async with OperatorApi.open(config) as api:
        for order_id in dict.fromkeys(args.order_ids):
            try:
                state = await act(api, order_id)
            except NotFound as exc:
                results.append({"orderId": order_id, "result": "not found", "detail": exc.message})
                code = code or exc.code
            except CliError as exc:
                if exc.code != Exit.FAILED:
                    raise
                detail = f"{refused}: {exc.message}"
                results.append({"orderId": order_id, "result": "refused", "detail": detail})
                code = code or exc.code
            else:
                detail = (
                    f"{state.get('processState')}, attempt {state.get('attempt')}, "
                    f"failures {state.get('failureCount')}"
                )
                results.append(
                    {"orderId": order_id, "result": done, "detail": detail, "state": state}
                )
    if console.json:
        console.data(results)
    else:
        console.show(output.resubmit_table(results))
    return code


Confirm = Callable[[str], bool | None]
"""Asks a yes/no question; None when there is no one to ask (no terminal on stdin)."""


def ask_on_terminal(question: str) -> bool | None:
    if not sys.stdin or not sys.stdin.isatty():
        return None
    try:
        answer = input(question)
    except EOFError:
        return None
    return answer.strip().lower() in ("y", "yes")


async def orders_bulk(
    args: argparse.Namespace,
    config: ApiConfig,
    console: Console,
    confirm: Confirm = ask_on_terminal,
) -> int:
    """Preview, confirm, start, then follow the job until Done (exit 1 if any failed)."""
    flt = {
        key: value
        for key, value in (
            ("state", args.state),
            ("step", args.step),
            ("errorCode", args.error_code),
            ("customerId", args.customer),
            ("createdFrom", args.created_from),
            ("createdTo", args.created_to),
            ("workflow", args.workflow),
            ("workflowVersion", args.workflow_version),
        )
        if value
    }
    if not flt:
        raise Usage(
            "name at least one filter (--state, --step, --error-code, --customer, "
            "--created-from, --created-to, --workflow): a bulk action never matches everything"
        )
    if args.action == "migrate" and (args.to_version is None or args.workflow is None):
        raise Usage("migrate needs --workflow NAME and --to-version N")
    if args.action != "migrate" and args.to_version is not None:
        raise Usage("--to-version is only for migrate")
    body: dict[str, Any] = {"action": args.action, "filter": flt}
    if args.to_version is not None:
        body["toVersion"] = args.to_version
    if args.limit is not None:
        body["limit"] = args.limit
    async with OperatorApi.open(config) as api:
        if args.dry_run or not args.yes:
            preview = await api.bulk({**body, "dryRun": True})
            if console.json and args.dry_run:
                console.data(preview)
            elif not console.json:
                console.show(output.bulk_preview(args.action, preview))
            if args.dry_run:
                return Exit.OK
            if not preview.get("matched"):
                if console.json:
                    console.data(preview)
                else:
                    console.show("nothing to do")
                return Exit.OK
            answer = confirm(f"{args.action} {preview.get('matched')} orders? [y/N] ")
            if answer is None:
                raise CliError("no terminal to confirm on: pass --yes to act without asking")
            if not answer:
                console.show("not started")
                return Exit.FAILED
        started = await api.bulk(body)
        bulk_id = str(started.get("bulkId"))
        if args.no_wait:
            if console.json:
                console.data(started)
            else:
                console.show(f"bulk {bulk_id} started on {started.get('matched')} orders")
            return Exit.OK
        previous: View | None = None
        while True:
            job = await api.bulk_job(bulk_id)
            if job != previous and not console.json:
                console.show(output.bulk_progress(job))
            previous = job
            if job.get("state") == "Done":
                if console.json:
                    console.data(job)
                return Exit.FAILED if job.get("failed") else Exit.OK
            await asyncio.sleep(args.interval)


async def orders_watch(args: argparse.Namespace, config: ApiConfig, console: Console) -> int:
    """Exit 0 when the order ends Processed, 1 when it ends Error, Compensated or Cancelled."""
    deadline = time.monotonic() + args.max_wait if args.max_wait else None
    previous: View | None = None
    async with OperatorApi.open(config) as api:
        while True:
            view = await api.order(args.order_id)
            if view != previous:
                if console.json:
                    console.show(output.to_json_line(view))
                else:
                    for line in output.changes(previous, view):
                        console.show(line)
            previous = view
            state = view.get("processState")
            if state in TERMINAL:
                if not console.json:
                    console.show(f"{args.order_id} ended {state}")
                return Exit.OK if state == ProcessState.PROCESSED.value else Exit.FAILED
            if deadline is not None and time.monotonic() >= deadline:
                raise CliError(f"order {args.order_id!r} is still {state} after {args.max_wait:g}s")
            await asyncio.sleep(args.interval)


async def agents_list(args: argparse.Namespace, config: ApiConfig, console: Console) -> int:
    async with OperatorApi.open(config) as api:
        agents = await api.agents()
    if console.json:
        console.data(agents)
    else:
        console.show(output.agents_table(agents))
    return Exit.OK


async def agents_drain(args: argparse.Namespace, config: ApiConfig, console: Console) -> int:
    return await _drain(args.agent, True, args.reason, config, console)


async def agents_undrain(args: argparse.Namespace, config: ApiConfig, console: Console) -> int:
    return await _drain(args.agent, False, None, config, console)


async def _drain(
    agent: str, drained: bool, reason: str | None, config: ApiConfig, console: Console
) -> int:
    async with OperatorApi.open(config) as api:
        view = await api.drain(agent, drained, reason)
    if console.json:
        console.data(view)
    else:
        console.show(output.drain_line(view))
    return Exit.OK


async def failures(args: argparse.Namespace, config: ApiConfig, console: Console) -> int:
    async with OperatorApi.open(config) as api:
        report = await api.failures()
    if console.json:
        console.data(report)
    else:
        console.show(output.failures_table(report))
    return Exit.OK


async def archive_list(args: argparse.Namespace, config: ApiConfig, console: Console) -> int:
    items: list[View] = []
    continuation: str | None = None
    async with OperatorApi.open(config) as api:
        while True:
            answer = await api.archived_on(args.day, continuation)
            items += answer["items"]
            continuation = answer.get("continuation")
            if not (args.all and continuation):
                break
    if console.json:
        console.data({"items": items, "continuation": continuation})
        return Exit.OK
    console.show(output.archived_table(items) if items else f"nothing archived under {args.day}")
    if continuation:
        console.show(f"more archived orders under {args.day}: add --all")
    return Exit.OK


async def archive_show(args: argparse.Namespace, config: ApiConfig, console: Console) -> int:
    """The order route answers an archived order too; this says when it is not one."""
    async with OperatorApi.open(config) as api:
        view = await api.order(args.order_id)
    if console.json:
        console.data(view)
        return Exit.OK
    console.show(output.order_details(view))
    console.show(
        f"archived at {output.when(view.get('archivedAt'))}"
        if view.get("archived")
        else "not archived: the order is still in the state table"
    )
    return Exit.OK


async def dlq_list(args: argparse.Namespace, config: BusConfig, console: Console) -> int:
    queues = list(dict.fromkeys(args.queue or ALL_QUEUES))
    async with DeadLetterQueues.open(config) as bus:
        peeked = await asyncio.gather(*(bus.peek(q, args.max) for q in queues))
    if console.json:
        console.data([output.dead_letter_json(m, args.excerpt) for p in peeked for m in p.messages])
    else:
        console.show(output.dead_letters_text(peeked, args.excerpt))
    return Exit.OK


async def dlq_requeue(args: argparse.Namespace, config: BusConfig, console: Console) -> int:
    async with DeadLetterQueues.open(config) as bus:
        result = await bus.requeue(args.queue, args.message_id, args.max)
    return _settled(result, "requeued", console)


async def dlq_purge(args: argparse.Namespace, config: BusConfig, console: Console) -> int:
    if not args.yes:
        raise Usage("purge deletes dead letters for good: add --yes to confirm")
    async with DeadLetterQueues.open(config) as bus:
        result = await bus.purge(args.queue, args.message_id, args.max)
    return _settled(result, "purged", console)


def _settled(result: Settlement, verb: str, console: Console) -> int:
    if console.json:
        console.data(output.settlement_json(result))
    else:
        console.show(output.settlement_text(result, verb))
    return Exit.FAILED if result.skipped else Exit.OK
