"""Do quorum queues on RabbitMQ 3.10 keep their confirmed messages when the node leading them is SIGKILLed
shortly after they were declared? The question the broker's module text answered "no" for a single node.

On the harness's three-node cluster (`python -m mailq_servers up rabbitmq-cluster`), in a virtual host of
its own: declare `--queues` quorum queues through node 1 (so node 1 leads them), publish `--messages`
confirmed messages to each through node 2, SIGKILL node 1 `--delay` seconds after the last confirmation,
once every queue has a new leader count what each queue delivers through a survivor (given back unacked),
and again after the node restarted, through it, consuming every message (a count from a passive declare
would not show a queue that no longer delivers). `--all`: SIGKILL all three nodes instead, start them
again, and drain each queue through node 1. `--runs` runs
per delay.

`--single`: the measurement the broker's module text first made, on a private single node of its own
(never the harness's shared one): the same queues and messages, the node SIGKILLed and started again on
its data, then each queue drained (None: it neither delivered nor answered within `--wait` seconds).

    PYTHONPATH=$PWD python benchmarks/rabbitmq_quorum_kill.py --delays 0.2 2 --runs 3 [--single]
"""

from __future__ import annotations

import argparse
import secrets
import tempfile
import threading
import time
from pathlib import Path

import pika
import pika.exceptions

from mailq_servers.base import ServerError
from mailq_servers.rabbitmq import RabbitMQ, RabbitMQServer
from mailq_servers.rabbitmq_cluster import RabbitMQCluster, RabbitMQClusterServer, node_name


def connection(server: RabbitMQClusterServer, index: int, vhost: str) -> pika.BlockingConnection:
    return pika.BlockingConnection(
        pika.ConnectionParameters(
            host=server.host,
            port=server.ports[index - 1],
            virtual_host=vhost,
            credentials=pika.PlainCredentials(server.username, server.password),
            connection_attempts=1,
            socket_timeout=5,
        )
    )


def count(server: RabbitMQClusterServer, index: int, vhost: str, queues: list[str], ack: bool) -> list[int]:
    """The distinct messages a consumer gets from each queue through node `index`, taking them until
    the queue says it is empty (unacked ones go back when the connection closes)."""
    conn = connection(server, index, vhost)
    try:
        channel = conn.channel()
        counts = []
        for queue in queues:
            seen: set[str] = set()
            while (got := channel.basic_get(queue))[0] is not None:
                method, properties, _ = got
                seen.add(properties.message_id)
                if ack:
                    channel.basic_ack(method.delivery_tag)
            counts.append(len(seen))
        return counts
    finally:
        if conn.is_open:
            conn.close()


def led(cluster: RabbitMQCluster, vhost: str, queues: list[str], dead: str, wait: float) -> float | None:
    """Seconds until every queue has a leader other than the node `dead`, or None if one never had."""
    started = time.monotonic()
    while time.monotonic() - started < wait:
        try:
            leaders = cluster.leaders(vhost)
        except ServerError:
            leaders = {}
        if all(leaders.get(queue) not in (None, "", dead) for queue in queues):
            return round(time.monotonic() - started, 1)
        time.sleep(0.5)
    return None


def one_run(cluster: RabbitMQCluster, server: RabbitMQClusterServer, delay: float, args) -> dict:
    vhost = f"quorum-kill-{secrets.token_hex(3)}"
    cluster.ctl("add_vhost", vhost)
    cluster.ctl("set_permissions", "-p", vhost, server.username, ".*", ".*", ".*")
    queues = [f"q{n}" for n in range(args.queues)]
    declaring = connection(server, 1, vhost)
    channel = declaring.channel()
    declared = time.monotonic()
    for queue in queues:
        channel.queue_declare(queue, durable=True, arguments={"x-queue-type": "quorum"})
    declaring.close()
    publishing = connection(server, 2, vhost)
    channel = publishing.channel()
    channel.confirm_delivery()
    confirmed = 0
    for queue in queues:
        for n in range(args.messages):
            channel.basic_publish(
                "",
                queue,
                b"x" * 200,
                pika.BasicProperties(message_id=f"{queue}-{n}", delivery_mode=2),
                mandatory=True,
            )
            confirmed += 1
    publishing.close()
    started = time.monotonic()  # the last confirmation
    time.sleep(delay)
    killed_at = time.monotonic() - started
    since_declare = time.monotonic() - declared
    result = {
        "delay": delay,
        "killed_at": round(killed_at, 2),
        "after_declare": round(since_declare, 2),
        "confirmed": confirmed,
    }
    if args.all:
        cluster.kill_all()
        cluster.start_all()
        counts = [drained(server.node_server(1, vhost), queue, args.wait) for queue in queues]
        result |= {"back": sum(count or 0 for count in counts), "per_queue": counts}
    else:
        # Node 1 leads every queue: declared through it, with RabbitMQ's default (client-local) placement.
        cluster.kill_node(1)
        elected = led(cluster, vhost, queues, node_name(1), args.wait)
        during = count(server, 2, vhost, queues, ack=False)
        cluster.start_node(1)
        time.sleep(2)
        after = count(server, 1, vhost, queues, ack=True)
        result |= {
            "new_leaders_after_s": elected,
            "during_outage": sum(during),
            "after_restart": sum(after),
            "per_queue_after": after,
        }
    cluster.ctl("delete_vhost", vhost)
    return result


