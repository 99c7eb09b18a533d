"""Log records carry the trace and span they were written in (`trace_id`, `span_id`).

A record factory rather than a filter: a filter sees only the records of the logger
or handler it is attached to, the factory every record of the process. The formats
stay as they are; a format that wants the ids names `%(trace_id)s`. Outside a span
both are empty strings, so such a format never fails.
"""

from __future__ import annotations

import logging
from typing import Any

from opentelemetry import trace

_installed = False


def install() -> None:
    global _installed
    if _installed:
        return
    previous = logging.getLogRecordFactory()

    def record(*args: Any, **kwargs: Any) -> logging.LogRecord:
        made = previous(*args, **kwargs)
        context = trace.get_current_span().get_span_context()
        if context.is_valid:
            made.trace_id = format(context.trace_id, "032x")
            made.span_id = format(context.span_id, "016x")
        else:
            made.trace_id = made.span_id = ""
        return made

    logging.setLogRecordFactory(record)
    _installed = True
