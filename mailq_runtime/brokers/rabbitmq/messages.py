"""mailq's headers on RabbitMQ messages (the deliveries counted, a dead letter's reason and death), the copies
that carry them, and one line for pika's errors."""

from __future__ import annotations

import pika
import pika.exceptions

from ...clock import Clock
from ...tls import tls_failure

# Message headers of mailq's own: deliveries before this copy of the message was published, and for a
# dead letter, why and when (microseconds since the epoch) the broker gave up on it.
DELIVERIES = "x-mailq-deliveries"
REASON = "x-mailq-reason"
DIED_AT = "x-mailq-died-at"
# RabbitMQ's own count of a quorum queue's message: its returns since it was published.
QUORUM_DELIVERIES = "x-delivery-count"


def describe(error: BaseException) -> str:
    """One line for an error of pika's (which never holds the password)."""
    if isinstance(error, pika.exceptions.ProbableAuthenticationError):
        return "the login was refused (ACCESS_REFUSED): check the user and MAILQ_AMQP_PASSWORD"
    if isinstance(error, pika.exceptions.ProbableAccessDeniedError):
        return "the virtual host was refused: it does not exist, or the user may not use it"
    if isinstance(error, pika.exceptions.ConnectionClosedByBroker | pika.exceptions.ChannelClosedByBroker):
        return f"({error.reply_code}) {error.reply_text}"
    failure = tls_failure(error)
    if failure is not None:
        return failure
    text = str(error)
    # A failed connection workflow nests its causes; the last one is the reason.
    if "last exception - " in text:
        text = text.split("last exception - ", 1)[1].split("; first exception", 1)[0]
    return (text or type(error).__name__)[:300]


def deliveries(properties: pika.BasicProperties) -> int:
    """How many times the message was delivered before this delivery: those before this copy of it was
    published, and those a quorum queue counted since."""
    headers = properties.headers or {}
    return sum(
        int(count)
        for count in (headers.get(DELIVERIES, 0), headers.get(QUORUM_DELIVERIES, 0))
        if isinstance(count, int) and count > 0
    )


def kept(properties: pika.BasicProperties, count: int | None = None) -> pika.BasicProperties:
    """The properties of a copy of a message that keeps its deliveries (`count`, else those it had) in
    mailq's header: RabbitMQ's count of a quorum queue starts again with the copy."""
    headers = {**(properties.headers or {}), DELIVERIES: deliveries(properties) if count is None else count}
    headers.pop(QUORUM_DELIVERIES, None)
    return pika.BasicProperties(
        message_id=properties.message_id,
        delivery_mode=pika.DeliveryMode.Persistent,
        content_type=properties.content_type,
        priority=properties.priority,
        headers=headers,
    )


def redelivery(
    properties: pika.BasicProperties, queue: str, dead_letters: str, limit: int, clock: Clock
) -> tuple[str, pika.BasicProperties]:
    """Where the copy of a message RabbitMQ delivers again goes, and its properties: back to `queue` with
    one more delivery counted, or, once `limit` deliveries are reached, to `dead_letters` with the reason."""
    count = deliveries(properties) + 1
    copy = kept(properties, count)
    if count < limit:
        return queue, copy
    assert copy.headers is not None
    copy.headers[REASON] = (
        f"delivered {count} times without being settled, the broker's delivery limit: its consumers "
        "died, lost their lease or gave it back every time"
    )
    copy.headers[DIED_AT] = clock()
    return dead_letters, copy
