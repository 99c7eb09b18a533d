"""Sampling that never loses an error or an order in trouble.

A parent-based ratio sampler decides once, at the order's root (the intake), so an
unlucky order that later fails would be dropped whole. Spans started with the
attribute `KEEP` set are sampled whatever the parent said: the error spans that
`spans.failed` records for an invocation or a call that failed in a dropped trace, and
the Supervisor's or an operator's rejoin of an order (`ports.py`), whose messages then
carry the sampled flag, so every hop after the order got into trouble is kept too.
"""

from __future__ import annotations

from collections.abc import Sequence

from opentelemetry.context import Context
from opentelemetry.sdk.trace.sampling import Decision, Sampler, SamplingResult
from opentelemetry.trace import Link, SpanKind, TraceState
from opentelemetry.util.types import Attributes

KEEP = "sampling.keep"
"""Attribute that makes a span sampled whatever the configured sampler says."""


class KeepMarked(Sampler):
    """The configured sampler, except for spans marked with `KEEP`."""

    def __init__(self, configured: Sampler) -> None:
        self._configured = configured

    def should_sample(
        self,
        parent_context: Context | None,
        trace_id: int,
        name: str,
        kind: SpanKind | None = None,
        attributes: Attributes = None,
        links: Sequence[Link] | None = None,
        trace_state: TraceState | None = None,
    ) -> SamplingResult:
        if attributes and attributes.get(KEEP):
            return SamplingResult(Decision.RECORD_AND_SAMPLE, attributes, trace_state)
        return self._configured.should_sample(
            parent_context, trace_id, name, kind, attributes, links, trace_state
        )

    def get_description(self) -> str:
        return f"KeepMarked{{{self._configured.get_description()}}}"
