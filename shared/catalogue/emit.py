"""Files generated from the catalogue: the Service Bus emulator config and the agents'
settings in local.settings.sample.json.

    python -m shared.catalogue.emit emulator > emulator/servicebus-config.json
    python -m shared.catalogue.emit local-settings > local.settings.sample.json

Both are committed; `tests/infra/test_generated_files.py` fails when a committed file
differs from what this module makes of the catalogue, and says which command rewrites it.
`--catalogue FILE` emits for another catalogue (as the `CatalogueFile` setting does).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from shared.catalogue import ROOT, catalogue_file, load
from shared.catalogue.derive import all_queues, local_service_urls
from shared.contract import QUEUE_PROPERTIES, QueueProperties, queue_properties
from shared.domain.workflow import Catalogue

EMULATOR_CONFIG = ROOT / "emulator" / "servicebus-config.json"
LOCAL_SETTINGS = ROOT / "local.settings.sample.json"

# The Service Bus emulator's bounds (its Config-schema.json): a contract value outside them
# is clamped, which today shortens duplicate detection from 10 to 5 minutes locally.
EMULATOR_NAMESPACE = "sbemulatorns"
EMULATOR_MAX_ENTITIES = 50
EMULATOR_LOCK_DURATION = (5, 300)
EMULATOR_DUPLICATE_WINDOW = (5, 300)
EMULATOR_MAX_DELIVERY_COUNT = (1, 10)
EMULATOR_MESSAGE_TTL_SECONDS = 3600
"""The emulator's longest time-to-live (its default is shorter)."""

SERVICE_URL_SUFFIX = "ServiceUrl"
"""Agents' URL settings end so (a convention of catalogue.json): one such setting that no
agent declares any more is dropped from the local settings."""


def _clamp(seconds: int, bounds: tuple[int, int]) -> int:
    return max(bounds[0], min(bounds[1], seconds))


def iso_duration(seconds: int) -> str:
    """An ISO 8601 duration as the emulator config writes it (3600 -> PT1H, 90 -> PT1M30S)."""
    if seconds <= 0:
        raise ValueError(f"a duration must be positive, not {seconds}")
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    parts = [f"{n}{unit}" for n, unit in ((hours, "H"), (minutes, "M"), (secs, "S")) if n]
    return "PT" + "".join(parts)


def emulator_queue_properties(properties: QueueProperties = QUEUE_PROPERTIES) -> dict[str, Any]:
    """The contract's queue properties as far as the emulator allows them."""
    return {
        "DeadLetteringOnMessageExpiration": properties.dead_lettering_on_message_expiration,
        "DefaultMessageTimeToLive": iso_duration(EMULATOR_MESSAGE_TTL_SECONDS),
        "DuplicateDetectionHistoryTimeWindow": iso_duration(
            _clamp(properties.duplicate_detection_window_seconds, EMULATOR_DUPLICATE_WINDOW)
        ),
        "ForwardDeadLetteredMessagesTo": "",
        "ForwardTo": "",
        "LockDuration": iso_duration(
            _clamp(properties.lock_duration_seconds, EMULATOR_LOCK_DURATION)
        ),
        "MaxDeliveryCount": _clamp(properties.max_delivery_count, EMULATOR_MAX_DELIVERY_COUNT),
        "RequiresDuplicateDetection": properties.requires_duplicate_detection,
        "RequiresSession": False,
    }


def emulator_config(
    cat: Catalogue, of: Callable[[str], QueueProperties] = queue_properties
) -> dict[str, Any]:
    """The emulator's Config.json: one namespace with every queue of the catalogue, each
    with the properties ``of`` gives it."""
    queues = all_queues(cat)
    if len(queues) > EMULATOR_MAX_ENTITIES:
        raise ValueError(
            f"{len(queues)} queues: the Service Bus emulator holds at most "
            f"{EMULATOR_MAX_ENTITIES} entities ({len(cat.agents)} agents, two queues each)"
        )
    return {
        "UserConfig": {
            "Namespaces": [
                {
                    "Name": EMULATOR_NAMESPACE,
                    "Queues": [
                        {"Name": name, "Properties": emulator_queue_properties(of(name))}
                        for name in queues
                    ],
                    "Topics": [],
                }
            ],
            "Logging": {"Type": "Console"},
        }
    }


def local_settings(cat: Catalogue, current: Mapping[str, Any]) -> dict[str, Any]:
    """`current` (a local.settings file) with every agent's URL setting at its local URL.

    Other settings are kept as they are, in their order. Agents' settings already there
    keep their place; new ones follow the last of them; a `*ServiceUrl` setting that no
    agent declares is dropped.
    """
    wanted = local_service_urls(cat)
    values: dict[str, Any] = {}
    for key, value in dict(current.get("Values", {})).items():
        if key in wanted:
            values[key] = wanted[key]
        elif not key.endswith(SERVICE_URL_SUFFIX):
            values[key] = value
    missing = {k: v for k, v in wanted.items() if k not in values}
    if missing:
        keys = list(values)
        present = [i for i, key in enumerate(keys) if key in wanted]
        at = present[-1] + 1 if present else len(keys)
        values = {
            **{k: values[k] for k in keys[:at]},
            **missing,
            **{k: values[k] for k in keys[at:]},
        }
    return {**current, "Values": values}


def dumps(document: Mapping[str, Any]) -> str:
    """The committed files' format: two-space indent, a final newline."""
    return json.dumps(document, indent=2, ensure_ascii=False) + "\n"


def render(kind: str, cat: Catalogue) -> str:
    if kind == "emulator":
        return dumps(emulator_config(cat))
    if kind == "local-settings":
        current = json.loads(LOCAL_SETTINGS.read_text(encoding="utf-8"))
        return dumps(local_settings(cat, current))
    raise ValueError(f"unknown kind {kind!r}")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m shared.catalogue.emit", description=__doc__)
    parser.add_argument("kind", choices=("emulator", "local-settings"))
    parser.add_argument("--catalogue", type=Path, help="another catalogue file")
    args = parser.parse_args(argv)
    cat = load(args.catalogue or catalogue_file())
    sys.stdout.write(render(args.kind, cat))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
