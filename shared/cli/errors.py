"""Exit codes and the one error type the entry point turns into a one-line message."""

from __future__ import annotations

from enum import IntEnum


class Exit(IntEnum):
    """Distinct codes so scripts can tell 'try later' from 'you asked for something wrong'."""

    OK = 0
    FAILED = 1
    USAGE = 2
    NOT_FOUND = 3
    AUTH = 4
    UNREACHABLE = 5
    INTERRUPTED = 130


class CliError(Exception):
    """A failure explained in one line; ``code`` is the process exit code."""

    def __init__(self, message: str, code: Exit = Exit.FAILED) -> None:
        super().__init__(message)
        self.message = message
        self.code = code


class Usage(CliError):
    def __init__(self, message: str) -> None:
        super().__init__(message, Exit.USAGE)


class NotFound(CliError):
    def __init__(self, message: str) -> None:
        super().__init__(message, Exit.NOT_FOUND)


class Refused(CliError):
    """Credentials missing or rejected (HTTP 401/403, Service Bus authorization)."""

    def __init__(self, message: str) -> None:
        super().__init__(message, Exit.AUTH)


class Unreachable(CliError):
    """Nothing answered, or the service said it is unavailable: worth retrying later."""

    def __init__(self, message: str) -> None:
        super().__init__(message, Exit.UNREACHABLE)


class Conflict(CliError):
    """The API answered 409: the order is not in a state that allows the action."""

    def __init__(self, message: str) -> None:
        super().__init__(message, Exit.FAILED)
