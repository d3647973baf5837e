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
     messages of the size of mailq's payload (messaging_leg.compare: LEG_ROUNDS rounds, medians);
  7. two mailq processes on one queue against one, enqueue then dequeue + done() (queue_processes.py).
Prints one line per measure, then one JSON object as the last line.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from call_timings import DEQUEUE_DONE, ENQUEUE, breakdown, grouped, print_breakdown
from messaging_leg import CONSUMERS, PUBLISHERS, WINDOW, compare, ratios
from process_cpu import CpuMeter
from queue_history import build_history, build_history_distributed, raw_sqlite_rate, size_phase
from queue_phases import message
from queue_processes import measure, queue_names
from queue_turns import SIDES, Phases
from quick import parse_args

from mailq_runtime import Runtime
from mailq_runtime.settings import CASSANDRA, EMBEDDED, Settings, redact
from mailq_runtime.stores.embedded import SYNCHRONOUS

if TYPE_CHECKING:
    from queue_floor import Floor

REPOSITORY = Path(__file__).resolve().parent.parent
RAW_TRANSACTIONS = 20_000
# mails, history, live: bounded on a distributed deployment, where each call is a network round trip.
# process_mails: each turn's mails of the two-process measure, bounded on the embedded deployment too.
DEFAULTS = {EMBEDDED: (20_000, 1_000_000, 1000, 4000), CASSANDRA: (300, 2000, 50, 300)}
# The messaging leg against raw pika: messages each way a round (a multiple of messaging_leg's
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
# The cost per mail against the James-like floor, in the phases of `--threads` callers:
# CPU per mail at most this many times the floor's, the rate at least this fraction of its.
TARGET_JAMES_CPU = 1.25
TARGET_JAMES_RATE = 0.8


def ms(seconds: list[float], fraction: float) -> float:
    """The `fraction` percentile of `seconds`, in milliseconds."""
    ordered = sorted(seconds)
    return round(ordered[min(len(ordered) - 1, int(fraction * len(ordered)))] * 1e3, 3)


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


def messaging_leg(
    runtime: Runtime, floor: Floor, name: str, messages: int
) -> tuple[int, dict[str, list[float]]]:
    """mailq's broker against raw pika on the same RabbitMQ, messages of the size of mailq's (the floor's
    payload is made alike): the payload's bytes, and each round's rates by measure (messaging_leg.py)."""
    from rabbitmq_floor import PREFETCH, connection_parameters, raw_queue

    settings = runtime.settings
    assert settings.amqp is not None and settings.cassandra is not None
    size = len(floor.new_mail(name, 0, message(1024), 0).payload)
    parameters = connection_parameters(settings.amqp, settings.tls_files)
    queue = raw_queue(settings.cassandra.keyspace)
    figures = compare(parameters, runtime.broker, name, queue, size, messages, LEG_ROUNDS, prefetch=PREFETCH)
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
    parser.add_argument(
        "--leg-messages",
        type=int,
        default=LEG_MESSAGES,
        help=f"RabbitMQ: messages each way a round of the messaging leg (a multiple of {PUBLISHERS})",
    )
    parser.add_argument(
        "--raw-transactions", type=int, default=RAW_TRANSACTIONS, help="embedded: the floor's transactions"
    )
    quick = {"mails": 80, "history": 400, "live": 20, "process_mails": 80}
    args = parse_args(parser, {**quick, "leg_messages": PUBLISHERS * 2, "raw_transactions": 400})

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
                    leg = messaging_leg(runtime, floor, f"{prefix}leg", args.leg_messages)
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
                raw_rate = raw_sqlite_rate(scratch / "raw.db", synchronous, args.raw_transactions)
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
        # What concurrent callers gain: the threads' rate over one thread's.
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
            "messages": args.leg_messages,
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
            f"messaging leg    {args.leg_messages} messages of {leg_figures['payload_bytes']} bytes"
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
