"""Link addresses in Service Bus's AMQP dialect.

The SDK addresses an entity as ``amqps://<host>/<queue>`` (host and port vary), its dead-letter
sub-queue as ``<queue>/$DeadLetterQueue``, the entity's request/response node as
``<entity>/$management`` (without scheme) and claims-based security as ``$cbs``.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

DEAD_LETTER_SUFFIX = "/$DeadLetterQueue"
MANAGEMENT_SUFFIX = "/$management"
CBS_NODE = "$cbs"
BROKER_CONTAINER = "devhost.broker"
"""The container id the broker opens connections with: the local host's own AMQP client
(devhost/host/sb_proton.py) speaks only to a peer that names itself so."""


class NodeKind(enum.Enum):
    ENTITY = "entity"
    MANAGEMENT = "management"
    CBS = "cbs"


@dataclass(frozen=True, slots=True)
class Node:
    """A resolved link address: ``entity`` is ``queue`` or ``queue/$DeadLetterQueue``."""

    kind: NodeKind
    entity: str = ""

    @property
    def queue(self) -> str:
        return self.entity.removesuffix(DEAD_LETTER_SUFFIX)

    @property
    def dead_letter(self) -> bool:
        return self.entity.endswith(DEAD_LETTER_SUFFIX)


def dead_letter_entity(queue: str) -> str:
    return queue + DEAD_LETTER_SUFFIX


def _strip_host(address: str) -> str:
    if "://" in address:
        rest = address.split("://", 1)[1]
        return rest.split("/", 1)[1] if "/" in rest else ""
    return address.lstrip("/")


def resolve(address: str | None, queues: dict[str, str]) -> Node | None:
    """Map a link address to a node, or None when it names no known queue.

    ``queues`` maps lower-cased names to canonical names: Service Bus entity names are
    case-insensitive.
    """
    if not address:
        return None
    path = _strip_host(address).rstrip("/")
    if path.lower() == CBS_NODE:
        return Node(NodeKind.CBS)
    kind = NodeKind.ENTITY
    if path.lower().endswith(MANAGEMENT_SUFFIX.lower()):
        kind = NodeKind.MANAGEMENT
        path = path[: -len(MANAGEMENT_SUFFIX)]
    dead_letter = path.lower().endswith(DEAD_LETTER_SUFFIX.lower())
    if dead_letter:
        path = path[: -len(DEAD_LETTER_SUFFIX)]
    queue = queues.get(path.lower())
    if queue is None:
        return None
    return Node(kind, dead_letter_entity(queue) if dead_letter else queue)
