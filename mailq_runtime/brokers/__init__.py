"""The messaging leg of the queue: one module per broker behind the small `Broker` interface."""

from .base import Broker, Delivery

__all__ = ["Broker", "Delivery"]
