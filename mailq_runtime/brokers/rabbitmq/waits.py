"""How long the RabbitMQ broker waits, in seconds, for what."""

from __future__ import annotations

# Reconnecting, and reopening a closed channel (a fifth of the longest backoff).
BACKOFF_FIRST, BACKOFF_MAX = 0.25, 5.0
# A consumer nobody has asked for a message for this long stops consuming and gives back what it holds, so
# that a process busy with a long delivery, or done receiving, starves no other consumer.
IDLE = 1.0
# The first receive on a queue waits this long for its consumer to start, whatever its timeout: the
# start is a few round trips, and a receive(timeout=0) on a queue holding mails should find them.
START_WAIT = 5.0
# How long a receive that found nothing waits, past its timeout, for messages it knows are on their way
# (ready in the queue while it has room, or being counted again): a bound, reached only under load.
SETTLE_WAIT = 5.0
SYNC_WAIT = 10.0
GIVE_BACK_WAIT = 5.0
# How long counting a queue's messages retries an unreachable RabbitMQ: an operator's look, not a mail.
COUNT_WAIT = 5.0
