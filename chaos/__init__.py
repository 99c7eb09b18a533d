"""Chaos suite: the whole system on the local runtime under a mixed fault load.

``python -m chaos`` starts its own Azurite, a durable local broker, the simulator and
two runtimes against them, submits orders over HTTP while faults, injected crashes
and ``kill -9`` hit it, lets it converge, and checks invariants on what the state
store, the simulator's effect ledger and the operator-alerts queue show.
"""
