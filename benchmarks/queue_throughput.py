"""The mail queue's throughput on any deployment, against the floor of its backends on the same machine.

    .venv/bin/python benchmarks/queue_throughput.py [--url URL] [--mails N] [--size BYTES] [--history N]
                                                    [--live N] [--process-mails N] [--threads N]
                                                    [--profile enqueue|dequeue]

Without --url, a fresh embedded data dir next to the repository (same disk). With --url, the deployment it
names, which must not exist yet: the run makes it with a creating open and removes it at the end (an
embedded data dir; on cassandra:// the keyspace is dropped, the bucket emptied and deleted and the
broker's directory removed; with broker=amqp://, the run's mail queues are named after the keyspace, and
their RabbitMQ queues, refused if they exist already, are deleted), so it never touches anything it did
not make. On the test servers:

    eval "$(.venv/bin/python -m mailq_servers env)"; run=bench$(date +%s)
    s3="s3=$run&s3_endpoint=$MAILQ_S3_ENDPOINT&s3_region=us-east-1"
    url="cassandra://$MAILQ_CASSANDRA_HOST:$MAILQ_CASSANDRA_PORT/$run?$s3&broker=embedded:/tmp/$run"
    .venv/bin/python benchmarks/queue_throughput.py --url "$url"   # or broker=amqp://127.0.0.1:16572/

Measures:
  1. enqueue of N mails of ~10 KiB, each with a random body so that nothing deduplicates, from
     `--threads` concurrent callers (as an MTA's SMTP sessions are), and of N/4 from one thread;
  2. dequeue + done() of each, likewise;
  3. size() on a queue with a long history (`--history` processed mails over 30 days of 1h slices,
     browse_start left at its start: the worst case) and `--live` live mails, checked against a browse
     (embedded: in a store of its own, beside the deployment's; Cassandra: in the same keyspace);
  4. the floor. Embedded: the rate of one-row SQLite transactions (BEGIN IMMEDIATE; INSERT; COMMIT) in
     WAL mode with the runtime's durability, the ceiling any queue operation on this disk works under.
     Cassandra: the bare cassandra-driver statements, boto3 puts and gets and broker calls (SQLite writes,
     or raw pika on RabbitMQ) that one enqueue and one dequeue + done() make (queue_floor.py), in the
     same phases with the same threads, taking turns with mailq in ROUNDS rounds a phase (each first in
     every other round); the ratio is mailq's rate over the floor's;
  5. where the time goes: in the single-thread phases each backend call of mailq (every method of the
     view, blob tables, content, broker and delayed mails) is timed, as is each of the floor's calls:
     milliseconds per mail by call kind, and what is left, mailq's own work; then the same by backend
     (Cassandra, S3, RabbitMQ, own Python). (The timing costs about a microsecond a call.)
  6. on RabbitMQ, the messaging leg: the runtime's broker against raw pika on the same node, with
     messages of the size of mailq's payload (rabbitmq_broker.compare: LEG_ROUNDS rounds, medians);
  7. two mailq processes on one queue against one, enqueue then dequeue + done() (queue_processes.py).
Prints one line per measure, then one JSON object as the last line.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import pstats
import shutil
import sqlite3
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import closing, contextmanager
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from call_timings import DEQUEUE_DONE, ENQUEUE, Timings, grouped
from process_cpu import CpuMeter
from queue_phases import (
    WARM_UP_MAILS,
    bench_mail,
    dequeue_phase,
    enqueue_phase,
    message,
    run_threads,
    warm_up,
)
from queue_processes import measure, queue_names
from rabbitmq_broker import CONSUMERS, PUBLISHERS, WINDOW, ratios

from mailq_runtime import Runtime
from mailq_runtime.blobs.store import BlobStore
from mailq_runtime.brokers.base import Broker
from mailq_runtime.clock import MICROS_PER_SECOND
from mailq_runtime.queue import slice_of
from mailq_runtime.settings import CASSANDRA, EMBEDDED, Settings, redact
from mailq_runtime.stores.embedded import DATABASE_FILE, SYNCHRONOUS
from mailq_runtime.stores.protocols import BlobTables, DelayedMails, QueueView

if TYPE_CHECKING:
    from queue_floor import Floor, FloorMail

REPOSITORY = Path(__file__).resolve().parent.parent
HISTORY_DAYS = 30
SIZE_CALLS = 200
RAW_TRANSACTIONS = 20_000
# With a floor, each phase alternates it with mailq in this many rounds.
ROUNDS = 10
# mails, history, live: bounded on a distributed deployment, where each call is a network round trip.
# process_mails: each turn's mails of the two-process measure, bounded on the embedded deployment too.
DEFAULTS = {EMBEDDED: (20_000, 1_000_000, 1000, 4000), CASSANDRA: (300, 2000, 50, 300)}
# The messaging leg against raw pika: messages each way a round (a multiple of rabbitmq_broker's
# PUBLISHERS), and rounds, raw and mailq alternating.
LEG_MESSAGES = 2048
LEG_ROUNDS = 3
TARGET_LEG_RATIO = 0.5
TARGET_RATE = 3000
TARGET_RATIO = 0.2
TARGET_FLOOR_RATIO = 0.7
TARGET_SIZE_MS = 5.0
# The phases compared with the floor, by the names of their figures.
FLOOR_PHASES = {
    "enqueue": "enqueue",
    "dequeue": "dequeue_ack",
    "single_enqueue": "single_thread_enqueue",
    "single_dequeue": "single_thread_dequeue_ack",
}
# Seconds of the idle turn that starts each round with a CPU meter: the background's rate.
IDLE_TURN = 1.0
# The sides of a phase with a floor: mailq, the floor of its calls, the James-like floor (JamesFloor).
SIDES = ("mailq", "floor", "james")
# The cost per mail against the James-like floor (issue 22), in the phases of `--threads` callers:
# CPU per mail at most this many times the floor's, the rate at least this fraction of its.
TARGET_JAMES_CPU = 1.25
TARGET_JAMES_RATE = 0.8
# The runtime's backends whose calls the breakdown times, by the protocol that lists their methods.
TIMED = {
    "view": QueueView,
    "blob_tables": BlobTables,
    "content": BlobStore,
    "broker": Broker,
    "delayed_mails": DelayedMails,
}


def ms(seconds: list[float], fraction: float) -> float:
    """The `fraction` percentile of `seconds`, in milliseconds."""
    ordered = sorted(seconds)
    return round(ordered[min(len(ordered) - 1, int(fraction * len(ordered)))] * 1e3, 3)


def profiled(enabled: bool, phase: Callable[[], tuple[list[float], float]]) -> tuple[list[float], float]:
    """Run `phase`, under cProfile if asked: the top costs go to stderr, the figures stay on stdout."""
    if not enabled:
        return phase()
    profile = cProfile.Profile()
    measured = profile.runcall(phase)
    pstats.Stats(profile, stream=sys.stderr).sort_stats("tottime").print_stats(20)
    return measured


@contextmanager
def timed_calls(runtime: Runtime, timings: Timings) -> Iterator[None]:
    """Time every backend call of `runtime` by kind (`view.insert`, `content.put` ...) while inside; a
    call made by another backend call counts in the outer one only. For one thread at a time."""
    depth = [0]
    wrapped = []

    def timer(kind: str, call: Callable) -> Callable:
        def timed(*args, **kwargs):
            depth[0] += 1
            started = time.perf_counter()
            try:
                return call(*args, **kwargs)
            finally:
                depth[0] -= 1
                if depth[0] == 0:
                    timings.add(kind, time.perf_counter() - started)

        return timed

    for attribute, protocol in TIMED.items():
        backend = getattr(runtime, attribute)
        for name in vars(protocol):
            method = getattr(backend, name, None)
            if not name.startswith("_") and callable(method):
                setattr(backend, name, timer(f"{attribute}.{name}", method))
                wrapped.append((backend, name, method))
    try:
        yield
    finally:
        # The method as it was, the metrics' counting wrapper (runtime.py's `_count_calls`) included.
        for backend, name, method in wrapped:
            setattr(backend, name, method)


def check_emptied(runtime: Runtime, name: str) -> None:
    queue = runtime.queue(name)
    if queue.size() != 0:
        raise AssertionError(f"{queue.size()} mails left after dequeuing all of them")


def floor_enqueue_phase(
    floor: Floor, enqueue: Callable[[FloorMail], None], queue: str, mails: int, size: int, threads: int
) -> tuple[list[float], float]:
    """`enqueue` (the floor's or the James-like floor's) of `mails` mails made by the floor."""
    slice_start = slice_of(time.time_ns() // 1000, 3600 * MICROS_PER_SECOND)
    floor.create_queue(queue, slice_start)
    prepared = [floor.new_mail(queue, slice_start, message(size), i) for i in range(mails)]
    return run_threads(threads, mails, lambda i: enqueue(prepared[i]))


def floor_dequeue_phase(
    dequeue_done: Callable[[str], None], queue: str, mails: int, threads: int
) -> tuple[list[float], float]:
    return run_threads(threads, mails, lambda _: dequeue_done(queue))


def history_slices(runtime: Runtime, history: int) -> tuple[int, int, int, int]:
    """(first slice, slice window, slices, mails per slice) of a history of HISTORY_DAYS."""
    window = runtime.view_configuration.slice_window
    now = runtime.clock()
    first = slice_of(now - HISTORY_DAYS * 86400 * MICROS_PER_SECOND, window)
    slices = (slice_of(now, window) - first) // window
    return first, window, slices, -(-history // slices)


def build_history(runtime: Runtime, history: int) -> int:
    """Insert `history` processed mails straight into the embedded store's tables, spread over
    HISTORY_DAYS of slices, and leave browse_start and content_start at its start. Returns the number of
    slices.

    Through the API this would take minutes; generated inside SQLite (on a connection of its own to the
    store's file) it takes seconds, and size() reads exactly what the API would have written: rows,
    deletion marks and per-slice counters.
    """
    first, window, slices, per_slice = history_slices(runtime, history)
    with closing(sqlite3.connect(runtime.settings.data_dir / DATABASE_FILE, timeout=30)) as db, db:
        # What the queue's first enqueue would have created.
        db.execute("INSERT INTO queues VALUES ('history', ?)", (first,))
        db.execute("INSERT INTO browse_start VALUES ('history', ?)", (first,))
        db.execute("INSERT INTO content_start VALUES ('history', ?)", (first,))
        db.execute(
            """
            WITH RECURSIVE n(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM n WHERE i + 1 < :history),
            m(i, slice_start, at) AS (
                SELECT i, :first + (i / :per_slice) * :window,
                       :first + (i / :per_slice) * :window + (i % :per_slice) * (:window / :per_slice) FROM n)
            INSERT INTO enqueued_mails (queue, slice_start, bucket, enqueue_id, enqueued_time, next_delivery,
                                        priority, name, sender, recipients, header_blob_id, body_blob_id,
                                        metadata)
            SELECT 'history', slice_start, 0, printf('%016x%016x', at, i), at, at, 5, printf('mail-%d', i),
                   'bench@example.com', '["sink@example.org"]', 'g1_' || lower(hex(randomblob(32))),
                   'g1_' || lower(hex(randomblob(32))), '{}'
            FROM m
            """,
            {"history": history, "first": first, "per_slice": per_slice, "window": window},
        )
        db.execute(
            "INSERT INTO deleted_mails (queue, enqueue_id) SELECT queue, enqueue_id FROM enqueued_mails "
            "WHERE queue = 'history'"
        )
        db.execute(
            "INSERT INTO slice_counters (queue, slice_start, enqueued, deleted) "
            "SELECT queue, slice_start, COUNT(*), COUNT(*) FROM enqueued_mails WHERE queue = 'history' "
            "GROUP BY slice_start"
        )
    return slices


def size_phase(runtime: Runtime, name: str, live: int, size: int) -> tuple[list[float], int, float]:
    """size() latencies on the history queue, its answer, and the seconds a browse takes to count."""
    queue = runtime.queue(name)
    for _ in range(live):
        queue.enqueue(bench_mail(size))
    latencies = []
    for _ in range(SIZE_CALLS):
        started = time.perf_counter()
        answer = queue.size()
        latencies.append(time.perf_counter() - started)
    started = time.perf_counter()
    browsed = sum(1 for _ in queue.browse())
    browse_seconds = time.perf_counter() - started
    if browsed != answer:
        raise AssertionError(f"size() says {answer}, browse finds {browsed}")
    return latencies, answer, browse_seconds


def raw_sqlite_rate(path: Path, synchronous: str, transactions: int) -> float:
    """One-row write transactions per second, with the connection settings the runtime uses."""
    with closing(sqlite3.connect(path, isolation_level=None)) as db:
        db.execute("PRAGMA journal_mode=WAL")
        db.execute(f"PRAGMA synchronous={synchronous}")
        db.execute("CREATE TABLE rows (id INTEGER PRIMARY KEY, value TEXT NOT NULL)")
        started = time.perf_counter()
        for i in range(transactions):
            db.execute("BEGIN IMMEDIATE")
            db.execute("INSERT INTO rows (value) VALUES (?)", (f"row {i}",))
            db.execute("COMMIT")
        return transactions / (time.perf_counter() - started)


def build_history_distributed(runtime: Runtime, floor: Floor, name: str, history: int) -> int:
    """The same history on Cassandra, written with bare statements: rows, deletion marks, counters."""
    first, window, slices, per_slice = history_slices(runtime, history)
    floor.write_history(name, first, window, per_slice, history)
    return slices


def breakdown(timings: Timings, mails: int, wall: float, kinds: tuple[str, ...]) -> dict[str, list[float]]:
    """Milliseconds and calls per mail by call kind, the named kinds first, and what the calls leave."""
    ordered = [kind for kind in kinds if kind in timings.seconds]
    ordered += sorted(set(timings.seconds) - set(ordered), key=lambda kind: -timings.seconds[kind])
    table = {
        kind: [round(timings.seconds[kind] * 1e3 / mails, 3), round(timings.calls[kind] / mails, 2)]
        for kind in ordered
    }
    table["outside these calls"] = [round((wall - sum(timings.seconds.values())) * 1e3 / mails, 3), 0]
    table["total"] = [round(wall * 1e3 / mails, 3), 0]
    return table


def print_breakdown(name: str, tables: dict[str, dict[str, list[float]]]) -> None:
    columns = list(tables)
    print(f"  {name:<32}" + "".join(f"{column + ' ms (calls)':>20}" for column in columns))
    for kind in dict.fromkeys(kind for table in tables.values() for kind in table):
        cells = ""
        for column in columns:
            spent, calls = tables[column].get(kind, (None, 0))
            cell = "" if spent is None else f"{spent:8.2f} " + (f"{f'({calls:g})':>7}" if calls else " " * 7)
            cells += f"{cell:>20}"
        print(f"    {kind:<30}{cells}")


class Phases:
    """The throughput phases on one runtime. With a floor (Cassandra), each phase alternates mailq, the floor
    of its calls and the James-like floor in ROUNDS rounds, each going first in turn, so that whatever else
    loads the machine and the servers meanwhile weighs on all alike; the single-thread phases are timed by
    call kind, and with a CPU meter every turn's CPU time is added up by side and phase, per process."""

    def __init__(
        self,
        runtime: Runtime,
        floor: Floor | None,
        prefix: str,
        size: int,
        threads: int,
        profile: str | None,
        meter: CpuMeter | None = None,
    ):
        self.runtime = runtime
        self.prefix = prefix
        self.floor = floor
        self.james = None
        if floor is not None:
            from queue_floor import JamesFloor

            self.james = JamesFloor(floor)
        self.size = size
        self.threads = threads
        self.profile = profile
        self.meter = meter
        self.measured: dict[str, tuple[list[float], float]] = {}
        self.timings = {side: {"enqueue": Timings(), "dequeue": Timings()} for side in SIDES}

    def throughput(self, mails: int, single: int) -> None:
        runtime, floor, james, size, threads = self.runtime, self.floor, self.james, self.size, self.threads
        one, many = f"{self.prefix}throughput-1", f"{self.prefix}throughput-{threads}"
        if floor is not None:
            self.warm_up()
        self.both(
            "single_enqueue",
            single,
            {
                "floor": lambda n: floor_enqueue_phase(floor, floor.enqueue, "floor-1", n, size, 1),
                "james": lambda n: floor_enqueue_phase(floor, james.enqueue, "james-1", n, size, 1),
            },
            lambda n: enqueue_phase(runtime, one, n, size, 1),
            "enqueue",
        )
        self.both(
            "single_dequeue",
            single,
            {
                "floor": lambda n: floor_dequeue_phase(floor.dequeue_done, "floor-1", n, 1),
                "james": lambda n: floor_dequeue_phase(james.dequeue_done, "james-1", n, 1),
            },
            lambda n: dequeue_phase(runtime, one, n, 1),
            "dequeue",
        )
        check_emptied(runtime, one)
        name, named = f"floor-{threads}", f"james-{threads}"
        self.both(
            "enqueue",
            mails,
            {
                "floor": lambda n: floor_enqueue_phase(floor, floor.enqueue, name, n, size, threads),
                "james": lambda n: floor_enqueue_phase(floor, james.enqueue, named, n, size, threads),
            },
            lambda n: profiled(
                self.profile == "enqueue", lambda: enqueue_phase(runtime, many, n, size, threads)
            ),
        )
        self.both(
            "dequeue",
            mails,
            {
                "floor": lambda n: floor_dequeue_phase(floor.dequeue_done, name, n, threads),
                "james": lambda n: floor_dequeue_phase(james.dequeue_done, named, n, threads),
            },
            lambda n: profiled(self.profile == "dequeue", lambda: dequeue_phase(runtime, many, n, threads)),
        )
        check_emptied(runtime, many)

    def warm_up(self) -> None:
        """Statements prepared, connections opened and the first generation made, by every side."""
        assert self.floor is not None and self.james is not None
        self.floor.prepare()
        self.james.prepare()
        for enqueue, dequeue_done, queue in (
            (self.floor.enqueue, self.floor.dequeue_done, "floor-warm-up"),
            (self.james.enqueue, self.james.dequeue_done, "james-warm-up"),
        ):
            floor_enqueue_phase(self.floor, enqueue, queue, WARM_UP_MAILS, self.size, 1)
            floor_dequeue_phase(dequeue_done, queue, WARM_UP_MAILS, 1)
        warm_up(self.runtime, f"{self.prefix}warm-up", self.size)

    def both(
        self,
        phase: str,
        mails: int,
        of_floors: dict[str, Callable],
        of_mailq: Callable,
        timed: str | None = None,
    ) -> None:
        """`mails` through mailq (and through each floor, in turns); `timed` names the operation whose calls
        are timed by kind."""
        sides = ["mailq"] if self.floor is None else list(SIDES)
        rounds = 1 if self.floor is None else ROUNDS
        for number in range(rounds):
            count = mails * (number + 1) // rounds - mails * number // rounds
            if self.meter is not None:
                self.meter.idle(IDLE_TURN)
            # Each side goes first in turn.
            shift = number % len(sides)
            for side in sides[shift:] + sides[:shift]:
                self._turn(side, phase, count, of_mailq if side == "mailq" else of_floors[side], timed)

    def _turn(self, side: str, phase: str, count: int, of_side: Callable, timed: str | None) -> None:
        key = phase if side == "mailq" else f"{side}_{phase}"
        timings = self.timings[side][timed] if timed else None
        if self.meter is not None:
            self.meter.start()
        if side == "mailq":
            if timings is None:
                measured = of_side(count)
            else:
                with timed_calls(self.runtime, timings):
                    measured = of_side(count)
        else:
            assert self.floor is not None
            self.floor.timings = timings
            measured = of_side(count)
            self.floor.timings = None
        if self.meter is not None:
            self.meter.stop(key)
        self._add(key, measured)

    def _add(self, phase: str, measured: tuple[list[float], float]) -> None:
        latencies, wall = self.measured.get(phase, ([], 0.0))
        self.measured[phase] = (latencies + measured[0], wall + measured[1])


@contextmanager
def fresh(
    settings: Settings, given: bool, threads: int, mail_queues: list[str]
) -> Iterator[tuple[Path, Floor | None]]:
    """A scratch directory next to the deployment's local files (same disk; with RabbitMQ, which has none,
    in the repository), and on Cassandra the floor's connections for up to `threads` callers; refuses a
    deployment that exists already (on RabbitMQ, the objects of `mail_queues`), and removes what the run
    made at the end."""
    local = settings.data_dir
    if given and local is not None and local.exists():
        raise SystemExit(
            f"benchmark: {local} exists: give a data dir (or broker dir) that does not, as the run "
            "removes it at the end"
        )
    beside = REPOSITORY if local is None else local.parent
    beside.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=".bench-scratch-", dir=beside))
    try:
        if settings.backend == CASSANDRA:
            from queue_floor import distributed

            with distributed(settings, scratch, threads, mail_queues) as floor:
                yield scratch, floor
        else:
            yield scratch, None
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
        if given and local is not None:
            shutil.rmtree(local, ignore_errors=True)


