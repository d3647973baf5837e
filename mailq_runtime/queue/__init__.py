"""The mail queue of records 31 and 32: enqueue, dequeue, browse, size, remove, clear, flush, republish,
and the dead letters.

Content goes to the deduplicating blob store (owner: the enqueue id), the mail's row to the time series
`enqueued_mails` (queue, slice, bucket), the delivery to the broker, or, while it waits for a delay, to
the delayed mails of the metadata store. A dequeue is a broker delivery checked against `deleted_mails`;
browse and size read the view from `browse_start` on. Mails that will not be delivered become dead
letters, records of the metadata store that an operator lists, requeues or purges.

`MailQueue` is a thin face over collaborators, one module each, as James's queue-rabbitmq: the enqueuer,
the dequeuer and its items' settlement, hold and release, the delayed-mail publisher, the dead-letter
office, browse_start and record 32's clean-up, the view (browse, size, remove, clear, republish), the
suspensions and the overviews. They share a `QueueContext` (the queue's name, clock and configuration)
and each takes the backends it uses by name, as James's take their DAOs; `MailQueue` assembles them from
the deployment's `QueueBackends`, forwards the queue's own contract to them, and offers the others as
sub-facades (`queue.holds`, `queue.dead_letters`, `queue.suspensions`, `queue.overviews`,
`queue.maintenance`, `queue.publisher`).

No path assumes a transaction across its writes: each call to a store or the broker commits on its own,
and each path writes in an order where a crash leaves only what a later step heals (its docstring says
which). The deployment's unit of work may group one operation's writes and hold the store over a whole
operation, for speed (unit_of_work.py); nothing here depends on either.
"""

from .context import QueueBackends, QueueContext, slice_of
from .dead_letters import DeadLetterItem
from .delays import PUBLISH_INTERVAL
from .dequeuer import MailQueueItem
from .destinations import BUCKET_NAMES, STATES, DomainShape
from .enqueuer import check_enqueue
from .holds import HeldItem
from .mail_queue import MailQueue
from .mail_view import BrowseItem
from .overview import QueueOverview

__all__ = [
    "BUCKET_NAMES",
    "STATES",
    "DomainShape",
    "PUBLISH_INTERVAL",
    "BrowseItem",
    "DeadLetterItem",
    "HeldItem",
    "MailQueue",
    "MailQueueItem",
    "QueueBackends",
    "QueueContext",
    "QueueOverview",
    "check_enqueue",
    "slice_of",
]
