"""What the features mailq keeps cost at the least on Cassandra (issue 22, item 7): `FeatureFloor`, the
James-like floor's statements (queue_floor.JamesFloor) plus the fewest that the exact size and record 39's
references and deletions need, each as cheap as Cassandra allows, whatever order or crash-safety mailq
needs (a floor, not a design), measured against the James-like floor in the same run.

    eval "$(.venv/bin/python -m mailq_servers env)"; run=bench$(date +%s)
    s3="s3=$run&s3_endpoint=$MAILQ_S3_ENDPOINT&s3_region=us-east-1"
    url="cassandra://$MAILQ_CASSANDRA_HOST:$MAILQ_CASSANDRA_PORT/$run?$s3&broker=amqp://127.0.0.1:16572/"
    .venv/bin/python benchmarks/feature_floor.py --url "$url" --mails 2000

What the feature floor adds to James's statements, a mail:

  enqueue         INSERT the writer's share of the slice's count, the row size() reads
                  INSERT the two references (blob_references), one unlogged batch of one partition, at the
                  reference generation taken as known (no read)
  dequeue + done  INSERT the writer's share of the slice's count
                  INSERT the two blobs' deletions (blob_deletions) and DELETE the references, one unlogged
                  batch (a logged one is what would keep them together)

issued at once with James's statement of the same step (the row; the mark), as no order binds a floor. The
folded side goes further still: the row and the references in one unlogged batch, and the mark, the
deletions and the references' removal in another (a counter update cannot join a batch of other writes).
Neither has a per-domain counter, a hold check, blob rows, or a read of the generation or GC iteration.
mailq itself is the fourth side, on a queue of the run (named after its keyspace), to place its cost
between the floors.

The sides take turns in ROUNDS blocks a phase (enqueue of `--mails` from `--threads` callers, then dequeue
+ done of them), each going first in turn, each round opened by an idle turn whose CPU is the servers'
background (process_cpu.py). At the end the feature sides' counters, references and deletions are checked
against the mails they took, and mailq's queue is checked empty. Prints the CPU per mail by process and
the rates, then one JSON object.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from cassandra.query import BatchStatement, BatchType
from process_cpu import CpuMeter
from queue_floor import Floor, FloorMail, JamesFloor, distributed, share
from queue_phases import WARM_UP_MAILS, bench_mail, message, run_threads
from queue_throughput import IDLE_TURN, ROUNDS, server_ports

from mailq_runtime import Mail, Runtime
from mailq_runtime.clock import MICROS_PER_SECOND
from mailq_runtime.queue import slice_of
from mailq_runtime.settings import CASSANDRA, Settings, redact
from mailq_runtime.stores.cassandra.blobs import shard_of

SIDES = ("james", "feature", "folded", "mailq")
OPERATIONS = ("enqueue", "dequeue")
# The generation and GC iteration the floor's rows name, taken as known.
GENERATION = 1
GC_ITERATION = 1


class FeatureFloor:
    """James's statements and the features' fewest, on the floor's session, bucket, broker and prepared
    statements (`Floor.prepare()` first); `folded` writes each step's plain rows as one unlogged batch."""

    def __init__(self, floor: Floor, folded: bool) -> None:
        self.floor = floor
        self.folded = folded

    def _batch(self, rows: list[tuple[str, tuple]]) -> BatchStatement:
        batch = BatchStatement(batch_type=BatchType.UNLOGGED)
        for name, parameters in rows:
            batch.add(self.floor.statements[name], parameters)
        return batch

    def _at_once(self, writes: list[tuple[str, tuple]], batched: list[tuple[str, tuple]]) -> None:
        """Each of `writes` a request, and `batched` one unlogged batch, all sent before any answer."""
        session, statements = self.floor.session, self.floor.statements
        futures = [session.execute_async(statements[name], parameters) for name, parameters in writes]
        futures.append(session.execute_async(self._batch(batched)))
        for future in futures:
            future.result()

    def enqueue(self, mail: FloorMail) -> None:
        self.floor.put_contents(mail)
        references = [("add_reference", (mail.enqueue_id, blob_id, GENERATION)) for blob_id in mail.blob_ids]
        now = time.time_ns() // 1000
        row = ("insert", (*mail.row, now))
        count = ("count_enqueued", share(mail.row, now, 1, 0))
        if self.folded:
            self._at_once([count], [row, *references])
        else:
            self._at_once([count, row], references)
        self.floor.broker.publish(mail.row[0], mail.enqueue_id, mail.payload, 5)

    def dequeue_done(self, queue: str) -> None:
        floor = self.floor
        enqueue_id, handle = floor.broker.receive(queue)
        mail = floor.mails[enqueue_id]
        if floor.session.execute(floor.statements["is_marked"], (queue, enqueue_id)).one() is not None:
            raise AssertionError(f"the feature floor's mail {enqueue_id} is marked deleted")
        floor.get_contents(mail)
        now = time.time_ns() // 1000
        released = [
            ("add_deletion", (GENERATION, shard_of(blob_id), blob_id, now, GC_ITERATION))
            for blob_id in mail.blob_ids
        ]
        released.append(("remove_references", (enqueue_id, list(mail.blob_ids))))
        mark = ("mark", (queue, enqueue_id, now))
        count = ("count_deleted", share(mail.row, now, 0, 1))
        if self.folded:
            self._at_once([count], [mark, *released])
        else:
            self._at_once([count, mark], released)
        floor.broker.ack(handle)