def messaging_leg(runtime: Runtime, floor: Floor, name: str) -> tuple[int, dict[str, list[float]]]:
    """mailq's broker against raw pika on the same RabbitMQ, messages of the size of mailq's (the floor's
    payload is made alike): the payload's bytes, and each round's rates by measure (rabbitmq_broker.py)."""
    from rabbitmq_broker import compare
    from rabbitmq_floor import PREFETCH, connection_parameters, raw_queue

    settings = runtime.settings
    assert settings.amqp is not None and settings.cassandra is not None
    size = len(floor.new_mail(name, 0, message(1024), 0).payload)
    parameters = connection_parameters(settings.amqp, settings.tls_files)
    queue = raw_queue(settings.cassandra.keyspace)
    figures = compare(
        parameters, runtime.broker, name, queue, size, LEG_MESSAGES, LEG_ROUNDS, prefetch=PREFETCH
    )
    return size, figures


def server_ports(settings: Settings) -> dict[str, int]:
    """The loopback port each server of a distributed deployment listens on, by the name its CPU is
    reported under (process_cpu.py finds the processes)."""
    assert settings.cassandra is not None and settings.s3 is not None
    ports = {"cassandra": settings.cassandra.contact_points[0][1]}
    endpoint = urlsplit(settings.s3.endpoint or "")
    if endpoint.port is not None:
        ports["s3"] = endpoint.port
    if settings.amqp is not None:
        ports["rabbitmq"] = settings.amqp.port
    return ports


