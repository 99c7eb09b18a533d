"""Which runtime process runs which functions: every function everywhere, or the app's
functions split by role over the processes.

On Flex Consumption the HTTP triggers scale together on their own instances and every
other function on instances of its own; the roles here are coarser (two or three
processes on two cores), but like Flex they give each queue one kind of consumer, so a
process opens only its functions' links and keeps its batches full. Locally the split is
made with the host's own switch, ``AzureWebJobs.<name>.Disabled``."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from devhost.host.loader import FunctionSpec, load_app

ROOT = Path(__file__).resolve().parents[1]

PLACEMENTS = ("all", "roles")


def role(spec: FunctionSpec) -> str:
    """front: HTTP triggers, the order queue's intake and the timers (Supervisor, archive,
    reconcile, heartbeats, bulk); scheduler: the Scheduler's queues; agents: the Agents'."""
    if spec.name.startswith("scheduler_"):
        return "scheduler"
    if spec.name.endswith(AGENT_SUFFIXES) or spec.name == "agent_heartbeat":
        return "agents"
    return "front"


AGENT_SUFFIXES = ("_agent", "_agent_high")
EVERYWHERE = frozenset({"health"})
"""Each instance answers its health probe (the harness waits on it)."""

ROLE_GROUPS: Mapping[int, tuple[frozenset[str], ...]] = {
    1: (frozenset({"front", "scheduler", "agents"}),),
    2: (frozenset({"front", "scheduler"}), frozenset({"agents"})),
    3: (frozenset({"front"}), frozenset({"scheduler"}), frozenset({"agents"})),
}


def runtime_settings(
    placement: str, names: Sequence[str], functions: Sequence[FunctionSpec]
) -> dict[str, dict[str, str]]:
    """Per runtime, the settings that turn off the functions placed elsewhere."""
    if placement == "all":
        return {}
    groups = ROLE_GROUPS.get(len(names))
    if groups is None:
        raise ValueError(f"--placement roles runs on 1 to {len(ROLE_GROUPS)} runtimes")
    return {
        name: {
            f"AzureWebJobs.{spec.name}.Disabled": "true"
            for spec in functions
            if role(spec) not in group and spec.name not in EVERYWHERE
        }
        for name, group in zip(names, groups, strict=True)
    }


def takes_orders(settings: Mapping[str, str]) -> bool:
    """Whether a runtime with these settings serves ``POST /api/orders``."""
    return settings.get("AzureWebJobs.submit_order_http.Disabled") != "true"


def app_functions() -> list[FunctionSpec]:
    """The app's functions, indexed the way the runtimes index them."""
    return load_app(ROOT)
