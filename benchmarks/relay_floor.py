"""The floor of relaying on this machine: how fast any Python relay built on the prescribed libraries
(aiosmtpd on uvloop to receive, smtplib to send, SQLite in WAL with a synced commit per acknowledged
mail) can go, against a private Postfix relaying the same load to the same sink in the same run (issue
25, item 5).

    .venv/bin/python benchmarks/relay_floor.py [--mails N] [--sessions N] [--size BYTES]
                                               [--relay-threads N] [--processes N] [--workers N]
                                               [--worker-threads N]

One smtp-sink takes every mail (relay.py's, counted as relay.py counts), and each measure is the same
`smtp-source -s SESSIONS -m MAILS -l SIZE` for a domain no one here hosts, with relay.py's latency probe:
- Postfix relaying to the sink (relay.py's measure): accepted and drained, the peer.
- mailq as relay.py measures it (--processes `mailq smtp`, --workers `mailq worker --relay` of
  --worker-threads each, a fresh embedded data dir), for the CPU a mail it spends beside the floor's.
- The protocol floor: 1, then 2 processes sharing the port (SO_REUSEPORT) of a stock aiosmtpd server
  on uvloop whose handler answers 250 and keeps nothing: accepted.
- The relay floor: 1, then 2 such processes whose handler first writes the mail to the process's SQLite
  file (WAL, synchronous=FULL) through one writer thread that takes every mail waiting into one
  transaction, so concurrent sessions share a commit and its sync; plus one relaying process that
  reads the rows after the last it took (its only claim: it is the queues' one reader), hands them to
  --relay-threads smtplib sessions to the sink, each reused for every mail, and deletes the sent rows
  with one synced commit per batch. Timed to the last mail the sink took.
The CPU per mail of every process in each measure (from /proc: the servers, the relayer, Postfix's
whole process tree, smtp-sink; smtp-source as this process's reaped child; this process, which runs the
probe and counts the sink's files), and the ceiling it sets: the cores over the CPU of a mail. Prints
one line per measure, then one JSON object as the last line, with each rate over Postfix's.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import queue
import resource
import shutil
import smtplib
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

import uvloop
from aiosmtpd.smtp import SMTP, Envelope, Session

REPOSITORY = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPOSITORY))

from deployments import fresh_deployment  # noqa: E402
from process_cpu import TICK_SECONDS, listening_pid, ticks  # noqa: E402
from relay import RECIPIENT, drained, mailq_relay, postfix_relay, sink_count  # noqa: E402
from smtp_end_to_end import free_port, run_load, stop, wait_for_listeners  # noqa: E402

from mailq_servers.smtp_sink import SmtpSink  # noqa: E402

CORES = os.cpu_count() or 1
INSERT = "INSERT INTO queue (sender, recipients, content) VALUES (?, ?, ?)"


def open_queue(path: str) -> sqlite3.Connection:
    """A queue file in WAL where each commit syncs the log (synchronous=FULL): a mail acknowledged is on
    disk. AUTOINCREMENT: a row's id is never reused once the relayer deleted the last row, so the
    relayer's "after the last id taken" misses none."""
    database = sqlite3.connect(path, check_same_thread=False)
    database.execute("PRAGMA journal_mode=WAL")
    database.execute("PRAGMA synchronous=FULL")
    database.execute(
        "CREATE TABLE IF NOT EXISTS queue"
        " (id INTEGER PRIMARY KEY AUTOINCREMENT, sender TEXT, recipients TEXT, content BLOB)"
    )
    return database