def cost_figures(meter: CpuMeter, rate: dict[str, float], mails: int, single: int) -> dict[str, dict]:
    """CPU milliseconds per mail by process and side in every phase, as measured and net of the background
    (process_cpu.py), and mailq's ratios to the James-like floor in the phases of many callers: CPU per
    mail (net; and as measured) and rate."""
    per_mail: dict[str, dict] = {}
    net: dict[str, dict] = {}
    for phase in FLOOR_PHASES:
        count = single if phase.startswith("single") else mails
        keys = {side: phase if side == "mailq" else f"{side}_{phase}" for side in SIDES}
        per_mail[phase] = {side: meter.ms_per_mail(key, count) for side, key in keys.items()}
        net[phase] = {side: meter.net_ms_per_mail(key, count) for side, key in keys.items()}
    ratios_to_james = {
        operation: {
            "cpu": round(net[operation]["mailq"]["total"] / net[operation]["james"]["total"], 3),
            "cpu_as_measured": round(
                per_mail[operation]["mailq"]["total"] / per_mail[operation]["james"]["total"], 3
            ),
            "rate": round(rate[operation] / rate[f"james_{operation}"], 3),
        }
        for operation in ("enqueue", "dequeue")
    }
    return {
        "processes": sorted(meter.pids),
        "background_percent_of_a_core": meter.background_percent(),
        "cpu_ms_per_mail": per_mail,
        "cpu_ms_per_mail_net": net,
        "ratios_to_james": ratios_to_james,
    }


