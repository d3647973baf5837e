"""A consumer of RabbitMQ queues in this process, shared by the callers that receive and the I/O thread that
feeds it, and the handle of a delivery it handed out."""

from __future__ import annotations

import heapq
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pika

from .publishes import Waiter


@dataclass(frozen=True, eq=False)
class Handle:
    """What a Delivery of this broker holds: its consumer, the channel's epoch and the delivery tag, and
    the message as received, for a copy that gives it back uncounted."""

    consumer: Consumer
    epoch: int
    tag: int
    properties: pika.BasicProperties
    body: bytes


class Consumer:
    """The deliveries of RabbitMQ queues `queues` in this process (a mail queue's, or its dead letters'):
    a channel consuming them, the messages received that no caller took yet (by priority, then enqueue
    id), and those handed out and not settled, with their leases. The I/O thread fills the buffer and the
    callers empty it, under `cond`. `route` names the queue a message of a priority goes back to.

    A mail queue's consumer has `dead_letters`. Its queues count deliveries themselves (`counted`, quorum
    queues), or it counts them: a message RabbitMQ delivers again is replaced by a copy that counts one
    more. Either way, a message past the limit goes to `dead_letters` (a quorum queue's copies keep the
    deliveries before them, which its own limit does not see)."""

    def __init__(
        self,
        name: str,
        dead_letters: str | None,
        queues: tuple[str, ...] | None = None,
        route: Callable[[int], str] | None = None,
        counted: bool = False,
    ) -> None:
        self.name = name
        self.dead_letters = dead_letters
        self.queues = queues or (name,)
        self.route = route or (lambda _priority: name)
        self.counted = counted
        self.cond = threading.Condition(threading.Lock())
        # (-priority, enqueue id, delivery tag, properties, body)
        self.buffer: list[tuple[int, str, int, pika.BasicProperties, bytes]] = []
        # Bumped whenever the channel changes or is lost: a delivery of an older epoch is no longer ours.
        self.epoch = 0
        self.live = False  # consuming on an open channel
        self.ever_live = False
        self.outstanding: dict[int, list] = {}  # delivery tag -> [enqueue id, lease end], handed out
        self.republishing = 0  # redelivered messages whose copy RabbitMQ has not confirmed yet
        # Messages this process gave back to queues that count deliveries and has not received again: a
        # quorum queue takes a message back after answering what the channel asks next, unlike a
        # classic one, so a receive waits a moment for them.
        self.returning = 0
        # This process published to the queue or gave a message back since the last sync: messages may
        # be on their way here that should go out before those the buffer holds.
        self.dirty = False
        self.waiting = 0  # callers in receive
        self.last_asked = 0.0  # when a caller last was (time.monotonic())
        self.paused = False  # stopped consuming while idle; the next receive resumes it
        self.start_lock = threading.Lock()
        self.started = False  # its queues declared and its start handed to the I/O thread
        self.missing = False  # its queue vanished: the next receive declares it again
        # The I/O thread's own.
        self.wanted = False
        self.channel: Any = None
        self.opening = False
        self.tags: list[str] = []  # the consumer tags while consuming
        self.syncs: list[Waiter] = []

    def asking(self, more: int) -> None:
        """A caller starts (+1) or ends (-1) asking for a message. Under `cond`."""
        self.waiting += more
        self.last_asked = time.monotonic()

    def take(self) -> tuple[int, int, pika.BasicProperties, bytes] | None:
        """The best message received (epoch, tag, properties, body), or None. Under `cond`."""
        if not self.buffer:
            return None
        _, _, tag, properties, body = heapq.heappop(self.buffer)
        return self.epoch, tag, properties, body

    def holds(self, handle: Handle) -> bool:
        """Whether the delivery is still this consumer's to settle. Under `cond`."""
        return handle.epoch == self.epoch and self.live and handle.tag in self.outstanding

    def lost_with_channel(self, handle: Handle) -> bool:
        """Whether the delivery went with a lost channel (not with an expired lease). Under `cond`."""
        return handle.epoch != self.epoch or not self.live

    def lose(self) -> None:
        """The channel is gone: RabbitMQ gives its unacknowledged messages to other consumers."""
        with self.cond:
            self.epoch += 1
            self.live = False
            self.buffer.clear()
            self.outstanding.clear()
            self.republishing = self.returning = 0
            self.cond.notify_all()

    # The I/O thread's side.

    def drop_channel(self) -> None:
        """Its channel closed, or the connection with it."""
        self.channel = None
        self.tags = []
        self.opening = False
        self.end_syncs()
        self.lose()

    def settle(self, epoch: int, tag: int, requeue: bool) -> None:
        channel = self.channel
        if self.epoch != epoch or channel is None or not channel.is_open:
            return  # the channel is gone, and RabbitMQ gives the message to a consumer again anyway
        if requeue:
            channel.basic_nack(tag, requeue=True)
        else:
            channel.basic_ack(tag)

    def sync(self, waiter: Waiter) -> None:
        """Answer the number of messages ready in the consumer's queues, asked on its own channel: the
        answer comes after every message RabbitMQ sent this consumer before it, so a message that is
        neither received nor ready is on its way to another self. None without a live channel."""
        channel = self.channel
        if channel is None or not channel.is_open or not self.live:
            waiter.settle(None)
            return
        self.syncs.append(waiter)
        counts: list[int] = []

        def answered(frame: Any) -> None:
            counts.append(frame.method.message_count)
            if len(counts) == len(self.queues) and waiter in self.syncs:
                self.syncs.remove(waiter)
                waiter.settle(sum(counts))

        for name in self.queues:
            channel.queue_declare(name, passive=True, callback=answered)

    def end_syncs(self) -> None:
        syncs, self.syncs = self.syncs, []
        for waiter in syncs:
            waiter.settle(None)
