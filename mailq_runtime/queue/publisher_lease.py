"""Which process of a deployment publishes a queue's due delayed mails: the one holding its lease.

Every waiting consumer looks for due delayed mails once a second. Where the store and the broker are not
one transaction (Cassandra, or RabbitMQ beside either store), two processes that read the same due rows
before either removed them would both publish them, and two consumers would each deliver the mail: a
duplicate with no fault at all. So only the process holding the queue's lease looks; the others leave
the due mails to it. The lease is a slot of the store's destination slots (the table relay/limits.py
keeps its connection slots in), one slot under a name no domain can have, taken for LEASE and renewed at
a look once a third of it has passed: a holder that dies hands the looks over within LEASE, one that
closes its runtime at once."""

from __future__ import annotations

import logging
import time
import uuid

from ..clock import MICROS_PER_SECOND, Clock
from ..stores.protocols import Destinations

log = logging.getLogger(__name__)

LEASE = 10 * MICROS_PER_SECOND
# The destination the lease of a queue is a slot of: a space, so no domain's name.
LEASE_DESTINATION = "delayed mails of queue {}"


class PublisherLease:
    """The lease of queue `queue_name`'s looks for due delayed mails, held by this process or not."""

    def __init__(self, destinations: Destinations, queue_name: str, clock: Clock) -> None:
        self.destinations = destinations
        self.clock = clock
        self._name = LEASE_DESTINATION.format(queue_name)
        self._holder = uuid.uuid4().hex
        self._slot: int | None = None
        self._taken_at = 0.0  # time.monotonic() at the last take or renewal

    def held(self) -> bool:
        """Whether this process looks now: its lease holds (renewed once a third of it has passed), or it
        took the lease, free or run out."""
        started = time.monotonic()
        if self._slot is not None:
            if started < self._taken_at + LEASE / MICROS_PER_SECOND / 3:
                return True
            if self.destinations.renew_slot(self._name, self._slot, self._holder, self.clock(), LEASE):
                self._taken_at = started
                return True
            self._slot = None
        self._slot = self.destinations.take_slot(self._name, 1, self._holder, self.clock(), LEASE)
        self._taken_at = started
        return self._slot is not None

    def release(self) -> None:
        """Hand the looks over at once (the runtime closes)."""
        if self._slot is None:
            return
        slot, self._slot = self._slot, None
        try:
            self.destinations.free_slot(self._name, slot, self._holder)
        except Exception as error:
            # No longer renewed, the lease runs out within LEASE anyway.
            log.warning("could not hand over the looks for delayed mails: %s", error)
