"""Requests aiohttp's parser refuses: answered in problem+json, logged as one warning.

aiohttp answers a request it cannot parse (a line over 8,190 bytes, a NUL in a header,
a missing or a repeated Host) itself, before the application or any middleware sees it:
a text/plain 400 and an ERROR with a full traceback. Neither fits. The client made the
mistake, so it is not the server's error, and any client can repeat it as fast as it
can connect, so one log record per request lets it bury everything else in the log.
aiohttp offers no hook for these (aio-libs/aiohttp#3287); its ``RequestHandler`` builds
the answer in ``handle_error``, so the runner here makes its connections with a handler
that overrides that one method, for parse errors only. A body that cannot be decoded
as its Content-Encoding says is the same kind of error, found later: when a handler
reads it, or when aiohttp drains it after the answer. Every HTTP server of the local
stack (the runtime, the simulator, the broker's control API, the trace receiver) runs
on it.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from http import HTTPStatus
from typing import Any

from aiohttp import web
from aiohttp.http_exceptions import (
    BadStatusLine,
    ContentEncodingError,
    HttpProcessingError,
    InvalidHeader,
    InvalidURLError,
    LineTooLong,
)
from aiohttp.web_protocol import RequestHandler, RequestPayloadError
from aiohttp.web_request import BaseRequest

from devhost.problem import problem

_REASON_CHARS = 80


class RateLimitedLog:
    """At most ``limit`` warnings per ``window`` seconds; the rest are counted, not logged.

    A line per malformed request is what a developer wants when their own client sent
    one; a loop sending thousands must not be able to fill the terminal or the disk. The
    count of what was left out goes on the next line logged, so nothing vanishes
    silently (a burst followed by quiet keeps its count until the next one).
    """

    def __init__(
        self,
        logger: logging.Logger,
        *,
        limit: int = 10,
        window: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._logger = logger
        self._limit = limit
        self._window = window
        self._clock = clock
        self._window_started = -math.inf
        self._logged = 0
        self._suppressed = 0

    def warning(self, msg: str, *args: object) -> None:
        now = self._clock()
        if now - self._window_started >= self._window:
            self._window_started, self._logged = now, 0
        if self._logged >= self._limit:
            self._suppressed += 1
            return
        self._logged += 1
        notes = []
        if self._suppressed:
            notes.append(f"{self._suppressed} more not logged before this one")
            self._suppressed = 0
        if self._logged == self._limit:
            notes.append(f"the next ones within {self._window:.0f} s are counted, not logged")
        self._logger.warning(msg + "".join(f" ({note})" for note in notes), *args)


def refusal_reason(exc: HttpProcessingError, max_line: int) -> str:
    """A short reason that repeats none of the client's bytes.

    aiohttp's messages quote up to 100 bytes of the offending line; the reason goes to
    the client and into the log, where neither needs the client's bytes back.
    """
    if isinstance(exc, LineTooLong):
        return f"the request line or a header is longer than {max_line} bytes"
    if isinstance(exc, InvalidHeader):
        return "a header name or value is not valid"
    if isinstance(exc, BadStatusLine):
        return "the request line is not an HTTP/1.x request line"
    if isinstance(exc, InvalidURLError):
        return "the request target is not a valid URL"
    # The parser's own fixed text ("Duplicate 'Host' header found.", "Invalid header
    # value char"), whose quoted bytes, if any, follow a colon or a line break.
    text = str(exc.message).split("\n", 1)[0].split(":", 1)[0].strip()
    return text[:_REASON_CHARS] or "the request is not well-formed HTTP/1.1"


def body_reason(exc: RequestPayloadError) -> str:
    if isinstance(exc.__cause__, ContentEncodingError):
        return "the body cannot be decoded as its Content-Encoding says"
    return "the body is not framed as its headers say"


class _ProblemRequestHandler(RequestHandler):
    """A body that cannot be decoded (a gzip body that is not gzip) shows only when a
    handler reads it: aiohttp calls that the handler's error (a 500) and, draining the
    rest after the answer, logs it again as an unhandled exception. Both are the
    client's error too."""

    def __init__(self, manager: web.Server, refusals: RateLimitedLog, **kwargs: Any) -> None:
        super().__init__(manager, **kwargs)
        self._refusals = refusals
        self._body_refused = False

    def handle_error(
        self,
        request: BaseRequest,
        status: int = 500,
        exc: BaseException | None = None,
        message: str | None = None,
    ) -> web.StreamResponse:
        if isinstance(exc, RequestPayloadError):
            self._body_refused = True
            return self._refused(request, 400, body_reason(exc))
        # A 500 (a handler that raised) is the server's own error: aiohttp's traceback
        # is what the developer needs then.
        if status >= 500 or not isinstance(exc, HttpProcessingError):
            return super().handle_error(request, status, exc, message)
        return self._refused(request, status, refusal_reason(exc, self.max_line_size))

    def log_exception(self, *args: Any, **kwargs: Any) -> None:
        if isinstance(kwargs.get("exc_info"), RequestPayloadError):
            if not self._body_refused:  # the handler never read the body
                self._refusals.warning(
                    "malformed request body -> answered as the handler chose: %s",
                    body_reason(kwargs["exc_info"]),
                )
            self._body_refused = False
            return
        super().log_exception(*args, **kwargs)

    def _refused(self, request: BaseRequest, status: int, reason: str) -> web.StreamResponse:
        if request.writer.output_size > 0:
            raise ConnectionError("an answer was being sent; no problem can follow it")
        self._refusals.warning(
            "malformed request from %s -> %d: %s", request.remote, status, reason
        )
        response = problem(status, HTTPStatus(status).phrase, reason)
        # The parser lost its place in the stream; nothing after this can be trusted.
        response.force_close()
        return response


class _ProblemServer(web.Server):
    """aiohttp's ``Server`` makes a plain ``RequestHandler`` per connection and takes no
    other class; this one is rebuilt from the server the runner made, with its handler,
    request factory and options, so only the handler class differs."""

    def __init__(self, made: web.Server, refusals: RateLimitedLog) -> None:
        # `_kwargs`: the options the application and the runner gave the server, which
        # aiohttp keeps nowhere public; the tests fail if a new aiohttp moves them.
        super().__init__(
            made.request_handler,
            request_factory=made.request_factory,
            handler_cancellation=made.handler_cancellation,
            **made._kwargs,
        )
        self._refusals = refusals

    def __call__(self) -> RequestHandler:
        return _ProblemRequestHandler(self, self._refusals, loop=self._loop, **self._kwargs)


class ProblemAppRunner(web.AppRunner):
    """An ``AppRunner`` whose connections answer unparseable requests in problem+json."""

    def __init__(self, app: web.Application, *, refusals: RateLimitedLog, **kwargs: Any) -> None:
        super().__init__(app, **kwargs)
        self._refusals = refusals

    async def _make_server(self) -> web.Server:
        return _ProblemServer(await super()._make_server(), self._refusals)
