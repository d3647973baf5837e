"""The link's confirming publish channel: every publish carried until RabbitMQ confirms it, sent again across
a lost channel, and failed when the connection goes."""

from __future__ import annotations

import logging
from collections import Counter, deque
from typing import Any

import pika
from pika.spec import Basic

from ...errors import BrokerRefused, BrokerUnavailable
from .link_state import LinkState
from .messages import describe
from .publishes import Publish
from .waits import BACKOFF_MAX

log = logging.getLogger(__package__)
ROUTE_LOST = object()  # the outcome of a publish that RabbitMQ confirmed but could not route


class PublishChannel:
    """The publish channel, once in confirm mode, and the publishes on it. Runs on the link's thread."""

    def __init__(self, link: LinkState) -> None:
        self.link = link
        self.channel: Any = None
        self.seq = 0
        self.pending: dict[int, Publish] = {}  # sent, by delivery tag, unconfirmed
        self.unsent: deque[Publish] = deque()
        self.returned: Counter[tuple[str, str]] = Counter()  # (routing key, enqueue id) RabbitMQ returned

    def open(self) -> None:
        self.link.connection.channel(on_open_callback=self._on_channel)

    def _on_channel(self, channel: Any) -> None:
        channel.add_on_close_callback(self._on_closed)
        channel.add_on_return_callback(self._on_return)
        channel.confirm_delivery(self._on_confirm, callback=lambda _frame: self._confirming(channel))

    def _confirming(self, channel: Any) -> None:
        self.channel = channel
        self.seq = 0
        self._flush()

    def _on_closed(self, channel: Any, reason: BaseException) -> None:
        if self.channel is not None and channel is not self.channel:
            return
        self.channel = None
        self._requeue_pending()
        if self.link.connected():
            log.warning(
                "RabbitMQ at %s: publish channel closed (%s), reopening", self.link.target, describe(reason)
            )
            self.link.ioloop.call_later(BACKOFF_MAX / 5, self._reopen)

    def reconnect(self) -> None:
        """A publish went unconfirmed for its whole timeout on a live connection: drop the connection, to
        make it again to the next node. A channel opened while a quorum queue elected a new leader may
        keep sending to the dead one, and nothing it publishes is confirmed any more (seen on 3.10)."""
        if self.link.connected() and self.pending:
            log.warning(
                "RabbitMQ at %s: publishes unconfirmed on a live connection, connecting again",
                self.link.target,
            )
            self.link.connection.close()

    def _reopen(self) -> None:
        if self.link.connected() and self.channel is None:
            self.open()

    def send(self, publish: Publish) -> None:
        if self.link.closing:
            publish.finish(BrokerUnavailable(f"the broker of RabbitMQ at {self.link.target} is closed"))
        elif self.link.refused is not None:
            publish.finish(BrokerRefused(f"RabbitMQ at {self.link.target}: {self.link.refused}"))
        elif self.channel is not None:
            self._basic_publish(publish)
        else:
            self.unsent.append(publish)

    def abandon(self, publish: Publish) -> None:
        publish.abandoned = True

    def _flush(self) -> None:
        while self.unsent and self.channel is not None and self.channel.is_open:
            publish = self.unsent.popleft()
            if not publish.abandoned:
                self._basic_publish(publish)

    def _basic_publish(self, publish: Publish) -> None:
        if not self.channel.is_open:
            self.unsent.appendleft(publish)  # closing: its close callback reopens one and sends again
            return
        # Mandatory: a message no queue takes (a queue deleted behind our back) comes back instead of
        # being confirmed and dropped.
        self.channel.basic_publish(
            "", publish.routing_key, publish.body, properties=publish.properties, mandatory=True
        )
        self.seq += 1
        self.pending[self.seq] = publish

    def _on_return(self, channel: Any, method: Any, properties: pika.BasicProperties, body: bytes) -> None:
        self.returned[(method.routing_key, properties.message_id)] += 1

    def _on_confirm(self, frame: Any) -> None:
        method = frame.method
        confirmed = isinstance(method, Basic.Ack)
        if method.multiple:
            tags = []
            for tag in self.pending:  # in the order sent
                if tag > method.delivery_tag:
                    break
                tags.append(tag)
        else:
            tags = [method.delivery_tag]
        for tag in tags:
            publish = self.pending.pop(tag, None)
            if publish is None:
                continue
            key = (publish.routing_key, publish.enqueue_id)
            if confirmed and self.returned[key]:
                self.returned[key] -= 1
                publish.finish(ROUTE_LOST)
            elif confirmed:
                publish.finish(None)
            elif not publish.abandoned:
                self.unsent.append(publish)  # nacked: RabbitMQ could not take it, send it again
        self._flush()

    def _requeue_pending(self) -> None:
        """Publishes sent on a lost channel may or may not have arrived: send the callers' again, first.
        The I/O thread's own copies are dropped: RabbitMQ delivers their originals again."""
        again = [p for p in self.pending.values() if not p.abandoned and p.confirmed is None]
        self.unsent = deque(p for p in self.unsent if p.confirmed is None)
        self.pending.clear()
        self.returned.clear()
        self.unsent.extendleft(reversed(again))

    def fail_waiting(self, error: BrokerUnavailable) -> None:
        for publish in [*self.pending.values(), *self.unsent]:
            if publish.confirmed is None:
                publish.finish(error)
        self.pending.clear()
        self.unsent.clear()
        self.returned.clear()
