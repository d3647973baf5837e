"""The link's consumers: a channel each, fed by RabbitMQ, the deliveries counted, an idle consumer's
messages given back, and the syncs that tell a receive what is still on its way. Runs on the link's
thread."""

from __future__ import annotations

import heapq
import logging
import time
from collections.abc import Callable
from functools import partial
from typing import Any

import pika
import pika.exceptions

from .consumer import Consumer
from .link_state import LinkState
from .messages import deliveries, describe, kept, redelivery
from .publish_channel import PublishChannel
from .publishes import Publish, Waiter
from .waits import BACKOFF_MAX, IDLE

log = logging.getLogger(__package__)


class ConsumerChannels:
    def __init__(self, link: LinkState, publishing: PublishChannel) -> None:
        self.link = link
        self.publishing = publishing
        self.consumers: dict[str, Consumer] = {}
        self.idle_timer: Any = None

    def watch_idle(self) -> None:
        if self.idle_timer is None:
            self.idle_timer = self.link.ioloop.call_later(IDLE / 2, self._check_idle)

    def open_wanted(self) -> None:
        for consumer in self.consumers.values():
            if consumer.wanted:
                self._open_consumer(consumer)

    def wake_all(self) -> None:
        for consumer in self.consumers.values():
            with consumer.cond:
                consumer.cond.notify_all()

    def connection_lost(self) -> None:
        for consumer in self.consumers.values():
            consumer.drop_channel()

    def stop(self) -> None:
        for consumer in self.consumers.values():
            consumer.wanted = False
            consumer.end_syncs()
            consumer.lose()
        if self.idle_timer is not None:
            self.link.ioloop.remove_timeout(self.idle_timer)

    def consume(self, consumer: Consumer) -> None:
        consumer.wanted = True
        self.consumers[consumer.name] = consumer
        if self.link.connected() and consumer.channel is None and not consumer.opening:
            self._open_consumer(consumer)

    def _open_consumer(self, consumer: Consumer) -> None:
        consumer.opening = True
        self.link.connection.channel(on_open_callback=partial(self._on_consumer_channel, consumer))

    def _on_consumer_channel(self, consumer: Consumer, channel: Any) -> None:
        consumer.opening = False
        if not consumer.wanted or self.link.closing:
            channel.close()
            return
        consumer.channel = channel
        channel.add_on_close_callback(partial(self._on_consumer_channel_closed, consumer))
        # RabbitMQ cancels a consumer whose queue was deleted: closing the channel restarts it.
        # (One cancel per queue of its own: the first closes it.)
        channel.add_on_cancel_callback(lambda _frame: channel.close() if channel.is_open else None)
        channel.basic_qos(
            prefetch_count=self.link.prefetch, callback=partial(self._on_qos, consumer, channel)
        )

    def _on_qos(self, consumer: Consumer, channel: Any, _frame: Any) -> None:
        if channel is not consumer.channel:
            return
        with consumer.cond:
            consumer.epoch += 1
            consumer.paused = False
        self._start_consuming(consumer)

    def _start_consuming(self, consumer: Consumer) -> None:
        epoch = consumer.epoch
        # One channel for all of them: its delivery tags tell their messages apart, and one prefetch
        # per queue bounds what it holds.
        consumer.tags = [
            consumer.channel.basic_consume(
                name,
                partial(self._on_message, consumer, epoch),
                callback=partial(self._on_consuming, consumer, epoch),
            )
            for name in consumer.queues
        ]

    def _on_consuming(self, consumer: Consumer, epoch: int, _frame: Any) -> None:
        # Live from the first queue's consume-ok: its messages may come before the others' answers.
        with consumer.cond:
            if epoch == consumer.epoch:
                consumer.live = consumer.ever_live = True
                consumer.cond.notify_all()

    def resume(self, consumer: Consumer) -> None:
        """Consume again after an idle pause."""
        channel = consumer.channel
        with consumer.cond:
            if not consumer.paused or channel is None or not channel.is_open:
                return
            consumer.paused = False
        self._start_consuming(consumer)

    def _check_idle(self) -> None:
        self.idle_timer = None
        if self.link.closing:
            return
        now = time.monotonic()
        for consumer in self.consumers.values():
            channel = consumer.channel
            with consumer.cond:
                idle = consumer.waiting == 0 and now - consumer.last_asked > IDLE
                if not idle or consumer.paused or not consumer.live or not consumer.tags:
                    continue
                consumer.paused = True
                held, consumer.buffer = consumer.buffer, []
                epoch = consumer.epoch
            self._cancel(consumer, channel, epoch, held)
        self.idle_timer = self.link.ioloop.call_later(IDLE / 2, self._check_idle)

    def _cancel(self, consumer: Consumer, channel: Any, epoch: int, held: list) -> None:
        """Stop consuming, then give back the messages `held` as copies, once RabbitMQ confirmed every
        cancel: a copy delivered to this consumer before its cancel arrived would be rejected by pika,
        which a quorum queue counts as a delivery."""
        tags, consumer.tags = consumer.tags, []
        left = [len(tags)]

        def cancelled(_frame: Any) -> None:
            left[0] -= 1
            if left[0]:
                return
            for _, _, tag, properties, body in held:
                route = consumer.route(properties.priority or 0)
                self._send_copy(consumer, epoch, tag, route, kept(properties), body)

        for consumer_tag in tags:
            channel.basic_cancel(consumer_tag, callback=cancelled)

    def _on_message(
        self,
        consumer: Consumer,
        epoch: int,
        channel: Any,
        method: Any,
        properties: pika.BasicProperties,
        body: bytes,
    ) -> None:
        tag = method.delivery_tag
        if consumer.dead_letters is not None and (
            deliveries(properties) >= self.link.delivery_limit if consumer.counted else method.redelivered
        ):
            # Its consumer died, lost its lease, gave it back, or RabbitMQ restarted: RabbitMQ does not
            # count deliveries of a classic queue, so the copy that replaces it carries the count. (A
            # quorum queue's message gets here only past the limit, counting its copies' deliveries.)
            routing_key, copy = redelivery(
                properties,
                consumer.route(properties.priority or 0),
                consumer.dead_letters,
                self.link.delivery_limit,
                self.link.clock,
            )
            self._send_copy(consumer, epoch, tag, routing_key, copy, body)
            return
        with consumer.cond:
            if epoch != consumer.epoch:
                return  # from a channel given up on: RabbitMQ delivers it again
            if method.redelivered and consumer.returning:
                consumer.returning -= 1
                if not consumer.returning:
                    consumer.cond.notify_all()  # a catching-up receive waits for them
            if not consumer.paused:
                entry = (-(properties.priority or 0), properties.message_id or "", tag)
                heapq.heappush(consumer.buffer, (*entry, properties, body))
                consumer.cond.notify()
                return
        route = consumer.route(properties.priority or 0)
        self._send_copy(consumer, epoch, tag, route, kept(properties), body)  # sent before the pause

    def _send_copy(
        self,
        consumer: Consumer,
        epoch: int,
        tag: int,
        routing_key: str,
        copy: pika.BasicProperties,
        body: bytes,
        then: Callable[[object], None] | None = None,
    ) -> None:
        """Replace a message this consumer received by a copy, then ack the original once the copy is
        confirmed (and call `then`): how a delivery is counted, and how an idle consumer gives back what
        it holds (the count kept), without RabbitMQ marking it delivered again."""
        with consumer.cond:
            if epoch != consumer.epoch:
                return
            consumer.republishing += 1

        def confirmed() -> None:
            with consumer.cond:
                if epoch != consumer.epoch:
                    return  # the channel was lost: RabbitMQ delivers the original again
                consumer.republishing -= 1
                consumer.dirty = True
                consumer.cond.notify_all()
            consumer.settle(epoch, tag, requeue=False)
            if then is not None:
                then(None)

        self.publishing.send(Publish(routing_key, copy.message_id or "", body, copy, confirmed))

    def give_back(
        self,
        consumer: Consumer,
        epoch: int,
        tag: int,
        properties: pika.BasicProperties,
        body: bytes,
        waiter: Waiter,
    ) -> None:
        """Give a handed-out message back uncounted, as a copy keeping its count; `waiter` learns when
        the original is acked (or never, with the channel lost: RabbitMQ delivers the original again)."""
        route = consumer.route(properties.priority or 0)
        self._send_copy(consumer, epoch, tag, route, kept(properties), body, then=waiter.settle)

    def _on_consumer_channel_closed(self, consumer: Consumer, channel: Any, reason: BaseException) -> None:
        if channel is not consumer.channel:
            return
        consumer.drop_channel()
        if isinstance(reason, pika.exceptions.ChannelClosedByBroker) and reason.reply_code == 404:
            # Its queue is gone: the next receive declares it again and restarts the consumer.
            consumer.wanted = False
            with consumer.cond:
                consumer.missing = True
                consumer.cond.notify_all()
        elif consumer.wanted and self.link.connected():
            log.warning(
                "RabbitMQ at %s: consumer channel of %s closed (%s), reopening",
                self.link.target,
                consumer.name,
                describe(reason),
            )
            self.link.ioloop.call_later(BACKOFF_MAX / 5, partial(self._reopen_consumer, consumer))

    def _reopen_consumer(self, consumer: Consumer) -> None:
        if consumer.wanted and consumer.channel is None and not consumer.opening and self.link.connected():
            self._open_consumer(consumer)
