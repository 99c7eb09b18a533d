"""One W3C trace per order, and the order's metrics, exported with OpenTelemetry.

`setup.configure()` runs once per process (from bootstrap); the rest is cheap while it
has not turned tracing on: the port wrappers are not installed and the invocation spans
are no-ops. Adapters and use cases stay free of OpenTelemetry: the ports are wrapped
(`ports.traced`), the trigger glue opens an invocation span (`spans.invocation`).
"""
