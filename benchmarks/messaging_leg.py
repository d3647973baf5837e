"""The messaging leg of the RabbitMQ broker against raw pika on the same node: publish with asynchronous
confirms (raw: one SelectConnection keeping `window` messages in flight; mailq: `publish` from `threads`
threads sharing one broker, each call returning once confirmed), and consume with manual acks (raw:
basic_consume + basic_ack; mailq: `receive` + `ack` from one thread and from `consumers` threads), with the
same message size and prefetch, on classic priority queues declared alike.

Not a benchmark itself; `compare` is what rabbitmq_broker.py measures, and what queue_throughput.py runs
on the runtime's broker with messages of the size of mailq's payload.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable

import pika
from pika.spec import Basic

from mailq_runtime.brokers.rabbitmq import MAX_PRIORITY, RabbitMQBroker


def raw_publish(
    parameters: pika.ConnectionParameters, queue: str, body: bytes, count: int, window: int
) -> float:
    """Messages a second, from the first publish to the last confirmation."""
    properties = pika.BasicProperties(delivery_mode=pika.DeliveryMode.Persistent, priority=5)
    outstanding: deque[int] = deque()
    state = {"sent": 0, "confirmed": 0, "started": 0.0, "ended": 0.0}

    def fill(channel) -> None:
        while state["sent"] < count and len(outstanding) < window:
            channel.basic_publish("", queue, body, properties)
            state["sent"] += 1
            outstanding.append(state["sent"])

    def on_confirm(channel, frame) -> None:
        method = frame.method
        assert isinstance(method, Basic.Ack), "raw publish nacked"
        if method.multiple:
            while outstanding and outstanding[0] <= method.delivery_tag:
                outstanding.popleft()
                state["confirmed"] += 1
        else:
            outstanding.remove(method.delivery_tag)
            state["confirmed"] += 1
        if state["confirmed"] == count:
            state["ended"] = time.perf_counter()
            channel.connection.close()
        else:
            fill(channel)

    def on_channel(channel) -> None:
        def start(_frame) -> None:
            state["started"] = time.perf_counter()
            fill(channel)

        channel.confirm_delivery(lambda frame: on_confirm(channel, frame), callback=start)

    run_select(parameters, on_channel)
    return count / (state["ended"] - state["started"])


def raw_consume(parameters: pika.ConnectionParameters, queue: str, count: int, prefetch: int) -> float:
    """Messages a second, consumed with manual acks, from basic.consume to the last ack."""
    state = {"received": 0, "started": 0.0, "ended": 0.0}

    def on_message(channel, method, _properties, _body) -> None:
        channel.basic_ack(method.delivery_tag)
        state["received"] += 1
        if state["received"] == count:
            state["ended"] = time.perf_counter()
            channel.connection.close()

    def on_channel(channel) -> None:
        def start(_frame) -> None:
            state["started"] = time.perf_counter()
            channel.basic_consume(queue, on_message)

        channel.basic_qos(prefetch_count=prefetch, callback=start)

    run_select(parameters, on_channel)
    return count / (state["ended"] - state["started"])


def run_select(parameters: pika.ConnectionParameters, on_channel: Callable) -> None:
    def on_open(connection) -> None:
        connection.channel(on_open_callback=on_channel)

    def on_error(connection, error) -> None:
        raise SystemExit(f"cannot connect: {error}")

    connection = pika.SelectConnection(
        parameters,
        on_open_callback=on_open,
        on_open_error_callback=on_error,
        on_close_callback=lambda connection, _reason: connection.ioloop.stop(),
    )
    connection.ioloop.start()


def in_threads(threads: int, work: Callable[[int], None]) -> None:
    pool = [threading.Thread(target=work, args=(index,)) for index in range(threads)]
    for thread in pool:
        thread.start()
    for thread in pool:
        thread.join()


def mailq_publish(broker: RabbitMQBroker, queue: str, payload: str, count: int, threads: int) -> float:
    per_thread = count // threads  # main() makes count a multiple of threads
    started = time.perf_counter()
    in_threads(
        threads, lambda index: [broker.publish(queue, f"m{index}-{n}", payload, 5) for n in range(per_thread)]
    )
    return per_thread * threads / (time.perf_counter() - started)


def mailq_consume(broker: RabbitMQBroker, queue: str, count: int, threads: int) -> float:
    """Messages a second through receive + ack; the queue's consumer is already started."""
    left = [count]
    lock = threading.Lock()

    def work(_index: int) -> None:
        while True:
            with lock:
                if left[0] == 0:
                    return
                left[0] -= 1
            delivery = broker.receive(queue, 30)
            assert delivery is not None, "a message is missing"
            assert broker.ack(delivery)

    started = time.perf_counter()
    in_threads(threads, work)
    return count / (time.perf_counter() - started)


# The comparison's defaults: many publishes in flight on both sides, consumers keeping as many messages.
PUBLISHERS = 64
CONSUMERS = 4
WINDOW = 500
PREFETCH = 100
# Declared as the broker declares its queues, so both sides pay for the same queue type.
QUEUE_ARGUMENTS = {"x-queue-version": 2, "x-max-priority": MAX_PRIORITY}
MEASURES = ("raw_publish", "mailq_publish", "raw_consume", "mailq_consume_1", "mailq_consume_n")


def compare(
    parameters: pika.ConnectionParameters,
    broker: RabbitMQBroker,
    mail_queue: str,
    raw_queue: str,
    size: int,
    messages: int,
    rounds: int,
    *,
    threads: int = PUBLISHERS,
    consumers: int = CONSUMERS,
    window: int = WINDOW,
    prefetch: int = PREFETCH,
) -> dict[str, list[float]]:
    """The rates of each round, raw and mailq alternating, by measure (MEASURES): `messages` (a multiple
    of `threads`) of `size` bytes each way, mailq's through `broker` on `mail_queue`, raw pika's on
    `raw_queue`, which is declared as the broker declares its queues and deleted at the end. The mail
    queue's objects stay, for the caller to delete once `broker` is closed."""
    payload = "x" * size
    body = payload.encode()
    admin = pika.BlockingConnection(parameters)
    channel = admin.channel()
    figures: dict[str, list[float]] = {key: [] for key in MEASURES}
    try:
        broker.publish(mail_queue, "warm-up", payload, 5)  # declares the mail queue's objects
        channel.queue_declare(raw_queue, durable=True, arguments=QUEUE_ARGUMENTS)
        # Starts the consumer, and takes the warm-up.
        while (delivery := broker.receive(mail_queue, 2)) is not None:
            broker.ack(delivery)
        for _ in range(rounds):
            figures["raw_publish"].append(raw_publish(parameters, raw_queue, body, messages, window))
            figures["mailq_publish"].append(mailq_publish(broker, mail_queue, payload, messages, threads))
            figures["raw_consume"].append(raw_consume(parameters, raw_queue, messages, prefetch))
            figures["mailq_consume_1"].append(mailq_consume(broker, mail_queue, messages // 2, 1))
            figures["mailq_consume_n"].append(
                mailq_consume(broker, mail_queue, messages - messages // 2, consumers)
            )
    finally:
        channel.queue_delete(raw_queue)
        admin.close()
    return figures


def ratios(medians: dict[str, float]) -> dict[str, float]:
    """mailq's rate over raw pika's, by measure."""
    return {
        "publish": medians["mailq_publish"] / medians["raw_publish"],
        "consume_1": medians["mailq_consume_1"] / medians["raw_consume"],
        "consume_n": medians["mailq_consume_n"] / medians["raw_consume"],
    }
