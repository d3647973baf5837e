"""The floor of SMTP in, end to end: what any Python server on aiosmtpd + uvloop + SQLite could reach on
this machine, beside a private Postfix delivering to Maildir and mailq itself, under the same load in the
same run (issue 24, item 4: mailq's end-to-end rate at least 2x Postfix's).

    .venv/bin/python benchmarks/smtp_floor.py [--mails N] [--sessions N] [--size BYTES] [--no-mailq]

Each measure is smtp_end_to_end.py's: `smtp-source -s SESSIONS -m MAILS -l SIZE` and one smtplib client
timing each end-of-DATA reply, the time from the first connection to the last mail delivered. In turn:

  postfix       Postfix end to end, to Maildir (smtp_end_to_end.py's `bench_postfix`): the peer.
  discard       The protocol floor: a stock aiosmtpd server on uvloop whose handler answers 250 and keeps
                nothing, one process, then two sharing the port (SO_REUSEPORT). Nothing is delivered: the
                accept is the end. An upper bound for anything built on aiosmtpd.
  durable       The durable floor: the same server, whose handler hands the mail (envelope and content,
                one row) to a single writer thread that takes every mail waiting into one SQLite
                transaction (WAL, synchronous=NORMAL, then an fdatasync of the WAL, as mailq's store at
                its durable default) and answers each 250 once it is synced; and one delivery process
                that takes the queued rows, appends each to a `mailbox` table and deletes it from the queue,
                one synced commit a batch. Timed to the last row in `mailbox`; one process, then two, each
                on a fresh SQLite file next to the repository (the disk mailq's store is on).
  mailq         `mailq smtp` + `mailq worker` on a fresh embedded deployment (`bench_mailq`), one process
                then two (skipped with --no-mailq).

Each measure's CPU a mail (utime + stime, from /proc): the servers, the delivery process (mailq: the
worker), smtp-source (the children's rusage over the load; for mailq, the figure of the durable floor with
as many processes, as the load is the same) and this process (the timing client and the polling; not
measured for mailq, whose measures run inside `bench_mailq`). The CPU
ceiling is cores / (the sum) in mails/s; the 2x budget is the CPU a mail that 2x Postfix's rate leaves on
these cores. Prints one line per measure, then one JSON object with every rate's ratio over Postfix's
end-to-end rate.

The servers are this script's own roles, run as processes by the run: `--serve smtp --port P` (discard),
the same with `--database FILE` (durable), and `--serve deliver --database FILE`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import queue
import resource
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

import uvloop
from aiosmtpd.smtp import SMTP, Envelope, Session
from deployments import REPOSITORY, fresh_deployment
from smtp_end_to_end import (
    bench_mailq,
    bench_postfix,
    cpu_per_mail,
    free_port,
    run_load,
    stop,
    wait_for_listeners,
)

CORES = os.cpu_count() or 2
DELIVERY_BATCH = 256  # rows a delivery commit takes at most, as a worker bounds what it claims at once
IDLE_POLL_SECONDS = 0.002
SCHEMA = (
    "CREATE TABLE queue (id INTEGER PRIMARY KEY, sender TEXT, recipients TEXT, content BLOB)",
    "CREATE TABLE mailbox (id INTEGER PRIMARY KEY, sender TEXT, recipients TEXT, content BLOB)",
)


class SyncedDatabase:
    """A connection to the floor's SQLite file whose every commit is durable when `commit` returns: WAL
    at synchronous=NORMAL, then an fdatasync of the WAL, as mailq's embedded store does at `fsync`."""

    def __init__(self, path: Path) -> None:
        self.path = path
        # Two server processes share the file: a writer that finds it locked waits for its turn.
        self.connection = sqlite3.connect(path, isolation_level=None, check_same_thread=False, timeout=60)
        self.connection.execute("PRAGMA synchronous=NORMAL")
        self._wal: int | None = None

    def commit(self, writes: Callable[[sqlite3.Connection], None]) -> None:
        self.connection.execute("BEGIN IMMEDIATE")
        try:
            writes(self.connection)
        except BaseException:
            self.connection.execute("ROLLBACK")
            raise
        self.connection.execute("COMMIT")
        if self._wal is None:  # the WAL exists from the first commit until the last connection closes
            self._wal = os.open(f"{self.path}-wal", os.O_RDONLY | os.O_CLOEXEC)
        os.fdatasync(self._wal)


def create_database(path: Path) -> None:
    connection = sqlite3.connect(path, isolation_level=None)
    try:
        connection.execute("PRAGMA journal_mode=WAL")  # the file's mode from now on, for every connection
        for statement in SCHEMA:
            connection.execute(statement)
    finally:
        connection.close()


