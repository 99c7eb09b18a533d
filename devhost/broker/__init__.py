"""A local Service Bus broker that the real azure-servicebus SDK talks to over AMQP 1.0.

See ``python -m devhost.broker --help`` to run it, or use ``Broker`` in-process.
"""

from .broker import Broker
from .faults import FaultConfig, FaultConfigError

__all__ = ["Broker", "FaultConfig", "FaultConfigError"]
