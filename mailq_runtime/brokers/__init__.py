"""The messaging leg of the queue: one module per broker behind the small `Broker` interface."""

from .base import Broker, DeadLetter, Delivery

__all__ = ["Broker", "DeadLetter", "Delivery"]