class MailqSide:
    """mailq's queue of the run, as a side: the runtime's enqueue and dequeue + done()."""

    def __init__(self, runtime: Runtime, name: str) -> None:
        self.queue = runtime.queue(name)

    def enqueue(self, mail: Mail) -> None:
        self.queue.enqueue(mail)

    def dequeue_done(self, _queue: str) -> None:
        item = self.queue.dequeue(timeout=5)
        if item is None:
            raise AssertionError("mailq's queue ran dry before every enqueued mail was dequeued")
        item.done()


class Turns:
    """The sides on one floor and one runtime, their turns metered: CPU by process (the meter) and wall
    seconds by `<side>_<operation>`."""

    def __init__(self, floor: Floor, mailq: MailqSide, size: int, threads: int, meter: CpuMeter) -> None:
        james = JamesFloor(floor)
        self.sides = {
            "james": james,
            "feature": FeatureFloor(floor, False),
            "folded": FeatureFloor(floor, True),
            "mailq": mailq,
        }
        self.floor = floor
        self.size = size
        self.threads = threads
        self.meter = meter
        self.wall: dict[str, float] = {}
        self.slice_start = slice_of(time.time_ns() // 1000, 3600 * MICROS_PER_SECOND)
        floor.prepare()
        james.prepare()

    def warm_up(self) -> None:
        """Each side's queue made, its connections opened and its statements run once, unmetered."""
        for name, side in self.sides.items():
            if name != "mailq":
                self.floor.create_queue(name, self.slice_start)
            for mail in self._mails(name, WARM_UP_MAILS):
                side.enqueue(mail)
            for _ in range(WARM_UP_MAILS):
                side.dequeue_done(name)

    def _mails(self, queue: str, count: int) -> list:
        """`count` mails for side `queue`, made before its turn's clock and meter start."""
        if queue == "mailq":
            return [bench_mail(self.size) for _ in range(count)]
        return [self.floor.new_mail(queue, self.slice_start, message(self.size), i) for i in range(count)]

    def rounds(self, operation: str, mails: int) -> None:
        """`mails` through every side in ROUNDS blocks, each round opened by an idle turn, each side first
        in turn."""
        for number in range(ROUNDS):
            count = mails * (number + 1) // ROUNDS - mails * number // ROUNDS
            self.meter.idle(IDLE_TURN)
            shift = number % len(SIDES)
            for name in SIDES[shift:] + SIDES[:shift]:
                side = self.sides[name]
                if operation == "enqueue":
                    prepared = self._mails(name, count)
                    self._turn(f"{name}_enqueue", count, lambda i, side=side, p=prepared: side.enqueue(p[i]))
                else:
                    self._turn(f"{name}_dequeue", count, lambda _, side=side, q=name: side.dequeue_done(q))

    def _turn(self, key: str, count: int, operation: Callable[[int], None]) -> None:
        self.meter.start()
        _, wall = run_threads(self.threads, count, operation)
        self.meter.stop(key)
        self.wall[key] = self.wall.get(key, 0.0) + wall


def check_features(floor: Floor, mails: int) -> None:
    """The feature sides' writes all there: each queue's slice counters at its `mails` enqueued and deleted,
    and each of its mails' blobs with a deletion and no reference left."""
    session, keyspace = floor.session, floor.keyspace
    referenced = {row.owner for row in session.execute(f"SELECT owner FROM {keyspace}.blob_references")}
    deleted = {row.blob_id for row in session.execute(f"SELECT blob_id FROM {keyspace}.blob_deletions")}
    for queue in ("feature", "folded"):
        rows = session.execute(
            f"SELECT enqueued, deleted FROM {keyspace}.slice_counters WHERE queue = %s", (queue,)
        )
        counts = [(row.enqueued, row.deleted) for row in rows]
        if [sum(column) for column in zip(*counts, strict=True)] != [mails, mails]:
            raise AssertionError(f"{queue}'s slice counters are {counts}, not {mails} enqueued and deleted")
        taken = [mail for mail in floor.mails.values() if mail.row[0] == queue]
        kept = sum(mail.enqueue_id in referenced for mail in taken)
        undeleted = sum(blob_id not in deleted for mail in taken for blob_id in mail.blob_ids)
        if len(taken) != mails or kept or undeleted:
            raise AssertionError(
                f"{queue}: {len(taken)} mails, {kept} with references left, {undeleted} blobs with no"
                " deletion"
            )


def figures(turns: Turns, mails: int) -> dict[str, object]:
    """CPU per mail by process and side (as measured, and net of the background), rates, and each feature
    side's ratios to the James-like floor."""
    meter = turns.meter
    measured = {op: {side: meter.ms_per_mail(f"{side}_{op}", mails) for side in SIDES} for op in OPERATIONS}
    net = {op: {side: meter.net_ms_per_mail(f"{side}_{op}", mails) for side in SIDES} for op in OPERATIONS}
    rate = {op: {side: mails / turns.wall[f"{side}_{op}"] for side in SIDES} for op in OPERATIONS}
    ratios = {
        op: {
            side: {
                "cpu": round(net[op][side]["total"] / net[op]["james"]["total"], 3),
                "cpu_as_measured": round(measured[op][side]["total"] / measured[op]["james"]["total"], 3),
                "rate": round(rate[op][side] / rate[op]["james"], 3),
            }
            for side in SIDES[1:]
        }
        for op in OPERATIONS
    }
    return {
        "processes": sorted(meter.pids),
        "background_percent_of_a_core": meter.background_percent(),
        "cpu_ms_per_mail": measured,
        "cpu_ms_per_mail_net": net,
        "per_s": {op: {side: round(value, 1) for side, value in rates.items()} for op, rates in rate.items()},
        "ratios_to_james": ratios,
        "mailq_to_feature": {
            op: {
                side: round(net[op]["mailq"]["total"] / net[op][side]["total"], 3)
                for side in ("feature", "folded")
            }
            for op in OPERATIONS
        },
    }


def report(result: dict, threads: int) -> None:
    background = ", ".join(
        f"{name} {value}%" for name, value in result["background_percent_of_a_core"].items()
    )
    print(f"CPU per mail, {threads} threads, ms by process, net of the background ({background} of a core)")
    for operation, label in (("enqueue", "enqueue"), ("dequeue", "dequeue + done")):
        for side, cpu in result["cpu_ms_per_mail_net"][operation].items():
            shares = ", ".join(f"{name} {value}" for name, value in cpu.items() if name != "total")
            print(
                f"  {label:<15} {side:<8} {cpu['total']:7.2f} ms ({shares});"
                f" {result['per_s'][operation][side]} /s"
            )
        for side, ratio in result["ratios_to_james"][operation].items():
            print(
                f"  {label:<15} {side} / James-like: CPU {ratio['cpu']}x"
                f" ({ratio['cpu_as_measured']}x with the background), rate {ratio['rate']}x"
            )
        above = ", ".join(f"{side} {value}x" for side, value in result["mailq_to_feature"][operation].items())
        print(f"  {label:<15} mailq's CPU over the feature floors': {above}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--url", required=True, help="a cassandra:// deployment with broker=amqp:// that does not exist yet"
    )
    parser.add_argument("--mails", type=int, default=2000, help="mails each side enqueues, then dequeues")
    parser.add_argument("--size", type=int, default=10_240, help="bytes per mail")
    parser.add_argument("--threads", type=int, default=8, help="concurrent callers")
    args = parser.parse_args()
    settings = Settings.from_url(args.url)
    if settings.backend != CASSANDRA or settings.amqp is None:
        raise SystemExit("feature_floor: give a cassandra:// URL with broker=amqp://")
    print(
        f"deployment {redact(args.url)}: {args.mails} mails a side, {args.threads} threads, {ROUNDS} rounds"
    )
    # On RabbitMQ, whose vhost other runs may share, mailq's queue is named after the run's keyspace.
    name = f"{settings.cassandra.keyspace}-mailq"
    with (
        tempfile.TemporaryDirectory() as scratch,
        distributed(settings, Path(scratch), args.threads, [name]) as floor,
        # The runtime's creating open makes the keyspace, its tables and the bucket.
        Runtime(settings, create=True) as runtime,
    ):
        meter = CpuMeter(server_ports(settings))
        turns = Turns(floor, MailqSide(runtime, name), args.size, args.threads, meter)
        turns.warm_up()
        for operation in OPERATIONS:
            turns.rounds(operation, args.mails)
        check_features(floor, args.mails + WARM_UP_MAILS)
        if runtime.queue(name).size() != 0:
            raise AssertionError(f"mailq's queue has {runtime.queue(name).size()} mails left, not 0")
    result = {"mails": args.mails, "threads": args.threads, "rounds": ROUNDS, **figures(turns, args.mails)}
    report(result, args.threads)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
