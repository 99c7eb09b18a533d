"""``python -m shared.cli``: the operator's command line.

Orders go through the HTTP operator API (the same contract any client uses, so the CLI
needs no storage credentials); dead letters are read with the azure-servicebus SDK,
because the API deliberately exposes no queue internals.
"""
