"""The agents' HTTP adapter settling a key for good (`abandon`), and reading a key that
was, against a scripted provider on a free port: each answer the contract names, and
what is no answer."""

from __future__ import annotations

from datetime import timedelta
from email.utils import format_datetime
from urllib.parse import quote

import aiohttp
import pytest

from shared.adapters.clock import FakeClock, SystemClock
from shared.adapters.http_remote import HttpRemoteService
from shared.domain.in_doubt import RemoteOutcomeKind
from shared.ports import TransientRemoteError
from shared.resilience import CircuitBreaker
from shared.usecases.flow.outcomes import Asked, OutcomeQueries
from tests.simulator.scripted_provider import Answer, ScriptedProvider, in_progress

KEY = "order 1/a?b#c:charge-payment"
"""Every character that must be percent-encoded in one path segment."""
ABANDON = ("POST", f"/payment/operations/{quote(KEY, safe='')}/abandon")
READ = ("GET", f"/payment/operations/{quote(KEY, safe='')}")
CHARGE = {"chargeId": "ch-1", "amount": 25.0}


def payment(provider: ScriptedProvider, session: aiohttp.ClientSession) -> HttpRemoteService:
    return HttpRemoteService(f"{provider.url}/payment", session)


@pytest.mark.parametrize(
    ("answer", "kind"),
    [
        (Answer(200, {"applied": False, "abandoned": True}), RemoteOutcomeKind.ABANDONED),
        (in_progress("1"), RemoteOutcomeKind.IN_PROGRESS),
        (Answer(404, {"code": "operation-not-found"}), RemoteOutcomeKind.UNKNOWN),
        (Answer(200, {"applied": False}), RemoteOutcomeKind.UNKNOWN),
        (Answer(409, {"code": "conflict"}), RemoteOutcomeKind.UNKNOWN),
        (Answer(400, {"code": "invalid"}), RemoteOutcomeKind.UNKNOWN),
        (Answer(200), RemoteOutcomeKind.UNKNOWN),
    ],
)
async def test_abandon_reads_only_the_contracts_answers(
    provider: ScriptedProvider,
    session: aiohttp.ClientSession,
    answer: Answer,
    kind: RemoteOutcomeKind,
) -> None:
    provider.on(*ABANDON, answer)

    assert (await payment(provider, session).abandon(KEY, 5)).kind is kind
    assert len(provider.calls(*ABANDON)) == 1, "the key is percent-encoded as one segment"


async def test_abandon_of_an_applied_key_is_applied_with_its_result(
    provider: ScriptedProvider, session: aiohttp.ClientSession
) -> None:
    provider.on(*ABANDON, Answer(200, {"applied": True, "result": CHARGE}))

    outcome = await payment(provider, session).abandon(KEY, 5)

    assert (outcome.kind, outcome.result) == (RemoteOutcomeKind.APPLIED, CHARGE)


async def test_a_provider_without_the_abandon_route_does_not_support_it(
    provider: ScriptedProvider, session: aiohttp.ClientSession
) -> None:
    """Its framework's plain 404: the caller falls back to waiting out the key."""
    outcome = await payment(provider, session).abandon(KEY, 5)

    assert outcome.kind is RemoteOutcomeKind.NOT_SUPPORTED
    assert len(provider.calls(*ABANDON)) == 1


@pytest.mark.parametrize("status", [408, 429, 500, 503])
async def test_abandon_raises_a_transient_answer_for_the_retry(
    provider: ScriptedProvider, session: aiohttp.ClientSession, status: int
) -> None:
    provider.on(*ABANDON, Answer(status, {"code": "busy"}, {"Retry-After": "2"}))

    with pytest.raises(TransientRemoteError) as raised:
        await payment(provider, session).abandon(KEY, 5)
    assert raised.value.retry_after == 2


async def test_abandon_of_an_unreachable_service_raises_for_the_retry(
    session: aiohttp.ClientSession,
) -> None:
    gone = ScriptedProvider()
    await gone.start()
    url = gone.url
    await gone.close()

    with pytest.raises(TransientRemoteError):
        await HttpRemoteService(f"{url}/payment", session).abandon(KEY, 5)


async def test_retry_after_as_an_http_date_is_seconds_from_now(
    provider: ScriptedProvider, session: aiohttp.ClientSession
) -> None:
    at = format_datetime(SystemClock().now() + timedelta(seconds=30), usegmt=True)
    provider.on(*ABANDON, Answer(503, {}, {"Retry-After": at}))

    with pytest.raises(TransientRemoteError) as raised:
        await payment(provider, session).abandon(KEY, 5)
    assert raised.value.retry_after is not None
    assert 25 < raised.value.retry_after <= 30


async def test_the_read_api_says_an_abandoned_key_is_abandoned(
    provider: ScriptedProvider, session: aiohttp.ClientSession
) -> None:
    provider.on(*READ, Answer(200, {"applied": False, "abandoned": True}))

    assert (await payment(provider, session).outcome(KEY, 5)).kind is RemoteOutcomeKind.ABANDONED


def queries(
    provider: ScriptedProvider, session: aiohttp.ClientSession, clock: FakeClock
) -> OutcomeQueries:
    breaker = CircuitBreaker("payment", clock)
    return OutcomeQueries({"payment": Asked(payment(provider, session), breaker)}, clock)


async def test_the_supervisors_abandon_retries_a_transient_answer(
    provider: ScriptedProvider, session: aiohttp.ClientSession
) -> None:
    provider.on(
        *ABANDON, Answer(503, {"code": "busy"}), Answer(200, {"applied": False, "abandoned": True})
    )
    outcomes = queries(provider, session, FakeClock())

    assert (await outcomes.abandon("payment", KEY)).kind is RemoteOutcomeKind.ABANDONED
    assert len(provider.calls(*ABANDON)) == 2


async def test_the_supervisors_abandon_sends_nothing_while_the_breaker_is_open(
    provider: ScriptedProvider, session: aiohttp.ClientSession
) -> None:
    clock = FakeClock()
    outcomes = queries(provider, session, clock)
    for _ in range(5):
        outcomes.services["payment"].breaker.record_failure()

    outcome = await outcomes.abandon("payment", KEY)

    assert (outcome.kind, outcome.detail) == (RemoteOutcomeKind.UNKNOWN, "circuit open")
    assert provider.seen == []


async def test_the_supervisors_abandon_never_raises(
    provider: ScriptedProvider, session: aiohttp.ClientSession
) -> None:
    """Unanswered for its whole 2 s, or an agent with no service: no answer, not settled."""
    provider.on(*ABANDON, Answer(503, {"code": "busy"}))
    outcomes = queries(provider, session, FakeClock())

    assert (await outcomes.abandon("payment", KEY)).kind is RemoteOutcomeKind.UNKNOWN
    assert (await outcomes.abandon("nobody", KEY)).kind is RemoteOutcomeKind.UNKNOWN