def drained(server: RabbitMQServer, queue: str, wait: float) -> int | None:
    """The distinct messages `queue` delivers through `server` (acked), or None if it neither
    delivered nor said it is empty within `wait` seconds."""
    result: list[int] = []

    def drain() -> None:
        try:
            conn = pika.BlockingConnection(
                server.connection_parameters(connection_attempts=1, socket_timeout=5)
            )
            channel = conn.channel()
            seen: set[str] = set()
            while (got := channel.basic_get(queue))[0] is not None:
                seen.add(got[1].message_id)
                channel.basic_ack(got[0].delivery_tag)
            conn.close()
            result.append(len(seen))
        except pika.exceptions.AMQPError:
            pass

    thread = threading.Thread(target=drain, daemon=True)
    thread.start()
    thread.join(wait)
    return result[0] if result else None


def single_run(node: RabbitMQ, delay: float, args) -> dict:
    server = RabbitMQServer(**node.facts())
    prefix = secrets.token_hex(3)
    queues = [f"{prefix}-q{n}" for n in range(args.queues)]
    conn = pika.BlockingConnection(server.connection_parameters())
    channel = conn.channel()
    for queue in queues:
        channel.queue_declare(queue, durable=True, arguments={"x-queue-type": "quorum"})
    channel.confirm_delivery()
    for queue in queues:
        for n in range(args.messages):
            properties = pika.BasicProperties(message_id=f"{queue}-{n}", delivery_mode=2)
            channel.basic_publish("", queue, b"x" * 200, properties, mandatory=True)
    conn.close()
    started = time.monotonic()
    time.sleep(delay)
    killed_at = time.monotonic() - started
    node.kill()
    node.ensure()
    counts = [drained(server, queue, args.wait) for queue in queues]
    return {
        "delay": delay,
        "killed_at": round(killed_at, 2),
        "confirmed": args.queues * args.messages,
        "back": sum(count or 0 for count in counts),
        "per_queue": counts,
    }


def single(args) -> None:
    with tempfile.TemporaryDirectory() as directory:
        node = RabbitMQ.private(Path(directory))
        node.ensure()
        try:
            for delay in args.delays:
                for run in range(args.runs):
                    print(f"single node, run {run + 1}: {single_run(node, delay, args)}", flush=True)
        finally:
            node.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--delays", type=float, nargs="+", default=[0.2, 2.0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--queues", type=int, default=6)
    parser.add_argument("--messages", type=int, default=20)
    parser.add_argument("--wait", type=float, default=60.0, help="seconds a count waits for a queue")
    parser.add_argument("--single", action="store_true", help="on a private single node instead")
    parser.add_argument("--all", action="store_true", help="SIGKILL the whole cluster, not the leader")
    args = parser.parse_args()
    if args.single:
        single(args)
        return
    cluster = RabbitMQCluster()
    running = cluster.running()
    if running is None:
        raise SystemExit("rabbitmq-cluster is not running: python -m mailq_servers up rabbitmq-cluster")
    server = RabbitMQClusterServer(**running.facts)
    for delay in args.delays:
        for run in range(args.runs):
            result = one_run(cluster, server, delay, args)
            print(f"run {run + 1}: {result}", flush=True)


if __name__ == "__main__":
    main()
