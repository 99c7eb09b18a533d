"""The order process state machine: pure functions from (process, event, now) to a Transition.

Every function either returns the next process plus the messages to send and the history
to append, or None when the event is stale or does not apply: a lost race, a late reply
from an older attempt, a duplicate. None is normal control flow, never an error.

One module per concern, each imported by its own name, so that a call site names the
rule that runs: forward (submission, claim, answers), dispatch (the moves every rule
ends with), settle (when a step may be undone or moved: the rule that keeps money from
being left behind), recovery (the Supervisor's moves), operator (cancel, suspend,
resume, resubmit), waits (timers, waiting steps woken), events (events and approvals
sent to an order), migrate (an order moved to another version of its workflow),
heartbeat and hold (a running step's complete-by moved), line (an order waiting in its
customer's line) and transition (what every rule returns, and the policy it reads).
"""
