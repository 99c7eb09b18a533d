"""Catalogue documents for tests: the repo's own, and copies changed the way a team would."""

from __future__ import annotations

import copy
import json
from typing import Any

from shared.catalogue import DEFAULT_FILE, parse
from shared.domain.workflow import Catalogue


def document() -> dict[str, Any]:
    """A fresh copy of catalogue.json's content."""
    content: dict[str, Any] = json.loads(DEFAULT_FILE.read_text(encoding="utf-8"))
    return content


def build(doc: dict[str, Any]) -> Catalogue:
    """The catalogue a document declares, validated as the app validates catalogue.json."""
    return parse(json.dumps(doc), "test catalogue")


def with_agent(doc: dict[str, Any], name: str, setting: str) -> dict[str, Any]:
    """The document with one more agent, declared like the others."""
    changed = copy.deepcopy(doc)
    template = copy.deepcopy(changed["agents"][0])
    template.update(
        name=name,
        serviceUrlSetting=setting,
        localServiceUrl=f"http://127.0.0.1:7072/{name}",
        alternatives=[],
    )
    changed["agents"].append(template)
    return changed


def with_retriable_step(
    doc: dict[str, Any], workflow: str, step: str, agent: str, results: list[str]
) -> dict[str, Any]:
    """The document with a retriable step appended to the newest version of `workflow`."""
    changed = copy.deepcopy(doc)
    versions = [w for w in changed["workflows"] if w["name"] == workflow]
    target = max(versions, key=lambda w: w["version"])
    target["steps"].append({"name": step, "agent": agent, "kind": "retriable", "results": results})
    return changed
