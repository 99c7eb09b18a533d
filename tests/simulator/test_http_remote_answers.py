"""A provider's answer that breaks the rule for text and numbers (issue 41): `NaN`, `1e400`,
a lone surrogate, bytes that are not UTF-8. The agent cannot refuse it, as the API refuses
a client's body: a 2xx says the operation took effect, and its result is what a
compensation needs. So it is kept with each number that is not finite as null and each
lone surrogate, or byte that is not UTF-8, as U+FFFD. Carried on as it came, the agent's
reply would now be dead-lettered by the Scheduler (a lone surrogate always was), and the
step left to time out; the bytes made the agent raise, and its request go round again."""

from __future__ import annotations

import json
import math

import aiohttp
import pytest

from shared.adapters.http_remote import HttpRemoteService
from shared.domain.in_doubt import RemoteOutcomeKind
from shared.domain.messages import AgentReply
from shared.domain.model import Action, Outcome
from shared.ports import RemoteCall
from tests.simulator.scripted_provider import Answer, ScriptedProvider

CALL = RemoteCall("o-1", "charge-payment", "o-1:charge-payment", {"amount": 9.5})
KEY = "o-1:charge-payment"

ANSWERS = {
    "NaN": (b'{"result": {"ref": "r-1", "fee": NaN}}', {"ref": "r-1", "fee": None}),
    "1e400 and -Infinity": (
        b'{"result": {"ref": "r-1", "fee": [1e400, -Infinity, 2.5]}}',
        {"ref": "r-1", "fee": [None, None, 2.5]},
    ),
    "a lone surrogate": (b'{"result": {"ref": "r-\\ud800"}}', {"ref": "r-\ufffd"}),
    "a lone surrogate in a name": (b'{"result": {"\\udfff": 1}}', {"\ufffd": 1}),
    "bytes that are not UTF-8": (b'{"result": {"ref": "r-\xff\xed\xa0\x80"}}', None),
}


@pytest.mark.parametrize("case", ANSWERS)
async def test_a_result_that_breaks_the_rule_is_kept_as_json_can_carry_it(
    provider: ScriptedProvider, case: str
) -> None:
    raw, kept = ANSWERS[case]
    provider.on("POST", "/charge-payment", Answer(200, raw=raw))
    async with aiohttp.ClientSession() as session:
        result = await HttpRemoteService(provider.url, session).invoke(CALL, 5)
    if kept is not None:
        assert result == kept
    else:
        assert result["ref"].startswith("r-") and "\ufffd" in result["ref"]
    reply = AgentReply(
        order_id="o-1",
        step="charge-payment",
        action=Action.DO,
        attempt=1,
        outcome=Outcome.SUCCEEDED,
        result=result,
    )
    body = reply.outgoing().body
    assert AgentReply.parse(json.dumps(body)) == reply, "the Scheduler takes the agent's reply"


async def test_an_outcome_answer_that_breaks_the_rule_is_kept_too(
    provider: ScriptedProvider,
) -> None:
    provider.on(
        "GET", f"/operations/{KEY}", Answer(200, raw=b'{"applied": true, "result": {"fee": NaN}}')
    )
    async with aiohttp.ClientSession() as session:
        outcome = await HttpRemoteService(provider.url, session).outcome(KEY, 5)
    assert (outcome.kind, outcome.result) == (RemoteOutcomeKind.APPLIED, {"fee": None})


async def test_a_call_carrying_a_value_stored_before_the_rule_sends_json_a_provider_reads(
    provider: ScriptedProvider,
) -> None:
    """A compensation's payload is the step's result, which an older version may have
    stored with NaN (issue 41): sent as the token, a provider's JSON parser refuses the
    whole request. It goes as null, and a lone surrogate as U+FFFD."""
    provider.on("POST", "/refund-payment", Answer(200, {"result": {"refunded": True}}))
    payload = {"result": {"fee": math.nan, "ref": "r-\ud800", "limits": [math.inf]}}
    call = RemoteCall("o-1", "refund-payment", "o-1:refund-payment", payload, KEY)
    async with aiohttp.ClientSession() as session:
        await HttpRemoteService(provider.url, session).invoke(call, 5)
    (seen,) = provider.calls("POST", "/refund-payment")
    assert seen.body["payload"] == {"result": {"fee": None, "ref": "r-\ufffd", "limits": [None]}}
    assert seen.headers["Content-Type"].startswith("application/json")
