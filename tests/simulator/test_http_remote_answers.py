"""A provider's answer that breaks the rule for text and numbers (issue 41): `NaN`, `1e400`,
a lone surrogate, bytes that are not UTF-8. The agent cannot refuse it, as the API refuses
a client's body: a 2xx says the operation took effect, and its result is what a
compensation needs. So it is kept with each number that is not finite as null and each
lone surrogate, or byte that is not UTF-8, as U+FFFD. Carried on as it came, the agent's
reply would now be dead-lettered by the Scheduler (a lone surrogate always was), and the
step left to time out; the bytes made the agent raise, and its request go round again."""

from __future__ import annotations

import json

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
