"""Mail in by SMTP and out into mailboxes, end to end: `mailq smtp` + `mailq worker` against a private
Postfix on loopback delivering to Maildir, with the same load in the same run.

    .venv/bin/python benchmarks/smtp_end_to_end.py [--url URL] [--mails N] [--url-mails N] [--sessions N]
                                                   [--size BYTES] [--processes N] [--no-postfix]

Postfix first, then mailq on a fresh embedded data dir next to the repository (same disk), at the store's
default durability; with --url, then also on that deployment (a distributed one: Cassandra + S3 + its
broker; --url-mails a measure), which must not exist yet and is removed at the end (deployments.py). Each
mailq deployment is measured twice in a row on one store and one `mailq worker`: one `mailq smtp`
process, then --processes of them (default: one per core) sharing the port with SO_REUSEPORT. Each measure is
`smtp-source -s SESSIONS -m MAILS -l SIZE` (Postfix's load generator) while one smtplib client sends mails
one after the other and times each end-of-DATA reply; the time runs from the first connection to the
last mail in a mailbox (mailq: the INBOX's counter; Postfix: the files of the Maildir's new/), with the
CPU per mail of mailq's `smtp` processes and of its worker. Also the RSS of one `mailq smtp` holding 200
concurrent sessions. Needs Postfix installed with debconf's "No
configuration" (no system daemon is set up: the run starts its own instance in a temporary directory
and stops it). Prints one line per measure, then one JSON object as the last line.
"""

from __future__ import annotations

import argparse
import json
import os
import smtplib
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

REPOSITORY = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPOSITORY))

from deployments import fresh_deployment  # noqa: E402
from process_cpu import TICK_SECONDS, ticks  # noqa: E402
from quick import parse_args  # noqa: E402
from smtp_load import (  # noqa: E402
    DOMAIN,
    HELD_SESSIONS,
    SENDER,
    USER,
    free_port,
    mailq,
    replace_mails,
    run_load,
    start_servers,
    stop,
    wait_for_listeners,
)

from mailq_runtime import Runtime  # noqa: E402
from mailq_servers.postfix import PrivatePostfix  # noqa: E402


def cpu_per_mail(load: Callable[[], dict], processes: dict[str, list[subprocess.Popen]]) -> dict:
    """`load`'s figures and the CPU (ms per mail, utime + stime) each group of `processes` spent in it:
    what bounds the rate on a machine of few cores."""
    before = {name: sum(ticks(process.pid) for process in group) for name, group in processes.items()}
    figures = load()
    for name, group in processes.items():
        spent = (sum(ticks(process.pid) for process in group) - before[name]) * TICK_SECONDS
        figures[f"{name}_cpu_ms_per_mail"] = round(spent * 1000 / figures["mails"], 3)
    return figures


def held_sessions_rss(pid: int, port: int) -> int:
    """The RSS (KiB) of the process `pid` while HELD_SESSIONS sessions are open on `port`, each greeted."""
    sockets = []
    try:
        for _ in range(HELD_SESSIONS):
            connection = socket.create_connection(("127.0.0.1", port), timeout=30)
            connection.recv(1024)
            connection.sendall(b"EHLO held.example\r\n")
            sockets.append(connection)
        for connection in sockets:
            connection.recv(4096)
        status = Path(f"/proc/{pid}/status").read_text()
        return int(next(line for line in status.splitlines() if line.startswith("VmRSS:")).split()[1])
    finally:
        for connection in sockets:
            connection.close()


