"""The RabbitMQ objects of a mail queue, in either design (classic or quorum queues): see the package."""

from __future__ import annotations

MAX_PRIORITY = 9

CLASSIC, QUORUM = "classic", "quorum"
QUEUE_TYPES = (CLASSIC, QUORUM)
# The quorum design's priority bands, highest first: the lowest priority each takes, and its name.
BANDS = ((7, "high"), (4, "normal"), (0, "low"))


def queue_name(queue: str) -> str:
    return f"mailq:{queue}"


def dead_letter_queue(queue: str) -> str:
    return f"mailq-dead-letters:{queue}"


def band_queue(queue: str, priority: int) -> str:
    """The quorum queue holding mail queue `queue`'s messages of `priority`."""
    band = next(name for lowest, name in BANDS if priority >= lowest)
    return f"mailq-quorum-{band}:{queue}"


def rabbitmq_queues(queue: str, queue_type: str = CLASSIC) -> tuple[tuple[str, ...], str]:
    """The RabbitMQ queues of mail queue `queue`: those of its messages (highest band first), and its
    dead letters'."""
    if queue_type == QUORUM:
        bands = tuple(band_queue(queue, lowest) for lowest, _ in BANDS)
        return bands, f"mailq-quorum-dead-letters:{queue}"
    return (queue_name(queue),), dead_letter_queue(queue)
