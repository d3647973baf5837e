"""The RabbitMQ broker against the harness's real node, in a virtual host of each test's own: deliveries,
priorities, requeue and delivery counting, prefetch, consumer death, leases, poison messages and the dead
letters, browsing, refused credentials and queues deleted behind the broker's back."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pika
import pytest

from mailq_runtime.brokers.base import BrokerDeadLetter
from mailq_runtime.brokers.rabbitmq import BrokerOptions, RabbitMQBroker, rabbitmq_queues
from mailq_runtime.clock import MICROS_PER_SECOND, system_clock
from mailq_runtime.errors import BrokerRefused, BrokerUnavailable
from mailq_servers.rabbitmq import RabbitMQServer

from .conftest import Brokers

REPOSITORY = Path(__file__).resolve().parents[2]
QUEUE = "spool"


def take_all(broker: RabbitMQBroker, queue: str = QUEUE, timeout: float = 0) -> list[str]:
    """Receive and ack until nothing is deliverable; the enqueue ids in the order received."""
    taken = []
    while (delivery := broker.receive(queue, timeout)) is not None:
        assert broker.ack(delivery)
        taken.append(delivery.enqueue_id)
    return taken


def channel_of(server: RabbitMQServer, vhost: str):
    parameters = server.connection_parameters()
    parameters.virtual_host = vhost
    return pika.BlockingConnection(parameters)


def test_publish_receive_ack_round_trip(brokers: Brokers):
    broker = brokers()
    payloads = {f"e{n}": f'{{"v": 1, "n": {n}, "text": "été ✉"}}' for n in range(3)}
    for enqueue_id, payload in payloads.items():
        broker.publish(QUEUE, enqueue_id, payload, 5)

    for enqueue_id, payload in payloads.items():
        delivery = broker.receive(QUEUE, 0)  # published by this process: found at once
        assert (delivery.queue, delivery.enqueue_id, delivery.payload, delivery.attempts) == (
            QUEUE,
            enqueue_id,
            payload,
            1,
        )
        assert broker.extend(delivery, system_clock() + 60 * MICROS_PER_SECOND)
        assert broker.ack(delivery)
        assert not broker.ack(delivery), "a delivery is acked once"
        assert not broker.extend(delivery, system_clock()), "an acked delivery holds no lease"
    assert broker.receive(QUEUE, 0) is None
    # The acks reached RabbitMQ: a consumer of another connection finds nothing either.
    assert brokers().receive(QUEUE, 1) is None


def test_a_timed_receive_on_an_empty_queue_waits_its_timeout(brokers: Brokers):
    broker = brokers()
    assert broker.receive(QUEUE, 0) is None  # its consumer starts
    started = time.monotonic()
    assert broker.receive(QUEUE, 0.5) is None
    assert 0.45 <= time.monotonic() - started < 3


def test_many_threads_publish_through_one_connection(brokers: Brokers):
    broker = brokers()
    ids = [f"t{thread}-{n}" for thread in range(8) for n in range(40)]

    def publish(thread: int) -> None:
        for n in range(40):
            broker.publish(QUEUE, f"t{thread}-{n}", "{}", 5)

    threads = [threading.Thread(target=publish, args=(thread,)) for thread in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert sorted(take_all(broker)) == sorted(ids)


def test_priorities_go_out_highest_first_then_in_enqueue_order(brokers: Brokers):
    publisher, consumer = brokers(), brokers()
    mails = [("e1", 1), ("e2", 9), ("e3", 5), ("e4", 7), ("e5", 0), ("e6", 9), ("e7", 6)]
    for enqueue_id, priority in mails:
        publisher.publish(QUEUE, enqueue_id, "{}", priority)
    assert take_all(consumer) == ["e2", "e6", "e4", "e7", "e3", "e1", "e5"]


def test_a_consumer_holding_low_priority_mails_hands_out_a_later_urgent_one_first(brokers: Brokers):
    broker = brokers()
    for n in range(3):
        broker.publish(QUEUE, f"low{n}", "{}", 0)
    first = broker.receive(QUEUE, 0)
    assert first.enqueue_id == "low0"
    broker.publish(QUEUE, "urgent", "{}", 9)  # the consumer holds low1 and low2 already (prefetch 50)
    assert take_all(broker) == ["urgent", "low1", "low2"]
    assert broker.ack(first)


def test_requeue_gives_the_message_back_with_its_deliveries_counted(brokers: Brokers):
    broker = brokers()
    broker.publish(QUEUE, "again", "{}", 5)
    broker.publish(QUEUE, "later", "{}", 5)
    delivery = broker.receive(QUEUE, 0)
    assert (delivery.enqueue_id, delivery.attempts) == ("again", 1)
    assert broker.requeue(delivery)
    assert not broker.ack(delivery), "a requeued delivery is no longer this consumer's"
    assert not broker.extend(delivery, system_clock())
    assert not broker.requeue(delivery)

    # Once RabbitMQ has sent it back (the later one may be here already, prefetched), its place again:
    # before the later one.
    deadline = time.monotonic() + 10
    while ("again", None) not in broker.held(QUEUE):
        assert time.monotonic() < deadline, broker.held(QUEUE)
        time.sleep(0.05)
    again = broker.receive(QUEUE, 0)
    assert (again.enqueue_id, again.attempts) == ("again", 2)
    assert broker.ack(again)
    assert take_all(broker) == ["later"]


def test_prefetch_bounds_what_a_consumer_holds_and_unacked_mails_stay_its_own(brokers: Brokers):
    holder, other = brokers(prefetch=2), brokers()
    ids = [f"m{n}" for n in range(6)]
    for enqueue_id in ids:
        holder.publish(QUEUE, enqueue_id, "{}", 5)

    first = holder.receive(QUEUE, 0)  # the holder now has two mails: this one, and one waiting in it
    taken_by_other = take_all(other)
    assert len(taken_by_other) == 4, "the holder keeps no more than its prefetch"
    assert other.receive(QUEUE, 1) is None, "mails received and not acked are nobody else's"

    second = holder.receive(QUEUE, 0)
    assert sorted([first.enqueue_id, second.enqueue_id, *taken_by_other]) == ids
    assert holder.ack(first) and holder.ack(second)
    assert other.receive(QUEUE, 1) is None


def test_a_consumer_nobody_asks_gives_back_what_it_holds_with_its_count_kept(brokers: Brokers):
    busy, idle = brokers(), brokers()
    for n in range(5):
        busy.publish(QUEUE, f"m{n}", "{}", 5)
    in_hand = busy.receive(QUEUE, 0)  # the other four wait in its buffer
    assert len(busy.held(QUEUE)) == 5
    time.sleep(2)  # a long delivery: nobody asks the busy consumer for more
    assert busy.held(QUEUE) == [(in_hand.enqueue_id, busy.held(QUEUE)[0][1])], "it keeps only its lease"
    taken = []
    while (delivery := idle.receive(QUEUE, 2)) is not None:
        taken.append((delivery.enqueue_id, delivery.attempts))
        idle.ack(delivery)
    assert taken == [(f"m{n}", 1) for n in range(1, 5)], "given back in order, delivered once"
    assert busy.ack(in_hand)
    busy.publish(QUEUE, "next", "{}", 5)
    assert busy.receive(QUEUE, 5).enqueue_id == "next", "asked again, it consumes again"


def test_a_lease_ends_on_the_brokers_clock_and_a_receive_gives_it_to_another_consumer(brokers: Brokers):
    now = [1_000 * MICROS_PER_SECOND]
    broker = brokers(clock=lambda: now[0], visibility_timeout=10 * MICROS_PER_SECOND)
    broker.publish(QUEUE, "slow", "{}", 5)
    slow = broker.receive(QUEUE, 0)
    now[0] += 9 * MICROS_PER_SECOND
    assert broker.receive(QUEUE, 0) is None, "leased for 10 s"
    assert broker.extend(slow, now[0] + 5 * MICROS_PER_SECOND)
    now[0] += 4 * MICROS_PER_SECOND
    assert broker.receive(QUEUE, 0) is None, "extended by 5 s"
    now[0] += 2 * MICROS_PER_SECOND
    taken = broker.receive(QUEUE, 0)
    assert (taken.enqueue_id, taken.attempts) == ("slow", 2)
    assert not broker.ack(slow) and not broker.extend(slow, now[0])
    assert broker.ack(taken)


def test_a_lease_past_its_end_that_nobody_took_still_settles(brokers: Brokers):
    now = [1_000 * MICROS_PER_SECOND]
    broker = brokers(clock=lambda: now[0], visibility_timeout=10 * MICROS_PER_SECOND)
    broker.publish(QUEUE, "late", "{}", 5)
    delivery = broker.receive(QUEUE, 0)
    now[0] += 60 * MICROS_PER_SECOND
    assert broker.ack(delivery)
    assert broker.receive(QUEUE, 0) is None


CONSUMER = """
import os, sys, time
from mailq_runtime.brokers.rabbitmq import BrokerOptions, RabbitMQBroker
host, port, vhost, user, queue, queue_type = sys.argv[1:]
password = os.environ["MAILQ_AMQP_PASSWORD"]
broker = RabbitMQBroker(BrokerOptions(host, int(port), vhost, user, password, queue_type=queue_type))
delivery = broker.receive(queue, 30)
print(delivery.enqueue_id, flush=True)
time.sleep(120)
"""


def test_a_consumer_that_dies_without_ack_has_its_mail_redelivered_to_another(
    brokers: Brokers, rabbitmq_server: RabbitMQServer, vhost: str, queue_type: str
):
    survivor = brokers()
    survivor.publish(QUEUE, "orphan", "{}", 5)
    server = rabbitmq_server
    dying = subprocess.Popen(
        [
            sys.executable,
            "-c",
            CONSUMER,
            server.host,
            str(server.port),
            vhost,
            server.username,
            QUEUE,
            queue_type,
        ],
        env={**os.environ, "PYTHONPATH": str(REPOSITORY), "MAILQ_AMQP_PASSWORD": server.password},
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert dying.stdout.readline().strip() == "orphan"
        assert survivor.receive(QUEUE, 1) is None, "the mail is the other consumer's while it lives"
    finally:
        dying.send_signal(signal.SIGKILL)
        dying.wait(30)

    delivery = survivor.receive(QUEUE, 30)
    assert (delivery.enqueue_id, delivery.attempts) == ("orphan", 2)
    assert survivor.ack(delivery)


def test_a_closed_consumer_gives_back_what_it_held_and_its_acks_fail(brokers: Brokers):
    first, second = brokers(), brokers()
    first.publish(QUEUE, "held", "{}", 5)
    delivery = first.receive(QUEUE, 0)
    first.close()
    # Not an expired lease: the delivery went with the connection, and RabbitMQ delivers it again.
    with pytest.raises(BrokerUnavailable, match="closed while mail held was in hand"):
        first.ack(delivery)
    again = second.receive(QUEUE, 30)
    assert (again.enqueue_id, again.attempts) == ("held", 2)
    assert second.ack(again)


def collect_dead_letters(broker: RabbitMQBroker, expected: int) -> list[BrokerDeadLetter]:
    letters: list[BrokerDeadLetter] = []
    deadline = time.monotonic() + 20
    # The last return's copy goes to the dead letters once RabbitMQ confirms it: poll until it arrived.
    while len(letters) < expected and time.monotonic() < deadline:
        broker.drain_dead_letters(QUEUE, letters.extend)
        time.sleep(0.05)
    return letters


def test_a_poison_message_reaches_the_dead_letters_with_its_reason_at_the_delivery_limit(brokers: Brokers):
    broker = brokers(delivery_limit=3)
    broker.publish(QUEUE, "poison", '{"v": 1}', 9)
    broker.publish(QUEUE, "fine", '{"v": 1}', 5)
    attempts = []
    while (delivery := broker.receive(QUEUE, 0)) is not None:
        if delivery.enqueue_id == "fine":
            assert broker.ack(delivery)
            continue
        attempts.append(delivery.attempts)
        assert broker.requeue(delivery)  # as a consumer dying on it would, every time
    assert attempts == [1, 2, 3], "delivered up to the limit of 3, then dead"

    started = system_clock()
    (letter,) = collect_dead_letters(broker, 1)
    assert (letter.queue, letter.enqueue_id, letter.payload) == (QUEUE, "poison", '{"v": 1}')
    assert "delivered 3 times without being settled" in letter.reason and "delivery limit" in letter.reason
    assert started - 60 * MICROS_PER_SECOND < letter.died_at <= system_clock()
    assert broker.drain_dead_letters(QUEUE, letters_must_not_come) == 0, "drained letters are acked"


def letters_must_not_come(letters: list[BrokerDeadLetter]) -> None:
    raise AssertionError(f"unexpected dead letters {letters}")


def test_dead_letters_stay_in_rabbitmq_until_kept(brokers: Brokers):
    broker = brokers(delivery_limit=1)
    broker.publish(QUEUE, "poison", "{}", 5)
    delivery = broker.receive(QUEUE, 0)
    broker.requeue(delivery)
    assert broker.receive(QUEUE, 0) is None

    def crash(letters: list[BrokerDeadLetter]) -> None:
        raise RuntimeError("the metadata store is down")

    deadline = time.monotonic() + 20
    with pytest.raises(RuntimeError, match="metadata store is down"):
        while time.monotonic() < deadline:  # polled, as in collect_dead_letters
            broker.drain_dead_letters(QUEUE, crash)
            time.sleep(0.05)
    assert [letter.enqueue_id for letter in collect_dead_letters(broker, 1)] == ["poison"]


def test_published_sees_ready_and_held_messages_and_keeps_them_as_they_were(
    brokers: Brokers, queue_type: str
):
    publisher, holder, browser, consumer = brokers(), brokers(prefetch=1), brokers(), brokers()
    for enqueue_id, priority in (("a", 5), ("b", 9), ("c", 5)):
        publisher.publish(QUEUE, enqueue_id, "{}", priority)
    held = holder.receive(QUEUE, 5)
    assert held.enqueue_id == "b"
    # Another broker sees what is ready; the holder sees what it holds too. (The prefetch of quorum
    # queues is per band: the holder holds "a" of the lower band too.)
    ready = {"a", "c"} if queue_type == "classic" else {"c"}
    assert browser.published(QUEUE, ["a", "b", "c", "gone"]) == ready
    assert holder.published(QUEUE, ["a", "b", "c", "gone"]) == {"a", "b", "c"}
    deliveries = []
    # (The idle holder of quorum queues gives "a" back within a second or two.)
    while (delivery := consumer.receive(QUEUE, 3)) is not None:
        deliveries.append((delivery.enqueue_id, delivery.attempts))
        consumer.ack(delivery)
    if queue_type == "quorum":
        deliveries.sort()
    assert deliveries == [("a", 1), ("c", 1)], "browsing counts no delivery and keeps the order"
    assert holder.ack(held)


def test_refused_credentials_are_one_clear_error_without_the_password(
    brokers: Brokers, rabbitmq_server: RabbitMQServer, caplog: pytest.LogCaptureFixture
):
    secret = "not-the-password-8c1f"
    caplog.set_level(logging.DEBUG)
    broker = brokers(password=secret, publish_timeout=30)
    started = time.monotonic()
    with pytest.raises(BrokerRefused) as refused:
        broker.publish(QUEUE, "e1", "{}", 5)
    assert time.monotonic() - started < 10, "a refused login is no outage to wait out"
    message = str(refused.value)
    assert f"{rabbitmq_server.host}:{rabbitmq_server.port}" in message and "refused" in message
    assert "MAILQ_AMQP_PASSWORD" in message
    with pytest.raises(BrokerRefused, match="refused"):
        broker.receive(QUEUE, 1)
    broker.close()
    assert secret not in message and secret not in repr(broker)
    assert not [record for record in caplog.records if secret in record.getMessage()]


def test_a_missing_virtual_host_is_refused(rabbitmq_server: RabbitMQServer):
    server = rabbitmq_server
    broker = RabbitMQBroker(
        BrokerOptions(server.host, server.port, "no-such-vhost-3e1", server.username, server.password)
    )
    try:
        with pytest.raises(BrokerRefused, match="virtual host was refused"):
            broker.publish(QUEUE, "e1", "{}", 5)
    finally:
        broker.close()


# Classic queues only: on RabbitMQ 3.10 a quorum queue declared again right after its deletion once left
# the consumer with nothing for 30 s in a whole-suite run (it passed alone, and in every run before).
# Deleting a deployment's queues under it is an operator's error; the quorum design does not promise this.
@pytest.mark.parametrize("queue_type", ["classic"])
def test_queues_deleted_behind_the_brokers_back_are_declared_again(
    brokers: Brokers, rabbitmq_server: RabbitMQServer, vhost: str, queue_type: str
):
    publisher, consumer = brokers(), brokers()
    publisher.publish(QUEUE, "before", "{}", 5)
    assert take_all(consumer, timeout=5) == ["before"]
    connection = channel_of(rabbitmq_server, vhost)
    try:
        channel = connection.channel()
        names, dead_letters = rabbitmq_queues(QUEUE, queue_type)
        for name in (*names, dead_letters):
            channel.queue_delete(name)
    finally:
        connection.close()
    # RabbitMQ returns the unroutable message instead of dropping it: it is declared again and resent;
    # the consumer, cancelled by the deletion, starts again on the new queue.
    publisher.publish(QUEUE, "after", "{}", 5)
    delivery = consumer.receive(QUEUE, 30)
    assert delivery.enqueue_id == "after"
    assert consumer.ack(delivery)


def test_release_gives_the_message_back_with_this_delivery_uncounted(brokers: Brokers):
    broker = brokers()
    broker.publish(QUEUE, "again", "{}", 5)
    broker.publish(QUEUE, "later", "{}", 5)
    delivery = broker.receive(QUEUE, 0)
    assert (delivery.enqueue_id, delivery.attempts) == ("again", 1)
    assert broker.release(delivery)
    assert not broker.ack(delivery), "a released delivery is no longer this consumer's"
    assert not broker.release(delivery)

    again = broker.receive(QUEUE, 0)  # its place again, and its count as before this delivery
    assert (again.enqueue_id, again.attempts) == ("again", 1)
    assert broker.ack(again)
    assert take_all(broker) == ["later"]