class Discard:
    async def handle_DATA(self, server: SMTP, session: Session, envelope: Envelope) -> str:
        return "250 2.0.0 Ok"


class GroupCommit:
    """The durable handler: each mail waits in a queue for the writer thread, which takes every mail
    waiting into one transaction and one sync (as mailq's group commit), then wakes their sessions with
    one call into the event loop."""

    def __init__(self, database: SyncedDatabase, loop: asyncio.AbstractEventLoop) -> None:
        self.database = database
        self.loop = loop
        self.waiting: queue.SimpleQueue[tuple[tuple[str, str, bytes], asyncio.Future]] = queue.SimpleQueue()
        threading.Thread(target=self._write, daemon=True).start()

    async def handle_DATA(self, server: SMTP, session: Session, envelope: Envelope) -> str:
        committed = self.loop.create_future()
        row = (envelope.mail_from, ",".join(envelope.rcpt_tos), envelope.original_content)
        self.waiting.put((row, committed))
        await committed  # a failed commit raises here: aiosmtpd answers 500, nothing is acknowledged
        return "250 2.0.0 Ok"

    def _write(self) -> None:
        while True:
            batch = [self.waiting.get()]
            while not self.waiting.empty():
                batch.append(self.waiting.get_nowait())
            futures = [future for _, future in batch]
            try:
                self.database.commit(partial(_enqueue, rows=[row for row, _ in batch]))
            except (sqlite3.Error, OSError) as error:
                self.loop.call_soon_threadsafe(_settle, futures, error)
            else:
                self.loop.call_soon_threadsafe(_settle, futures, None)


def _enqueue(connection: sqlite3.Connection, rows: list[tuple[str, str, bytes]]) -> None:
    connection.executemany("INSERT INTO queue (sender, recipients, content) VALUES (?, ?, ?)", rows)


def _settle(futures: list[asyncio.Future], error: BaseException | None) -> None:
    for future in futures:
        if error is None:
            future.set_result(None)
        else:
            future.set_exception(error)


async def serve(port: int, database: Path | None) -> None:
    loop = asyncio.get_running_loop()
    handler = Discard() if database is None else GroupCommit(SyncedDatabase(database), loop)
    server = await loop.create_server(
        lambda: SMTP(handler, hostname="floor.example"), "127.0.0.1", port, reuse_port=True
    )
    async with server:
        await server.serve_forever()


def deliver(path: Path) -> None:
    """The delivery process: forever, the queued rows into `mailbox` and out of `queue`, a synced commit a
    batch. It is the file's only reader of `queue` that deletes, so reading before the write lock is a
    claim nobody else can race."""
    database = SyncedDatabase(path)
    while True:
        rows = database.connection.execute(
            "SELECT id, sender, recipients, content FROM queue ORDER BY id LIMIT ?", (DELIVERY_BATCH,)
        ).fetchall()
        if rows:
            database.commit(partial(_move, rows=rows))
        else:
            time.sleep(IDLE_POLL_SECONDS)


def _move(connection: sqlite3.Connection, rows: list[tuple[int, str, str, bytes]]) -> None:
    connection.executemany(
        "INSERT INTO mailbox (sender, recipients, content) VALUES (?, ?, ?)", [row[1:] for row in rows]
    )
    connection.executemany("DELETE FROM queue WHERE id = ?", [row[:1] for row in rows])


def role(*argv: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, __file__, *argv])


def with_client_cpu(load: Callable[[], dict]) -> Callable[[], dict]:
    """`load` with the CPU a mail of smtp-source (the only child reaped during the load: the servers run
    on) and of this process (the timing client and the polling)."""

    def measured() -> dict:
        before = (resource.getrusage(resource.RUSAGE_CHILDREN), resource.getrusage(resource.RUSAGE_SELF))
        figures = load()
        after = (resource.getrusage(resource.RUSAGE_CHILDREN), resource.getrusage(resource.RUSAGE_SELF))
        for name, start, end in zip(("smtp_source", "client"), before, after, strict=True):
            spent = end.ru_utime + end.ru_stime - start.ru_utime - start.ru_stime
            figures[f"{name}_cpu_ms_per_mail"] = round(spent * 1000 / figures["mails"], 3)
        return figures

    return measured


