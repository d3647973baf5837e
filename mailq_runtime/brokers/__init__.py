"""The messaging leg of the queue: one module per broker behind the small `Broker` interface."""

from .base import Broker, BrokerDeadLetter, Delivery

__all__ = ["Broker", "BrokerDeadLetter", "Delivery"]
