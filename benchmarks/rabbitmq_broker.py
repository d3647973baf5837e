"""The RabbitMQ broker's messaging rates against raw pika on the same node, in the same run: publish with
asynchronous confirms (raw: one SelectConnection keeping `--window` messages in flight; mailq: `publish`
from `--threads` threads sharing one broker, each call returning once confirmed), and consume with manual
acks (raw: basic_consume + basic_ack; mailq: `receive` + `ack` from one thread and from `--threads`
threads), with the same message size and prefetch, on classic priority queues declared alike (each run
its own, deleted at the end).

    eval "$(.venv/bin/python -m mailq_servers env rabbitmq)"   # after `python -m mailq_servers up rabbitmq`
    .venv/bin/python benchmarks/rabbitmq_broker.py [--messages 5000] [--size 10240] [--rounds 3]

The node is $MAILQ_AMQP_URL's host, port, vhost and user; the password MAILQ_AMQP_PASSWORD's, else the
URL's (the harness's test node). Each measure runs `--rounds` times, raw and mailq alternating; the
figures are medians. The last line is one JSON object with every figure. The measure itself is
messaging_leg.py's, which queue_throughput.py runs too.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import statistics
from contextlib import closing
from urllib.parse import unquote, urlsplit

import pika
from messaging_leg import CONSUMERS, PREFETCH, PUBLISHERS, WINDOW, compare, ratios
from quick import parse_args

from mailq_runtime.brokers.rabbitmq import BrokerOptions, RabbitMQBroker, dead_letter_queue, queue_name

DEFAULT_URL = "amqp://guest:guest@127.0.0.1:16572/"


def connection_settings(url: str) -> dict[str, object]:
    parts = urlsplit(url)
    vhost = unquote(parts.path[1:]) if len(parts.path) > 1 else "/"
    password = os.environ.get("MAILQ_AMQP_PASSWORD") or unquote(parts.password or "guest")
    return {
        "host": parts.hostname or "127.0.0.1",
        "port": parts.port or 5672,
        "vhost": vhost,
        "user": unquote(parts.username or "guest"),
        "password": password,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=5000, help="messages per measure (default 5000)")
    parser.add_argument("--size", type=int, default=10 * 1024, help="bytes a message (default 10240)")
    parser.add_argument("--rounds", type=int, default=3, help="times each measure runs (default 3)")
    parser.add_argument(
        "--threads", type=int, default=PUBLISHERS, help="publishing threads of mailq (default 64)"
    )
    parser.add_argument(
        "--consumers", type=int, default=CONSUMERS, help="consuming threads of mailq (default 4)"
    )
    parser.add_argument("--window", type=int, default=WINDOW, help="raw publishes in flight (default 500)")
    parser.add_argument(
        "--prefetch", type=int, default=PREFETCH, help="prefetch of both consumers (default 100)"
    )
    args = parse_args(parser, {"messages": 256, "rounds": 1})
    args.messages -= args.messages % args.threads

    settings = connection_settings(os.environ.get("MAILQ_AMQP_URL") or DEFAULT_URL)
    parameters = pika.ConnectionParameters(
        host=settings["host"],
        port=settings["port"],
        virtual_host=settings["vhost"],
        credentials=pika.PlainCredentials(settings["user"], settings["password"]),
    )
    broker = RabbitMQBroker(BrokerOptions(**settings, prefetch=args.prefetch))
    run = secrets.token_hex(3)
    mail_queue = f"benchmark-{run}"
    try:
        figures = compare(
            parameters,
            broker,
            mail_queue,
            f"mailq-benchmark-raw-{run}",
            args.size,
            args.messages,
            args.rounds,
            threads=args.threads,
            consumers=args.consumers,
            window=args.window,
            prefetch=args.prefetch,
        )
    finally:
        broker.close()
        with closing(pika.BlockingConnection(parameters)) as admin:
            channel = admin.channel()
            for name in (queue_name(mail_queue), dead_letter_queue(mail_queue)):
                channel.queue_delete(name)

    medians = {key: statistics.median(values) for key, values in figures.items()}
    ratio = ratios(medians)
    print(f"{args.messages} messages of {args.size} bytes, {args.rounds} rounds, medians (messages/s):")
    print(f"{'measure':<22} {'mailq/s':>9} {'raw/s':>9} {'ratio':>6}   (target >= 0.5)")
    print(
        f"{'publish':<22} {medians['mailq_publish']:>9.0f} {medians['raw_publish']:>9.0f} "
        f"{ratio['publish']:>6.2f}   mailq: {args.threads} threads; raw: {args.window} in flight"
    )
    for key, label in (
        ("consume_1", "receive+ack, 1 thread"),
        ("consume_n", f"receive+ack, {args.consumers} th."),
    ):
        print(
            f"{label:<22} {medians[f'mailq_{key}']:>9.0f} {medians['raw_consume']:>9.0f} {ratio[key]:>6.2f}"
        )
    print(
        json.dumps(
            {
                "messages": args.messages,
                "size": args.size,
                "rounds": args.rounds,
                "threads": args.threads,
                "consumers": args.consumers,
                "prefetch": args.prefetch,
                **{key: round(value, 1) for key, value in medians.items()},
                **{f"ratio_{key}": round(value, 3) for key, value in ratio.items()},
                "samples": figures,
            }
        )
    )


if __name__ == "__main__":
    main()