def bench_floor(args: argparse.Namespace, processes: int, database: Path | None) -> dict:
    """The load into `processes` floor servers sharing a port: discard ones without `database`, durable
    ones and the delivery process on it with."""
    port = free_port()
    servers: list[subprocess.Popen] = []
    groups = {"server": servers}
    reader = None
    if database is not None:
        create_database(database)
        reader = sqlite3.connect(database)
        groups["delivery"] = [role("--serve", "deliver", "--database", str(database))]
    try:
        database_argv = [] if database is None else ["--database", str(database)]
        servers += [role("--serve", "smtp", "--port", str(port), *database_argv) for _ in range(processes)]
        wait_for_listeners(port, processes)

        def delivered() -> int:
            if reader is None:  # nothing is kept: the accept is the end
                return sys.maxsize
            return reader.execute("SELECT count(*) FROM mailbox").fetchone()[0]

        return cpu_per_mail(with_client_cpu(lambda: run_load(port, args, delivered, 0)), groups)
    finally:
        for group in groups.values():
            for process in group:
                stop(process)
        if reader is not None:
            reader.close()


def total_cpu(figures: dict) -> float:
    return sum(value for name, value in figures.items() if name.endswith("_cpu_ms_per_mail"))


def summary(result: dict) -> dict:
    """Each measure's ratio over Postfix's end-to-end rate, its CPU a mail in all and its CPU ceiling."""
    postfix = result["postfix"]["end_to_end_per_s"]
    measures = {name: figures for name, figures in result.items() if name != "postfix"}
    return {
        "budget_ms_per_mail_for_2x": round(CORES * 1000 / (2 * postfix), 3),
        "end_to_end_over_postfix": {
            name: round(figures["end_to_end_per_s"] / postfix, 2) for name, figures in measures.items()
        },
        "accepted_over_postfix": {
            name: round(figures["accepted_per_s"] / postfix, 2) for name, figures in measures.items()
        },
        "cpu_ms_per_mail": {name: round(total_cpu(figures), 3) for name, figures in measures.items()},
        "cpu_ceiling_per_s": {
            name: round(CORES * 1000 / total_cpu(figures), 1) for name, figures in measures.items()
        },
    }


def bench_mailq_measures(args: argparse.Namespace, result: dict) -> None:
    """mailq's two measures into `result`, each with smtp-source's CPU from the durable floor's measure of
    as many processes (the same load, hence the same work for the load generator)."""
    with fresh_deployment("smtpfloor", None) as deployment:
        figures = bench_mailq(deployment.url, args)
    for measure in ("1 process", "2 processes"):
        floor = result[f"durable, {measure}"]
        mailq = {**figures[measure], "smtp_source_cpu_ms_per_mail": floor["smtp_source_cpu_ms_per_mail"]}
        result[f"mailq, {measure}"] = mailq
        print(f"mailq, {measure}: {json.dumps(mailq)}", flush=True)


def run(args: argparse.Namespace) -> None:
    result = {"postfix": bench_postfix(args)}
    print(f"postfix: {json.dumps(result['postfix'])}", flush=True)
    directory = Path(tempfile.mkdtemp(prefix=".bench-smtpfloor-", dir=REPOSITORY))
    try:
        for kind in ("discard", "durable"):
            for processes, measure in ((1, "1 process"), (2, "2 processes")):
                database = None if kind == "discard" else directory / f"floor-{processes}.sqlite"
                result[f"{kind}, {measure}"] = bench_floor(args, processes, database)
                print(f"{kind}, {measure}: {json.dumps(result[f'{kind}, {measure}'])}", flush=True)
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    if not args.no_mailq:
        bench_mailq_measures(args, result)
    result["summary"] = summary(result)
    budget = result["summary"]["budget_ms_per_mail_for_2x"]
    print(f"2x Postfix leaves {budget} ms of CPU a mail on {CORES} cores")
    for name, ratio in result["summary"]["end_to_end_over_postfix"].items():
        ceiling = result["summary"]["cpu_ceiling_per_s"][name]
        print(f"end to end, {name}, over Postfix: {ratio}x (CPU ceiling {ceiling} mails/s)")
    print(json.dumps(result))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mails", type=int, default=3000)
    parser.add_argument("--sessions", type=int, default=20)
    parser.add_argument("--size", type=int, default=10240)
    parser.add_argument("--no-mailq", action="store_true", help="measure Postfix and the floors only")
    parser.add_argument("--serve", choices=("smtp", "deliver"), help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--database", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve == "smtp":
        uvloop.run(serve(args.port, args.database))
    elif args.serve == "deliver":
        deliver(args.database)
    else:
        # bench_mailq's: one `mailq smtp`, then two sharing the port; its worker's deliveries at a time.
        run(argparse.Namespace(**vars(args), processes=2, worker_threads=4))


if __name__ == "__main__":
    main()
