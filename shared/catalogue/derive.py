"""What the catalogue implies for the deployment, computed from a given catalogue.

Pure functions of a `Catalogue`, so that a test can ask what a changed catalogue would
deploy without touching `catalogue.json`; the CLI and the local broker apply them to the
catalogue the app runs.
"""

from __future__ import annotations

from shared.contract import CORE_QUEUES, agent_queue
from shared.domain.workflow import AgentSpec, Catalogue

SIMULATOR_URL = "http://127.0.0.1:7072"
"""Where the local simulator serves every agent's service (`/{agent}`)."""


def agent_queues(catalogue: Catalogue) -> tuple[str, ...]:
    """Each agent's queue and then its high-priority lane, agents in catalogue order."""
    return tuple(agent_queue(name, high) for name in catalogue.agents for high in (False, True))


def all_queues(catalogue: Catalogue) -> tuple[str, ...]:
    """Every queue the app uses: the core ones (`shared.contract.CORE_QUEUES`), then the
    agents'."""
    return (*CORE_QUEUES, *agent_queues(catalogue))


def service_url_settings(catalogue: Catalogue) -> tuple[str, ...]:
    """The app setting of each agent's service URL, in catalogue order."""
    return tuple(spec.service_url_setting for spec in catalogue.agents.values())


def local_service_url(spec: AgentSpec) -> str:
    """The agent's `localServiceUrl`, else the simulator's route for it."""
    return spec.local_service_url or f"{SIMULATOR_URL}/{spec.name}"


def local_service_urls(catalogue: Catalogue) -> dict[str, str]:
    """Setting name -> the URL a local run uses, in catalogue order."""
    return {spec.service_url_setting: local_service_url(spec) for spec in catalogue.agents.values()}
