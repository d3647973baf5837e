"""The queue on the whole distributed deployment with RabbitMQ's own dead letters: a mail whose
consumers all die (or lose their lease) reaches the metadata store's dead letters at the broker's
delivery limit, with the broker's reason, and is requeued from there like any dead letter."""

from __future__ import annotations

from mailq_runtime import Runtime
from mailq_runtime.clock import to_datetime
from mailq_servers.rabbitmq import RabbitMQServer
from tests.runtime.helpers import FakeClock, make_mail

from .conftest import Deployment


def test_a_mail_whose_consumers_never_settle_it_is_dead_lettered_with_the_brokers_reason(
    deployment: Deployment, rabbitmq_server: RabbitMQServer, vhost: str
):
    clock = FakeClock()
    url = deployment.url(rabbitmq_server, vhost)
    with Runtime.open(url(visibility_timeout="10s"), clock=clock, create=True) as runtime:
        queue = runtime.queue("poison")
        enqueue_id = queue.enqueue(make_mail("poison"))
        limit = runtime.broker.delivery_limit
        for attempt in range(1, limit + 1):
            item = queue.dequeue(timeout=5)
            assert (item.enqueue_id, item.attempts) == (enqueue_id, attempt)
            clock.advance(11)  # its consumer died: the lease ends unsettled
        assert queue.dequeue(timeout=1) is None
        (letter,) = queue.dead_letters.list()
        assert letter.enqueue_id == enqueue_id and letter.name == "poison"
        assert f"delivered {limit} times without being settled" in letter.reason
        assert letter.died_at == to_datetime(clock())
        assert queue.size() == 0 and list(queue.browse()) == []

        (requeued,) = queue.dead_letters.requeue(enqueue_id)
        item = queue.dequeue(timeout=5)
        assert (item.enqueue_id, item.attempts, item.mail.name) == (requeued, 1, "poison")
        item.done()
        assert queue.dead_letters.list() == [] and queue.size() == 0
