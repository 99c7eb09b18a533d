"""An operator's resubmit of an order held in compensation, whose charge's refund found
nothing to undo (issue #37, the late apply; docs/in-doubt.md "Late answers").

payment has no abandon. The charge went unanswered past its live time (its key
expired), a cancel's refund went and found nothing to undo, which settles the charge's
key not applied (`settle.undone_by`), and the release of the inventory was refused for
good: the order is held in Error. Not applied is a settled key, so the resubmit's
charge could go to payment-secondary (`settle.pinned` pins only an unsettled or
expired key) if a resubmit ever sent it again; the original charge may still apply at
payment after all (the residual risk: a request held on the network past its live
time). Judged here as the providers see it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from shared.contract import Queue, agent_queue
from shared.domain.in_doubt import NOT_SUPPORTED
from shared.domain.machine.dispatch import heal_key
from shared.domain.model import ErrorInfo, KeyState, Outcome, ProcessState, StepStatus
from shared.ports import TransientRemoteError
from shared.usecases.flow import scheduler
from shared.usecases.operations.operator import cancel_order, resubmit_order
from tests.builders import World, a_policy, a_reply
from tests.unit.test_in_doubt import CHARGE_KEY, REFUND_KEY, Setup, at_payment, loaded, next_claim
from tests.unit.test_late_success import PAST_LIVE_TIME, late

NOTHING = {"undone": False, "reason": "nothing-to-undo"}
REFUSED = ErrorInfo("rejected", "warehouse closed")


@dataclass
class Ledger:
    """The charge as each payment provider sees it: keys applied and undone there."""

    applied: dict[str, set[str]] = field(default_factory=dict)
    undone: dict[str, set[str]] = field(default_factory=dict)

    def apply(self, agent: str, key: str) -> None:
        self.applied.setdefault(agent, set()).add(key)

    def undo(self, agent: str, key: str) -> None:
        self.undone.setdefault(agent, set()).add(key)

    def charged_at(self) -> list[str]:
        return sorted(
            agent for agent, keys in self.applied.items() if keys - self.undone.get(agent, set())
        )


async def held_after_a_refund_that_found_nothing() -> Setup:
    setup = await at_payment(
        World(policy=a_policy(max_failure_count=1)), "payment", "payment-secondary"
    )
    setup.payment.answers[CHARGE_KEY] = TransientRemoteError("http-503", "down")
    setup.payment.abandons[CHARGE_KEY] = NOT_SUPPORTED
    setup.world.clock.advance(PAST_LIVE_TIME)
    await setup.sweep()
    assert (await loaded(setup)).steps[1].key_state is KeyState.EXPIRED
    setup.requests(Queue.OPERATOR_ALERTS)
    await cancel_order(setup.deps, "o-1", "op")
    await next_claim(setup)
    (refund,) = setup.requests(agent_queue("payment"))
    assert refund.body["idempotencyKey"] == REFUND_KEY
    await scheduler.on_reply(setup.deps, a_reply(refund, result=NOTHING))
    (release,) = setup.requests(agent_queue("inventory"))
    await scheduler.on_reply(setup.deps, a_reply(release, Outcome.FAILED, error=REFUSED))
    process = await loaded(setup)
    assert process.state.process_state is ProcessState.ERROR
    charge = process.steps[1]
    assert (charge.status, charge.key_state) == (StepStatus.COMPENSATED, KeyState.NOT_APPLIED)
    setup.requests(Queue.OPERATOR_ALERTS)
    return setup


async def resubmitted(setup: Setup, ledger: Ledger) -> list[str]:
    """The operator's resubmit and what it sends, each answered with success (a charge
    on the ledger); the keys sent to inventory."""
    await resubmit_order(setup.deps, "o-1", "op")
    await next_claim(setup)
    for agent in ("payment", "payment-secondary"):
        for charge in setup.requests(agent_queue(agent)):
            ledger.apply(agent, str(charge.body["idempotencyKey"]))
            await scheduler.on_reply(setup.deps, a_reply(charge))
    releases = setup.requests(agent_queue("inventory"))
    for release in releases:
        await scheduler.on_reply(setup.deps, a_reply(release))
    return [str(r.body["idempotencyKey"]) for r in releases]


async def test_a_resubmit_after_a_refund_that_found_nothing_never_charges_again() -> None:
    """The resubmit of a held compensation goes on compensating (the phase never turns
    back): the compensated charge is not sent again, to payment or to the provider its
    settled key would let it move to."""
    setup = await held_after_a_refund_that_found_nothing()
    ledger = Ledger()
    released = await resubmitted(setup, ledger)
    assert ledger.charged_at() == []
    assert released == ["o-1:release-inventory:r2"]
    assert (await loaded(setup)).state.process_state is ProcessState.CANCELLED


@pytest.mark.parametrize("reply", ["heard", "lost"])
async def test_the_original_charge_applied_late_is_in_force_at_one_provider_at_most(
    reply: str,
) -> None:
    """The charge applies at payment after the resubmit's compensation ended (the
    residual risk). Heard, the Scheduler refunds it at once under the heal key
    (`forward._late_do`): charged nowhere. Lost, it stays at payment alone until
    reconciliation's run over the Cancelled order heals it (docs/in-doubt.md): never a
    second provider, since nothing sent the charge anywhere else."""
    setup = await held_after_a_refund_that_found_nothing()
    ledger = Ledger()
    await resubmitted(setup, ledger)
    assert setup.charge is not None
    ledger.apply("payment", CHARGE_KEY)
    if reply == "heard":
        await scheduler.on_reply(setup.deps, late(setup.charge, "payment"))
    for undo in setup.requests(agent_queue("payment")):
        assert (undo.body["action"], undo.body["undoes"]) == ("compensate", CHARGE_KEY)
        assert undo.body["idempotencyKey"] == heal_key(REFUND_KEY)
        ledger.undo("payment", CHARGE_KEY)
    assert setup.requests(agent_queue("payment-secondary")) == []
    assert ledger.charged_at() == ([] if reply == "heard" else ["payment"])
