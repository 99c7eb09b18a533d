"""The in-process Functions host: HTTP, timer and Service Bus triggers of ``function_app``."""

from devhost.host.loader import FunctionSpec, HostConfig, LoadError, functions_of, load_app
from devhost.host.runtime import FunctionRow, LocalHost

__all__ = [
    "FunctionRow",
    "FunctionSpec",
    "HostConfig",
    "LoadError",
    "LocalHost",
    "functions_of",
    "load_app",
]
