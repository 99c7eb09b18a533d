"""App settings the way Core Tools provides them.

The app reads its configuration from the environment lazily, so the runtime has to
build the same view Core Tools would (``local.settings.json`` ``Values``, or the
committed sample when a developer has not made a private copy yet, with real
environment variables winning) and push it into ``os.environ`` before
``function_app`` is imported.
"""

from __future__ import annotations

import json
import logging
import os
import re
from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

log = logging.getLogger("devhost.settings")

LOCAL_SETTINGS = "local.settings.json"
SAMPLE_SETTINGS = "local.settings.sample.json"

_REFERENCE = re.compile(r"%([^%\s]+)%")


class SettingsError(Exception):
    """A settings file is unusable or a binding refers to a setting nobody defined."""


@dataclass(frozen=True)
class LocalSettings:
    """The merged settings plus where they came from, for the banner and error messages."""

    values: dict[str, str]
    source: Path | None
    host: dict[str, Any] = field(default_factory=dict)

    @property
    def local_http_port(self) -> int | None:
        """``Host.LocalHttpPort`` is how Core Tools lets a project pin its port."""
        port = self.host.get("LocalHttpPort")
        return int(port) if isinstance(port, int | str) and str(port).isdigit() else None


def settings_file(root: Path) -> Path | None:
    """Prefer the developer's private file; the sample keeps a fresh clone runnable."""
    for name in (LOCAL_SETTINGS, SAMPLE_SETTINGS):
        candidate = root / name
        if candidate.is_file():
            return candidate
    return None


def _as_setting(name: str, value: Any, source: Path) -> str | None:
    # Core Tools insists on strings; accepting scalars avoids a confusing failure for
    # `"MaxFailureCount": 3` while still rejecting structures the app could never read.
    if value is None:
        return None
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str | int | float):
        return str(value)
    raise SettingsError(f"{source}: Values.{name} must be a string, got {type(value).__name__}")


def load_settings(root: Path, environ: Mapping[str, str] | None = None) -> LocalSettings:
    """Merge the settings file with the environment, the environment taking precedence."""
    env = os.environ if environ is None else environ
    source = settings_file(root)
    values: dict[str, str] = {}
    host: dict[str, Any] = {}
    if source is not None:
        try:
            document = json.loads(source.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise SettingsError(f"cannot read {source}: {exc}") from exc
        if not isinstance(document, dict):
            raise SettingsError(f"{source}: expected a JSON object")
        raw_values = document.get("Values") or {}
        if not isinstance(raw_values, dict):
            raise SettingsError(f"{source}: Values must be an object")
        for name, raw in raw_values.items():
            converted = _as_setting(name, raw, source)
            if converted is not None:
                values[name] = converted
        raw_host = document.get("Host") or {}
        host = raw_host if isinstance(raw_host, dict) else {}
    for name in values:
        if name in env:
            values[name] = env[name]
    return LocalSettings(values=values, source=source, host=host)


def apply_to_environ(
    values: Mapping[str, str], environ: MutableMapping[str, str] | None = None
) -> None:
    """Publish settings so that code reading ``os.environ`` lazily sees them."""
    target = os.environ if environ is None else environ
    for name, value in values.items():
        target[name] = value


def resolve(value: str, settings: Mapping[str, str], *, where: str = "binding") -> str:
    """Expand ``%Name%`` references as the Functions host does for binding expressions."""

    def substitute(match: re.Match[str]) -> str:
        name = match.group(1)
        if name not in settings:
            raise SettingsError(f"{where} refers to %{name}% but no setting {name!r} is defined")
        return settings[name]

    return _REFERENCE.sub(substitute, value)


def resolve_binding(
    binding: Mapping[str, Any], settings: Mapping[str, str], *, where: str
) -> dict[str, Any]:
    """Resolve every string field of a binding so triggers never see a raw ``%Name%``."""
    return {
        key: resolve(value, settings, where=f"{where} ({key})") if isinstance(value, str) else value
        for key, value in binding.items()
    }