class Committer:
    """One writer thread: every mail waiting goes into one transaction and one sync, then each waiting
    session is answered through one call into the event loop."""

    def __init__(self, path: str, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.waiting: queue.SimpleQueue[tuple[tuple, asyncio.Future]] = queue.SimpleQueue()
        threading.Thread(target=self._write, args=(open_queue(path),), daemon=True).start()

    async def store(self, row: tuple) -> None:
        future = self.loop.create_future()
        self.waiting.put((row, future))
        await future

    def _write(self, database: sqlite3.Connection) -> None:
        while True:
            batch = [self.waiting.get()]
            while not self.waiting.empty():
                batch.append(self.waiting.get())
            with database:
                database.executemany(INSERT, [row for row, _ in batch])
            self.loop.call_soon_threadsafe(_settle, [future for _, future in batch])


def _settle(futures: list[asyncio.Future]) -> None:
    for future in futures:
        if not future.done():  # a session that was dropped meanwhile
            future.set_result(None)


class Discard:
    """The protocol floor's handler: 250 to every mail, nothing kept."""

    async def handle_DATA(self, server: SMTP, session: Session, envelope: Envelope) -> str:
        return "250 2.0.0 Ok"


class Keep:
    """The relay floor's handler: 250 once the mail is in the queue file and synced."""

    def __init__(self, committer: Committer) -> None:
        self.committer = committer

    async def handle_DATA(self, server: SMTP, session: Session, envelope: Envelope) -> str:
        await self.committer.store((envelope.mail_from, "\n".join(envelope.rcpt_tos), envelope.content))
        return "250 2.0.0 Ok: queued"


async def receive(port: int, database: str | None) -> None:
    """A stock aiosmtpd SMTP a connection, on a port shared with the other processes (SO_REUSEPORT)."""
    loop = asyncio.get_running_loop()
    handler = Discard() if database is None else Keep(Committer(database, loop))
    server = await loop.create_server(
        lambda: SMTP(handler, hostname="floor.example"), "127.0.0.1", port, reuse_port=True
    )
    async with server:
        await server.serve_forever()


def send(host: str, port: int, outbox: queue.SimpleQueue, sent: queue.SimpleQueue) -> None:
    """One reused smtplib session: MAIL, RCPT, DATA and the content, a round trip each (smtplib does
    not pipeline)."""
    with smtplib.SMTP(host, port, timeout=120) as smtp:
        smtp.ehlo("relay-floor.example")
        while True:
            index, row_id, sender, recipients, content = outbox.get()
            smtp.sendmail(sender, recipients.split("\n"), content)
            sent.put((index, row_id))


def relay(sink: str, databases: list[str], threads: int) -> None:
    """Polls the queue files for rows after the last taken, hands them to `threads` sending sessions,
    and deletes what they sent, one synced commit per file and round."""
    host, port = sink.rsplit(":", 1)
    outbox: queue.SimpleQueue = queue.SimpleQueue()
    sent: queue.SimpleQueue = queue.SimpleQueue()
    for _ in range(threads):
        threading.Thread(target=send, args=(host, int(port), outbox, sent), daemon=True).start()
    queues = [open_queue(path) for path in databases]
    taken = [0] * len(queues)
    while True:
        busy = False
        for index, database in enumerate(queues):
            rows = database.execute(
                "SELECT id, sender, recipients, content FROM queue WHERE id > ? ORDER BY id", (taken[index],)
            ).fetchall()
            for row in rows:
                outbox.put((index, *row))
            if rows:
                taken[index] = rows[-1][0]
                busy = True
        done: dict[int, list[tuple[int]]] = {}
        while not sent.empty():
            index, row_id = sent.get()
            done.setdefault(index, []).append((row_id,))
        for index, ids in done.items():
            with queues[index]:
                queues[index].executemany("DELETE FROM queue WHERE id = ?", ids)
        if not busy and not done:
            time.sleep(0.002)  # an idle poll: a new row waits 2 ms at most


def role(*argv: str) -> subprocess.Popen:
    """This file run as one of the measure's processes (`--receive` or `--relay`)."""
    return subprocess.Popen([sys.executable, __file__, *argv], cwd=REPOSITORY)


def tree_ticks(root: int) -> int:
    """The CPU ticks of `root` and its descendants, with those of the children they reaped (cutime and
    cstime): Postfix's master starts and reaps its daemons during the measure."""
    stats = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stats[int(entry.name)] = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue  # a process that ended meanwhile: its reaper's cutime has it
    parents = {pid: int(fields[1]) for pid, fields in stats.items()}
    total = 0
    for pid, fields in stats.items():
        ancestor = pid
        while ancestor not in (root, 0, 1) and ancestor in parents:
            ancestor = parents[ancestor]
        if ancestor == root:
            total += sum(int(field) for field in fields[11:15])
    return total


def reaped_seconds() -> float:
    """The CPU of this process's reaped children: smtp-source, the one ended during a measure."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def own_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def measure(
    args: argparse.Namespace,
    port: int,
    meters: dict[str, Callable[[], float]],
    delivered: Callable[[], int],
    before: int,
) -> dict:
    """run_load's figures on `port` (done when `delivered()` is `before` plus the load's mails) with the
    CPU per mail of each meter (seconds so far), their total and the ceiling it sets."""
    meters = {**meters, "smtp-source": reaped_seconds, "probe": own_seconds}
    started = {name: meter() for name, meter in meters.items()}
    figures = run_load(port, args, delivered, before, RECIPIENT)
    cpu = {name: (meter() - started[name]) * 1000 / figures["mails"] for name, meter in meters.items()}
    figures["cpu_ms_per_mail"] = {name: round(ms, 3) for name, ms in cpu.items()}
    figures["cpu_ms_per_mail"]["total"] = round(sum(cpu.values()), 3)
    figures["ceiling_per_s"] = round(CORES * 1000 / sum(cpu.values()), 1)
    return figures


def pids_seconds(pids: list[int]) -> Callable[[], float]:
    return lambda: sum(ticks(pid) for pid in pids) * TICK_SECONDS


def bench_postfix(args: argparse.Namespace, sink: SmtpSink, sink_meter: Callable[[], float]) -> dict:
    with postfix_relay(args, sink) as (port, postfix):
        assert postfix.root is not None
        master = int((postfix.root / "queue" / "pid" / "master.pid").read_text())
        meters = {"postfix": lambda: tree_ticks(master) * TICK_SECONDS, "smtp-sink": sink_meter}
        return drained(measure(args, port, meters, lambda: sink_count(sink), sink_count(sink)))


def bench_mailq(args: argparse.Namespace, sink: SmtpSink, sink_meter: Callable[[], float]) -> dict:
    """relay.py's mailq measure (embedded, a fresh data dir): the CPU a mail it spends beside the floor's."""
    with fresh_deployment("relay", None) as deployment:
        with mailq_relay(deployment.url, args, sink) as (port, servers, workers):
            meters = {
                "servers": pids_seconds([server.pid for server in servers]),
                "relayer": pids_seconds([worker.pid for worker in workers]),
                "smtp-sink": sink_meter,
            }
            return drained(measure(args, port, meters, lambda: sink_count(sink), sink_count(sink)))


def bench_protocol(args: argparse.Namespace, processes: int) -> dict:
    port = free_port()
    servers = [role("--receive", str(port)) for _ in range(processes)]
    try:
        wait_for_listeners(port, processes)
        # Nothing is forwarded: every mail counts as delivered once smtp-source is done.
        meters = {"servers": pids_seconds([server.pid for server in servers])}
        figures = measure(args, port, meters, lambda: sys.maxsize, 0)
        del figures["end_to_end_per_s"]  # the accepted rate: nothing goes further
        return figures
    finally:
        for server in servers:
            stop(server)


def bench_relay(
    args: argparse.Namespace, processes: int, sink: SmtpSink, sink_meter: Callable[[], float]
) -> dict:
    directory = Path(tempfile.mkdtemp(prefix=".bench-relay-floor-", dir=REPOSITORY))  # the repository's disk
    databases = [str(directory / f"queue-{index}.sqlite") for index in range(processes)]
    for database in databases:
        open_queue(database).close()  # WAL and the table, before any process opens the file
    port = free_port()
    servers = [role("--receive", str(port), database) for database in databases]
    relayer = role("--relay", f"{sink.host}:{sink.port}", str(args.relay_threads), *databases)
    try:
        wait_for_listeners(port, processes)
        before = sink_count(sink)
        with smtplib.SMTP("127.0.0.1", port) as smtp:  # one mail through: every process is up
            smtp.sendmail("bench@sender.example", [RECIPIENT], b"Subject: first\r\n\r\nfirst\r\n")
        while sink_count(sink) < before + 1:
            time.sleep(0.05)
        meters = {
            "servers": pids_seconds([server.pid for server in servers]),
            "relayer": pids_seconds([relayer.pid]),
            "smtp-sink": sink_meter,
        }
        return drained(measure(args, port, meters, lambda: sink_count(sink), sink_count(sink)))
    finally:
        for process in [*servers, relayer]:
            stop(process)
        shutil.rmtree(directory, ignore_errors=True)


def ratios(result: dict) -> dict[str, dict[str, float]]:
    """Each floor's rates over Postfix's: accepted over accepted, drained over drained."""
    postfix = result["postfix"]
    both = ("accepted_per_s", "drained_per_s")
    return {
        name: {
            rate: round(figures[rate] / postfix[rate], 2)
            for rate in (both[:1] if name.startswith("protocol") else both)
        }
        for name, figures in result.items()
        if name != "postfix"
    }


def bench(args: argparse.Namespace) -> None:
    result = {}
    with SmtpSink(free_port()) as sink:
        sink_pid = listening_pid(sink.port)
        assert sink_pid is not None
        sink_meter = pids_seconds([sink_pid])
        result["postfix"] = bench_postfix(args, sink, sink_meter)
        print(f"postfix: {json.dumps(result['postfix'])}", flush=True)
        name = f"mailq, {args.processes} mailq smtp, {args.workers} worker"
        result[name] = bench_mailq(args, sink, sink_meter)
        print(f"{name}: {json.dumps(result[name])}", flush=True)
        for processes in (1, 2):
            name = f"protocol floor, {processes} process{'es' if processes > 1 else ''}"
            result[name] = bench_protocol(args, processes)
            print(f"{name}: {json.dumps(result[name])}", flush=True)
        for processes in (1, 2):
            name = f"relay floor, {processes} process{'es' if processes > 1 else ''}"
            result[name] = bench_relay(args, processes, sink, sink_meter)
            print(f"{name}: {json.dumps(result[name])}", flush=True)
    result["ratio"] = ratios(result)
    print(json.dumps(result))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mails", type=int, default=3000)
    parser.add_argument("--sessions", type=int, default=20)
    parser.add_argument("--size", type=int, default=10240)
    parser.add_argument("--relay-threads", type=int, default=4, help="the relayer's smtplib sessions")
    parser.add_argument("--processes", type=int, default=2, help="mailq's measure: `mailq smtp` processes")
    parser.add_argument("--workers", type=int, default=1, help="mailq's: `mailq worker --relay` processes")
    parser.add_argument("--worker-threads", type=int, default=4, help="mailq's: each worker's --threads")
    # The measure's own processes: this file run again.
    parser.add_argument("--receive", nargs="+", metavar="PORT [DATABASE]", help=argparse.SUPPRESS)
    parser.add_argument("--relay", nargs="+", metavar="SINK THREADS DATABASE", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.receive:
        uvloop.run(receive(int(args.receive[0]), args.receive[1] if len(args.receive) > 1 else None))
    elif args.relay:
        relay(args.relay[0], args.relay[2:], int(args.relay[1]))
    else:
        bench(args)


if __name__ == "__main__":
    main()
