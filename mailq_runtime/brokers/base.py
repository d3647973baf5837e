"""The broker interface: durable per-queue messages with delays, priorities, leases and dead letters."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True)
class Delivery:
    """A message handed to one consumer; it stays leased to it until acked, nacked or dead-lettered."""

    queue: str
    tag: int
    lease: str
    enqueue_id: str
    payload: str
    attempts: int


@dataclass(frozen=True)
class DeadLetter:
    queue: str
    enqueue_id: str
    reason: str
    died_at: int
    payload: str


class Broker(Protocol):
    # Microseconds a received message stays leased to its consumer before it is delivered again.
    visibility_timeout: int

    def publish(self, queue: str, enqueue_id: str, payload: str, priority: int, deliver_at: int) -> None: ...

    def receive(self, queue: str, timeout: float | None) -> Delivery | None:
        """The next deliverable message (highest priority, then oldest); None once `timeout` seconds pass."""
        ...

    # Each operation on a delivery acts only while the delivery's lease holds, and returns whether it
    # did: once another consumer has received the message, the message is that consumer's.
    def ack(self, delivery: Delivery) -> bool: ...

    def nack(self, delivery: Delivery, deliver_at: int) -> bool:
        """Give the message back, deliverable again at `deliver_at`."""
        ...

    def extend(self, delivery: Delivery, until: int) -> bool:
        """Keep the message leased to this consumer until `until` (microseconds since the epoch)."""
        ...

    def dead_letter(self, delivery: Delivery, reason: str) -> bool: ...

    def flush(self, queue: str) -> int:
        """Make every delayed message of the queue deliverable now; returns how many."""
        ...

    def published(self, queue: str, enqueue_ids: list[str]) -> set[str]:
        """Which of these mails the broker still holds (a broker that cannot tell returns none)."""
        ...

    def dead_letters(self, queue: str) -> list[DeadLetter]: ...

    def close(self) -> None: ...