def print_cost(cost: dict[str, dict], threads: int) -> None:
    background = ", ".join(f"{name} {value}%" for name, value in cost["background_percent_of_a_core"].items())
    print(
        f"CPU per mail, {threads} threads, milliseconds by process (the client is this process), net of the"
        f" background measured in idle turns ({background} of a core)"
    )
    for operation, label in (("enqueue", "enqueue"), ("dequeue", "dequeue + done()")):
        for side, figures in cost["cpu_ms_per_mail_net"][operation].items():
            shares = ", ".join(f"{name} {value}" for name, value in figures.items() if name != "total")
            print(f"  {label:<17} {side:<6} {figures['total']:7.2f} ms ({shares})")
        ratios_of = cost["ratios_to_james"][operation]
        print(
            f"  {label:<17} mailq / James-like: CPU {ratios_of['cpu']}x (target <= {TARGET_JAMES_CPU};"
            f" {ratios_of['cpu_as_measured']}x with the background), rate {ratios_of['rate']}x"
            f" (target >= {TARGET_JAMES_RATE})"
        )


def backend_names(settings: Settings) -> dict[str, str]:
    """What each backend of call_timings.BACKENDS is on this deployment."""
    if settings.backend == EMBEDDED:
        return {"metadata": "SQLite tables", "content": "SQLite content", "broker": "SQLite broker"}
    return {
        "metadata": "Cassandra",
        "content": "S3",
        "broker": "SQLite broker" if settings.amqp is None else "RabbitMQ",
    }


