"""The broker interface: durable per-queue messages that are deliverable now, with priorities and leases.

A broker carries only what may be delivered at once. Delays and dead letters are records of the metadata
store (`DelayedMails`, `DeadLetters` in stores/protocols.py), so every broker offers delays of any length, a
flush, and dead letters an operator can browse and requeue, whatever it can do itself.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True)
class Delivery:
    """A message handed to one consumer; it stays leased to it until acked or requeued. `handle` is the
    broker's own business (the embedded broker's row id and lease; a channel and delivery tag elsewhere):
    the queue only hands it back to the broker that made it."""

    queue: str
    enqueue_id: str
    payload: str
    attempts: int  # deliveries of this message so far, this one included
    handle: object


@dataclass(frozen=True)
class BrokerDeadLetter:
    """A message the broker gave up on by itself (RabbitMQ's delivery limit), on its way to the metadata
    store's dead letters."""

    queue: str
    enqueue_id: str
    payload: str
    reason: str
    died_at: int  # microseconds since the epoch


@dataclass(frozen=True)
class BrokerCounts:
    """What a broker tells of a queue's messages without taking any. A broker knows either its leases
    (`leased`, the enqueue ids of the messages handed to a consumer and not settled) or how many messages
    wait (`ready`), not always both: None is what it cannot tell. Messages of mails removed while they
    waited count until a consumer receives and discards them."""

    ready: int | None
    leased: frozenset[str] | None
    dead_letters: int  # messages it dead-lettered by itself, not yet drained into the metadata store


class Broker(Protocol):
    # Microseconds a received message stays leased to its consumer before it is delivered again.
    visibility_timeout: int

    def publish(self, queue: str, enqueue_id: str, payload: str, priority: int) -> None: ...

    def publish_many(self, queue: str, messages: Sequence[tuple[str, str, int]]) -> None:
        """`publish` each (enqueue id, payload, priority): a broker may take them in one call."""
        ...

    def receive(self, queue: str, timeout: float | None) -> Delivery | None:
        """The next message (highest priority, then oldest); None once `timeout` seconds pass."""
        ...

    def receive_ready(self, queue: str, limit: int) -> list[Delivery]:
        """Up to `limit` messages deliverable now, in `receive`'s order, without waiting: a broker may
        take them in one call."""
        ...

    # Each operation on a delivery acts only while the delivery's lease holds, and returns whether it
    # did: once another consumer has received the message, the message is that consumer's. A broker that
    # lost the delivery with its connection raises BrokerUnavailable instead: the message is delivered
    # again, but no lease expired.
    def ack(self, delivery: Delivery) -> bool: ...

    def requeue(self, delivery: Delivery) -> bool:
        """Give the message back, deliverable again at once."""
        ...

    def release(self, delivery: Delivery) -> bool:
        """Give the message back, deliverable again at once, without counting this delivery: its consumer
        could not look at it (a backend failed), so it must not bring the message nearer a delivery limit."""
        ...

    def extend(self, delivery: Delivery, until: int) -> bool:
        """Keep the message leased to this consumer until `until` (microseconds since the epoch)."""
        ...

    def published(self, queue: str, enqueue_ids: list[str]) -> set[str]:
        """Which of these mails the broker still holds (a broker that cannot tell returns none), for
        republish."""
        ...

    def counts(self, queue: str) -> BrokerCounts:
        """The queue's messages as the broker counts them; it reads and changes nothing else."""
        ...

    def drain_dead_letters(self, queue: str, keep: Callable[[list[BrokerDeadLetter]], None]) -> int:
        """Hand the messages the broker dead-lettered by itself to `keep`, which records them, then forget
        them; returns how many. A broker that never gives up on a message has none."""
        ...

    def close(self) -> None: ...
