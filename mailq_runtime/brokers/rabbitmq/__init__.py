"""The RabbitMQ broker (pika): record 31's messaging leg for the distributed deployment.

Two designs, chosen by the broker URL's `queues` option (settings.py): classic queues (the default) and
quorum queues, replicated on a cluster.

Objects, per mail queue Q, durable, in the URL's virtual host and declared on first use. Classic: `mailq:Q`,
a classic queue (`x-queue-version` 2) with priorities (`x-max-priority` 9, so mailq's 0..9 are RabbitMQ's
own), and `mailq-dead-letters:Q`, where the messages RabbitMQ delivered too often wait for the queue to
move them into the metadata store's dead letters (`drain_dead_letters`). Quorum: one quorum queue per
priority band, `mailq-quorum-high:Q` (priorities 7-9), `mailq-quorum-normal:Q` (4-6) and
`mailq-quorum-low:Q` (0-3), and the quorum queue `mailq-quorum-dead-letters:Q`. No queue name holds ':',
so two mail queues' objects never meet, and the two designs' names differ, as RabbitMQ refuses to declare
a queue again with another type. Messages are persistent and every publish is confirmed.

Classic queues live on one node: on a cluster a classic queue is unavailable (not lost: its messages are
on disk) while its node is down. Quorum queues are replicated (Raft) on every node of the cluster and
confirm a publish once a majority wrote it, so a queue survives the loss of a minority of the nodes:
its followers elect a leader among themselves and it serves on. Quorum queues have no priorities on 3.10,
hence the bands: a consumer consumes the three on one channel and hands out what it holds by priority,
then enqueue id, so a band's mails always go before a lower band's that were published before them and
are on their way, and within a band RabbitMQ delivers in publish order (a mail of priority 6 waits behind
the priority-4 mails of its band published before it, beyond the consumer's prefetch). The prefetch bounds
each band's queue: a consumer holds up to three times `prefetch` messages.

On RabbitMQ 3.10 a quorum queue survives the loss of a minority of its nodes at any time, and of all of
them once it is about two seconds old; on a single node a quorum queue killed in its first second may never
elect a leader again, where classic queues come back whole (docs/distributed.md, "Quorum queues on a
RabbitMQ cluster", has the runs). So on one node classic queues are the safe choice, and quorum queues are
for a cluster of three or more; mailq declares a mail queue's queues once, at its first use. 3.10 also
crashes its Raft segment writer when a quorum queue is deleted right after heavy writes. What classic
queues lack, mailq does itself:

- Delivery counting and the delivery limit (classic): RabbitMQ marks a message delivered again (its consumer
  died, lost its lease or gave it back; and, after a crash, every message it recovers) but does not count. The
  consumer that receives such a message publishes a copy carrying the count (`x-mailq-deliveries`), then acks
  the original; past `delivery_limit` the copy goes to the dead-letter queue with its reason instead.
  Publish-then-ack is at-least-once: a crash in between leaves a duplicate, never a loss.
- Dead letters: the dead-letter queue is drained into the metadata store by the queue (`MailQueue`), which
  records each letter before it is acked here.

Quorum queues count deliveries themselves (`x-delivery-count`, which also counts a message given back with a
nack): each band's `x-delivery-limit` is `delivery_limit` - 1 returns, past which RabbitMQ moves the message
to the dead-letter queue with `x-dead-letter-strategy` at-least-once (which needs `x-overflow`
reject-publish): the message leaves its queue only once the dead-letter queue confirmed it. A copy this
consumer publishes (an idle consumer's give-back, `published`) carries the count so far in mailq's header, as
RabbitMQ's starts again with the copy; a message whose count in all reaches the limit is dead-lettered by the
consumer as in the classic design. A quorum queue takes a message given back after answering what the channel
asks next, so a receive after a return waits for it to come back (bounded by `waits.SETTLE_WAIT`). A channel
opened while a quorum queue elects a new leader (a link that lost its node and connected to another within
the election) may keep sending to the dead leader: nothing it publishes is confirmed again, and its consumers
get nothing new (seen on 3.10: docs/distributed.md). So a publish to quorum queues
unconfirmed for its whole `publish_timeout` on a live connection drops the connection, and the link connects
again to the next node, whose new channels find the new leader.

Delivery order: RabbitMQ delivers a classic queue by priority, in publish order within one; a consumer keeps
up to `prefetch` messages and hands out what it holds by priority, then enqueue id (creation time), as the
embedded broker does, so a message given back or republished takes its place again among those. After this
process published to a queue or gave a message back, its next receive first catches up with what RabbitMQ sent
it since (a passive declare on the consumer's channel, answered after those messages), so a mail this process
just enqueued is found by a receive(timeout=0). A consumer nobody asked for a message for a second (its
process busy with a long delivery, or done receiving) stops consuming and gives back what it holds, as copies
keeping their count, so it starves no other consumer; the next receive resumes.

Threads: each broker object has one I/O thread (link.py) owning its AMQP connection (pika's
SelectConnection) and every channel on it, started by the first publish or receive; callers hand it work
with `add_callback_threadsafe`, so no two threads ever touch a channel (pika is not thread-safe),
heartbeats are answered while callers spend minutes on a mail, and all publishers share one confirm
stream with many messages in flight. Queues are declared from the caller's thread on a short connection
of its own, so the I/O thread never waits.

Recovery: when the connection or a channel is lost, the I/O thread reconnects with growing, jittered delays,
each attempt to the next node the URL names (the first one chosen at random, so that processes spread over a
cluster), and resumes, and every consumer starts again. Nothing needs a restart. Publishes unconfirmed when
the connection is lost, every publish while the link knows RabbitMQ is away, and a publish still unconfirmed
after `publish_timeout` raise BrokerUnavailable at once: the queue then keeps the mail as a delayed mail due
at once, which the next publisher of due mails hands over once RabbitMQ is back (a copy RabbitMQ did take is a
duplicate, which the view's deletion mark absorbs). A publish nacked on a live channel is sent again.
Deliveries in hand when the connection is lost are RabbitMQ's to deliver again: settling one raises
BrokerUnavailable, which says so, rather than reporting an expired lease; `release` gives a delivery back
without counting it, for a consumer that a failing backend kept from handling it.

Leases: RabbitMQ gives a delivery back when its consumer's channel dies. Besides, a delivery is leased to
its receiver for the visibility timeout on the broker's clock, and `extend` pushes the end; a receive in
the same process gives back the leases that have ended (as the embedded broker's claim takes them), so
until then a lease past its end still settles. RabbitMQ closes a channel whose delivery stays
unacknowledged past its `consumer_timeout` (30 minutes by default on 3.10), which bounds every lease.
"""

from .broker import RabbitMQBroker
from .names import (
    CLASSIC,
    MAX_PRIORITY,
    QUEUE_TYPES,
    QUORUM,
    band_queue,
    dead_letter_queue,
    queue_name,
    rabbitmq_queues,
)
from .options import BrokerOptions

__all__ = [
    "BrokerOptions",
    "CLASSIC",
    "MAX_PRIORITY",
    "QUEUE_TYPES",
    "QUORUM",
    "RabbitMQBroker",
    "band_queue",
    "dead_letter_queue",
    "queue_name",
    "rabbitmq_queues",
]