def mail_queue_names(prefix: str, threads: int) -> list[str]:
    """Every mail queue the run uses."""

    bases = ("warm-up", "throughput-1", f"throughput-{threads}", "history", "leg")
    return [f"{prefix}{base}" for base in bases] + queue_names(prefix)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", help="a deployment that does not exist yet (default: a fresh embedded one)")
    parser.add_argument("--mails", type=int, help="mails to enqueue, then dequeue (20000; cassandra:// 300)")
    parser.add_argument("--size", type=int, default=10_240, help="bytes per mail")
    parser.add_argument("--history", type=int, help="processed mails behind size() (1000000; 2000)")
    parser.add_argument("--live", type=int, help="live mails counted by size() (1000; 50)")
    parser.add_argument(
        "--process-mails", type=int, help="mails a turn of the two-process measure (4000; 300)"
    )
    parser.add_argument("--threads", type=int, default=8, help="concurrent callers, as SMTP sessions are")
    parser.add_argument("--profile", choices=("enqueue", "dequeue"), help="print a phase's top costs")
    parser.add_argument(
        "--cost-only",
        action="store_true",
        help="the throughput phases and their cost alone (no messaging leg, size() nor two processes)",
    )
    args = parser.parse_args()

    work = None
    if args.url is None:
        work = Path(tempfile.mkdtemp(prefix=".bench-", dir=REPOSITORY))
        settings = Settings(backend=EMBEDDED, data_dir=work / "throughput")
    else:
        settings = Settings.from_url(args.url)
    if settings.backend not in DEFAULTS:
        raise SystemExit(f"benchmark: no floor for the {settings.backend}:// deployment")
    default_mails, default_history, default_live, default_process_mails = DEFAULTS[settings.backend]
    mails = args.mails or default_mails
    history = args.history or default_history
    live = args.live or default_live
    process_mails = args.process_mails or default_process_mails
    single = mails // 4
    # On RabbitMQ, whose vhost other runs may share, the run's mail queues have names of the run's own.
    prefix = "" if settings.amqp is None or settings.cassandra is None else f"{settings.cassandra.keyspace}-"
    synchronous = SYNCHRONOUS[settings.durability]
    shown = redact(settings.url or settings.to_url())
    print(f"deployment {shown} (durability {settings.durability}: synchronous={synchronous})")
    try:
        names = mail_queue_names(prefix, args.threads)
        with fresh(settings, args.url is not None, args.threads, names) as (scratch, floor):
            with Runtime(settings, create=True) as runtime:
                meter = None if floor is None else CpuMeter(server_ports(settings))
                run = Phases(runtime, floor, prefix, args.size, args.threads, args.profile, meter)
                run.throughput(mails, single)
                leg = sizes = processes = None
                if floor is not None and settings.amqp is not None and not args.cost_only:
                    leg = messaging_leg(runtime, floor, f"{prefix}leg")
                if floor is not None and not args.cost_only:
                    started = time.perf_counter()
                    slices = build_history_distributed(runtime, floor, f"{prefix}history", history)
                    history_seconds = time.perf_counter() - started
                    sizes, answer, browse_seconds = size_phase(runtime, f"{prefix}history", live, args.size)
                if not args.cost_only:
                    processes = measure(settings, prefix, process_mails, args.size, args.threads)
            raw_rate = None
            if floor is None and not args.cost_only:
                # A store of its own, beside the deployment's: the content the phases above left in the
                # deployment's file is not what size() is measured against.
                history_settings = replace(settings, data_dir=scratch / "history", url="")
                with Runtime(history_settings, create=True) as runtime:
                    started = time.perf_counter()
                    slices = build_history(runtime, history)
                    history_seconds = time.perf_counter() - started
                    sizes, answer, browse_seconds = size_phase(runtime, "history", live, args.size)
                raw_rate = raw_sqlite_rate(scratch / "raw.db", synchronous, RAW_TRANSACTIONS)
    finally:
        if work is not None:
            shutil.rmtree(work, ignore_errors=True)

    measured = run.measured
    rate = {
        phase: (single if phase.endswith(("single_enqueue", "single_dequeue")) else mails) / wall
        for phase, (_, wall) in measured.items()
    }
    enqueue, dequeue = measured["enqueue"][0], measured["dequeue"][0]
    figures: dict[str, object] = {
        "deployment": settings.backend,
        "mails": mails,
        "threads": args.threads,
        "enqueue_per_s": round(rate["enqueue"]),
        "dequeue_ack_per_s": round(rate["dequeue"]),
        "single_thread_enqueue_per_s": round(rate["single_enqueue"]),
        "single_thread_dequeue_ack_per_s": round(rate["single_dequeue"]),
        # Issue 24's measure of what concurrent callers gain: the threads' rate over one thread's.
        "enqueue_threads_to_single": round(rate["enqueue"] / rate["single_enqueue"], 2),
        "enqueue_p50_ms": ms(enqueue, 0.5),
        "enqueue_p99_ms": ms(enqueue, 0.99),
        "dequeue_p50_ms": ms(dequeue, 0.5),
        "dequeue_p99_ms": ms(dequeue, 0.99),
    }
    if sizes is not None:
        figures["size_p50_ms"] = ms(sizes, 0.5)
        figures["size_p99_ms"] = ms(sizes, 0.99)
        figures["size_by_browse_ms"] = round(browse_seconds * 1e3)
    if run.meter is not None:
        figures["cost"] = cost = cost_figures(run.meter, rate, mails, single)
    if raw_rate is not None:
        figures["raw_sqlite_tx_per_s"] = round(raw_rate)
        figures["enqueue_ratio_to_raw"] = round(rate["enqueue"] / raw_rate, 3)
        figures["dequeue_ratio_to_raw"] = round(rate["dequeue"] / raw_rate, 3)
        figures["targets"] = {
            "enqueue_ge_3000_per_s": rate["enqueue"] >= TARGET_RATE,
            "dequeue_ack_ge_3000_per_s": rate["dequeue"] >= TARGET_RATE,
            "enqueue_ratio_ge_0.2": figures["enqueue_ratio_to_raw"] >= TARGET_RATIO,
            "dequeue_ratio_ge_0.2": figures["dequeue_ratio_to_raw"] >= TARGET_RATIO,
            "size_p99_le_5ms": figures["size_p99_ms"] <= TARGET_SIZE_MS,
            "size_equals_live": answer == live,
        }
    elif floor is None:
        figures["targets"] = {}
    else:
        targets = {}
        for phase, label in FLOOR_PHASES.items():
            figures[f"floor_{label}_per_s"] = round(rate[f"floor_{phase}"])
            figures[f"{label}_ratio_to_floor"] = ratio = round(rate[phase] / rate[f"floor_{phase}"], 3)
            targets[f"{label}_ratio_ge_0.7"] = ratio >= TARGET_FLOOR_RATIO
            figures[f"james_{label}_per_s"] = round(rate[f"james_{phase}"])
        for operation in ("enqueue", "dequeue"):
            cpu, ratio = cost["ratios_to_james"][operation]["cpu"], cost["ratios_to_james"][operation]["rate"]
            targets[f"{operation}_cpu_le_{TARGET_JAMES_CPU}x_james"] = cpu <= TARGET_JAMES_CPU
            targets[f"{operation}_rate_ge_{TARGET_JAMES_RATE}x_james"] = ratio >= TARGET_JAMES_RATE
        if sizes is not None:
            targets["size_equals_live"] = answer == live
        figures["targets"] = targets
    where = {}
    for operation, phase, kinds in (
        ("enqueue", "single_enqueue", ENQUEUE),
        ("dequeue", "single_dequeue", DEQUEUE_DONE),
    ):
        where[operation] = {
            "mailq": breakdown(run.timings["mailq"][operation], single, measured[phase][1], kinds)
        }
        if floor is not None:
            for side in ("floor", "james"):
                where[operation][side] = breakdown(
                    run.timings[side][operation], single, measured[f"{side}_{phase}"][1], kinds
                )
    figures["ms_per_mail_one_thread"] = where
    names = backend_names(settings)
    by_backend = {
        operation: {side: grouped(table, names, "own Python") for side, table in tables.items()}
        for operation, tables in where.items()
    }
    figures["ms_per_mail_by_backend"] = by_backend
    targets = figures["targets"]
    assert isinstance(targets, dict)
    if leg is not None:
        payload_bytes, samples = leg
        medians = {key: statistics.median(values) for key, values in samples.items()}
        leg_ratios = ratios(medians)
        figures["messaging_leg"] = {
            "messages": LEG_MESSAGES,
            "payload_bytes": payload_bytes,
            "rounds": LEG_ROUNDS,
            **{f"{key}_per_s": round(value) for key, value in medians.items()},
            **{f"ratio_{key}": round(value, 3) for key, value in leg_ratios.items()},
        }
        for key, value in leg_ratios.items():
            targets[f"messaging_leg_{key}_ratio_ge_0.5"] = value >= TARGET_LEG_RATIO
    if processes is not None:
        (one_enqueue, one_dequeue), (two_enqueue, two_dequeue) = processes[1], processes[2]
        figures["processes"] = {
            "mails_a_turn": process_mails,
            "threads_each": args.threads,
            "one_enqueue_per_s": round(one_enqueue),
            "one_dequeue_ack_per_s": round(one_dequeue),
            "two_enqueue_per_s": round(two_enqueue),
            "two_dequeue_ack_per_s": round(two_dequeue),
            "enqueue_two_over_one": round(two_enqueue / one_enqueue, 3),
            "dequeue_two_over_one": round(two_dequeue / one_dequeue, 3),
        }

    f = figures
    print(
        f"enqueue          {f['enqueue_per_s']:6} mails/s  p50 {f['enqueue_p50_ms']} ms"
        f"  p99 {f['enqueue_p99_ms']} ms  ({mails} mails of {args.size} bytes, {args.threads} threads;"
        f" one thread: {f['single_thread_enqueue_per_s']} mails/s)"
    )
    print(
        f"dequeue + done() {f['dequeue_ack_per_s']:6} mails/s  p50 {f['dequeue_p50_ms']} ms"
        f"  p99 {f['dequeue_p99_ms']} ms  (one thread: {f['single_thread_dequeue_ack_per_s']} mails/s)"
    )
    if sizes is not None:
        print(
            f"history          {history} processed mails in {slices} slices, written directly in "
            f"{history_seconds:.1f} s"
        )
        print(
            f"size()           {answer} (live: {live})  p50 {f['size_p50_ms']} ms"
            f"  p99 {f['size_p99_ms']} ms; counting by browse instead takes {f['size_by_browse_ms']} ms"
        )
    if raw_rate is not None:
        print(
            f"raw SQLite       {f['raw_sqlite_tx_per_s']:6} one-row transactions/s; ratios: enqueue "
            f"{f['enqueue_ratio_to_raw']}, dequeue + done() {f['dequeue_ratio_to_raw']}"
        )
    elif floor is not None:
        for phase, label in FLOOR_PHASES.items():
            print(
                f"floor {label:<26} {f[f'floor_{label}_per_s']:6} mails/s; mailq {round(rate[phase]):6}"
                f" mails/s; ratio {f[f'{label}_ratio_to_floor']}; James-like {f[f'james_{label}_per_s']:6}"
                " mails/s"
            )
        print_cost(cost, args.threads)
    if leg is not None:
        leg_figures = figures["messaging_leg"]
        assert isinstance(leg_figures, dict)
        print(
            f"messaging leg    {LEG_MESSAGES} messages of {leg_figures['payload_bytes']} bytes"
            f" (mailq's payload), medians of {LEG_ROUNDS} rounds: mailq against raw pika"
            f" (target >= {TARGET_LEG_RATIO})"
        )
        for key, label in (
            ("publish", f"publish, {PUBLISHERS} threads / {WINDOW} in flight"),
            ("consume_1", "receive + ack, 1 thread"),
            ("consume_n", f"receive + ack, {CONSUMERS} threads"),
        ):
            raw = leg_figures["raw_publish_per_s" if key == "publish" else "raw_consume_per_s"]
            print(
                f"  {label:<38} {leg_figures[f'mailq_{key}_per_s']:6} /s against {raw:6}"
                f" /s: ratio {leg_figures[f'ratio_{key}']}"
            )
    if processes is not None:
        p = figures["processes"]
        assert isinstance(p, dict)
        print(
            f"two processes    enqueue {p['two_enqueue_per_s']} mails/s against one's"
            f" {p['one_enqueue_per_s']} ({p['enqueue_two_over_one']}x); dequeue + done()"
            f" {p['two_dequeue_ack_per_s']} against {p['one_dequeue_ack_per_s']}"
            f" ({p['dequeue_two_over_one']}x); {process_mails} mails a turn, {args.threads} threads a process"
        )
    print("where the time goes, one thread, per mail: milliseconds (calls) by the runtime's call")
    for operation, tables in where.items():
        print_breakdown(operation if operation == "enqueue" else "dequeue + done()", tables)
    print("the same by backend, milliseconds per mail")
    for operation, groups in by_backend.items():
        print_breakdown(
            operation if operation == "enqueue" else "dequeue + done()",
            {side: {name: [spent, 0] for name, spent in table.items()} for side, table in groups.items()},
        )
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
