"""The local OTLP/HTTP receiver: keeps the app's spans in SQLite and answers the trace query."""
