"""The leases on the deliveries this process holds: settling one (ack, requeue, release) and extending it."""

from __future__ import annotations

from functools import partial

from ...errors import BrokerUnavailable
from ..base import Delivery
from .consumer import Handle
from .publishes import Waiter
from .session import Session
from .waits import GIVE_BACK_WAIT


class Leases:
    def __init__(self, session: Session) -> None:
        self.session = session

    def ack(self, delivery: Delivery) -> bool:
        return self._settle(delivery, requeue=False)

    def requeue(self, delivery: Delivery) -> bool:
        """Give the message back, deliverable again at once; each return counts towards the delivery limit."""
        return self._settle(delivery, requeue=True)

    def release(self, delivery: Delivery) -> bool:
        """Give the message back uncounted: a copy keeping its count replaces it."""
        handle = self._let_go(delivery, stirred=True, returned=False)
        if handle is None:
            return False
        link = self.session.started()
        waiter = Waiter()
        link.submit(
            partial(
                link.consuming.give_back,
                handle.consumer,
                handle.epoch,
                handle.tag,
                handle.properties,
                handle.body,
                waiter,
            )
        )
        # Once the copy is confirmed and the original acked, so that a process closing right after leaves
        # one message, not two. A connection lost meanwhile makes RabbitMQ deliver the original again.
        waiter.wait(GIVE_BACK_WAIT)
        return True

    def extend(self, delivery: Delivery, until: int) -> bool:
        handle: Handle = delivery.handle
        consumer = handle.consumer
        with consumer.cond:
            if not self._holds(delivery):
                return False
            consumer.outstanding[handle.tag][1] = until
            return True

    def _settle(self, delivery: Delivery, requeue: bool) -> bool:
        handle = self._let_go(delivery, stirred=requeue, returned=requeue)
        if handle is None:
            return False
        # Not waited for: AMQP answers no ack, and one sent just before a connection dies is lost all the
        # same, the message then being delivered again (at-least-once).
        link = self.session.started()
        link.submit(partial(handle.consumer.settle, handle.epoch, handle.tag, requeue))
        return True

    def _let_go(self, delivery: Delivery, *, stirred: bool, returned: bool) -> Handle | None:
        """Take the delivery out of its consumer's leases; None if its lease no longer holds. `stirred`:
        the consumer's next receive catches up first; `returned`: it goes back to a queue that counts it."""
        handle: Handle = delivery.handle
        consumer = handle.consumer
        with consumer.cond:
            if not self._holds(delivery):
                return None
            del consumer.outstanding[handle.tag]
            consumer.dirty = consumer.dirty or stirred
            if returned and consumer.counted:
                consumer.returning += 1
        return handle

    def _holds(self, delivery: Delivery) -> bool:
        """Whether the delivery's lease holds; raises BrokerUnavailable when it went with a lost channel,
        as RabbitMQ then delivers the message again without any lease having expired. Under `cond`."""
        handle: Handle = delivery.handle
        if handle.consumer.holds(handle):
            return True
        if handle.consumer.lost_with_channel(handle):
            what = "this broker was closed" if self.session.closed else "the connection was lost"
            raise BrokerUnavailable(
                f"RabbitMQ at {self.session.target}: {what} while mail {delivery.enqueue_id} was in hand, "
                "and RabbitMQ delivers it again"
            )
        return False