def bench_mailq(url: str, args: argparse.Namespace) -> dict:
    """The load into one `mailq smtp` process, then into `args.processes` sharing the port, on one store
    and one `mailq worker`; the RSS of one process holding 200 sessions."""
    with Runtime.open(url, create=True) as runtime:
        runtime.mailboxes.create(USER, "INBOX")
    port = free_port()
    servers = start_servers(url, port, 1)
    worker = None
    try:
        wait_for_listeners(port, 1)
        with smtplib.SMTP("127.0.0.1", port) as smtp:  # the first mail creates the queue the worker serves
            smtp.sendmail(SENDER, [USER], b"Subject: first\r\n\r\nfirst\r\n")
        worker = mailq(url, "worker", "--domain", DOMAIN, "--threads", str(args.worker_threads))
        with Runtime.open(url) as runtime:
            inbox = runtime.mailboxes.get(USER, "INBOX")

            def delivered() -> int:
                return runtime.mailboxes.counters(inbox.id).count

            while delivered() < 1:
                time.sleep(0.05)
            processes = {"smtp": servers, "worker": [worker]}
            figures = {
                "1 process": cpu_per_mail(lambda: run_load(port, args, delivered, delivered()), processes)
            }
            figures["rss_kib_200_sessions"] = held_sessions_rss(servers[0].pid, port)
            # The others join the port: the first keeps serving, so none of the load misses a listener.
            servers += start_servers(url, port, args.processes - 1)
            wait_for_listeners(port, args.processes)
            processes["smtp"] = servers
            figures[f"{args.processes} processes"] = cpu_per_mail(
                lambda: run_load(port, args, delivered, delivered()), processes
            )
        return figures
    finally:
        for server in servers:
            stop(server)
        if worker is not None:
            stop(worker)


def bench_postfix(args: argparse.Namespace) -> dict:
    port = free_port()
    # Processes enough for every session, as mailq gets a thread per session.
    with PrivatePostfix(port, [USER], process_limit=args.sessions + 20) as postfix:
        new = postfix.maildir(USER)

        def delivered() -> int:
            return len(os.listdir(new)) if new.exists() else 0

        return run_load(port, args, delivered, 0)


def mailq_ratios(result: dict) -> dict[str, float]:
    """Each mailq measure's end-to-end rate over Postfix's."""
    postfix = result["postfix"]["end_to_end_per_s"]
    return {
        f"{deployment} {measure}": round(figures["end_to_end_per_s"] / postfix, 2)
        for deployment in ("embedded", "distributed")
        for measure, figures in result.get(deployment, {}).items()
        if isinstance(figures, dict)
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", help="a distributed deployment that does not exist yet, measured as well")
    parser.add_argument("--mails", type=int, default=5000)
    parser.add_argument(
        "--url-mails",
        type=int,
        default=300,
        help="mails of each measure on --url (a network round trip a call)",
    )
    parser.add_argument("--sessions", type=int, default=20)
    parser.add_argument("--size", type=int, default=10240)
    parser.add_argument(
        "--processes",
        type=int,
        default=os.cpu_count() or 2,
        help="mailq smtp processes sharing the port",
    )
    parser.add_argument(
        "--worker-threads",
        type=int,
        default=4,
        help="deliveries at a time in `mailq worker` (their commits shared on the embedded store)",
    )
    parser.add_argument("--no-postfix", action="store_true", help="measure mailq only")
    args = parse_args(parser, {"mails": 200, "url_mails": 30, "sessions": 5})
    result = {}
    if not args.no_postfix:
        result["postfix"] = bench_postfix(args)
        print(f"postfix: {json.dumps(result['postfix'])}", flush=True)
    with fresh_deployment("smtp", None) as deployment:
        result["embedded"] = bench_mailq(deployment.url, args)
    print(f"mailq, embedded: {json.dumps(result['embedded'])}", flush=True)
    if args.url is not None:
        with fresh_deployment("smtp", args.url) as deployment:
            result["distributed"] = bench_mailq(deployment.url, replace_mails(args, args.url_mails))
        print(f"mailq, {args.url.split(':')[0]}: {json.dumps(result['distributed'])}", flush=True)
    if not args.no_postfix:
        result["end_to_end_ratio"] = mailq_ratios(result)
        for measure, ratio in result["end_to_end_ratio"].items():
            print(f"end to end, mailq ({measure}) over Postfix: {ratio}x")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
