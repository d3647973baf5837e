"""Mail in by SMTP and out by remote delivery: `mailq smtp` + `mailq worker --relay` against a private
Postfix relaying the same load, both to Postfix's smtp-sink on loopback, in the same run.

    .venv/bin/python benchmarks/relay.py [--url URL] [--mails N] [--url-mails N] [--sessions N]
                                         [--size BYTES] [--processes N] [--workers N]
                                         [--worker-threads N] [--no-postfix]

One smtp-sink takes every mail of the run (each transaction a file in its dump directory, which is what
is counted). Postfix first: its smtpd takes `smtp-source -s SESSIONS -m MAILS -l SIZE` (Postfix's load
generator) for a domain its transport table sends to the sink, at its default durability. Then mailq on
a fresh embedded data dir next to the repository (same disk), at the store's default durability: the
same load into --processes `mailq smtp` sharing the port (SO_REUSEPORT), delivered by --workers `mailq
worker --relay` processes of --worker-threads each, through a transport entry to the sink; with --url,
then also on that deployment (a distributed one, --url-mails a measure), which must not exist yet and is
removed at the end (deployments.py). Meanwhile one smtplib client sends mails one after the other and
times each end-of-DATA reply. The time runs from the first connection to the last mail the sink took:
"accepted" is the rate until smtp-source ended, "drained" until the sink had them all. Prints one line
per measure, then one JSON object as the last line.
"""

from __future__ import annotations

import argparse
import json
import os
import smtplib
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

REPOSITORY = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPOSITORY))

from deployments import fresh_deployment  # noqa: E402
from quick import parse_args  # noqa: E402
from smtp_load import (  # noqa: E402
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
from mailq_servers.smtp_sink import SmtpSink  # noqa: E402

RECIPIENT = "bob@relay.test"  # a domain that no one here hosts: relayed to the sink


def sink_count(sink: SmtpSink) -> int:
    """The transactions the sink took so far (a file each)."""
    assert sink.directory is not None
    return len(os.listdir(sink.directory / "dump"))


def drained(figures: dict) -> dict:
    """run_load's figures, its end-to-end rate named for what it is here: the sink had every mail."""
    return {key.replace("end_to_end", "drained"): value for key, value in figures.items()}


@contextmanager
def postfix_relay(args: argparse.Namespace, sink: SmtpSink) -> Iterator[tuple[int, PrivatePostfix]]:
    """A private Postfix relaying RECIPIENT's domain to `sink`, and the port its smtpd listens on."""
    port = free_port()
    # smtpd processes enough for every session, as `mailq smtp` gets a thread per session.
    transport = {"relay.test": (sink.host, sink.port)}
    with PrivatePostfix(port, [USER], process_limit=args.sessions + 20, transport=transport) as postfix:
        yield port, postfix


def bench_postfix(args: argparse.Namespace, sink: SmtpSink) -> dict:
    with postfix_relay(args, sink) as (port, _):
        return drained(run_load(port, args, lambda: sink_count(sink), sink_count(sink), RECIPIENT))


def start_workers(url: str, args: argparse.Namespace, sink: SmtpSink) -> list[subprocess.Popen]:
    command = ["worker", "--domain", USER.partition("@")[2], "--relay", "--hostname", "relay.example.org"]
    command += ["--transport", f"relay.test={sink.host}:{sink.port}", "--threads", str(args.worker_threads)]
    return [mailq(url, *command) for _ in range(args.workers)]


@contextmanager
def mailq_relay(
    url: str, args: argparse.Namespace, sink: SmtpSink
) -> Iterator[tuple[int, list[subprocess.Popen], list[subprocess.Popen]]]:
    """`args.processes` `mailq smtp` sharing a port and `args.workers` workers relaying to `sink`, once a
    first mail went through: the port, the servers and the workers."""
    Runtime.open(url, create=True).close()  # `mailq smtp` serves a store that exists
    port = free_port()
    servers = start_servers(url, port, args.processes)
    workers: list[subprocess.Popen] = []
    try:
        wait_for_listeners(port, args.processes)
        before = sink_count(sink)
        with smtplib.SMTP("127.0.0.1", port) as smtp:  # the first mail creates the queue the workers serve
            smtp.sendmail(SENDER, [RECIPIENT], b"Subject: first\r\n\r\nfirst\r\n")
        workers = start_workers(url, args, sink)
        while sink_count(sink) < before + 1:
            time.sleep(0.05)
        yield port, servers, workers
    finally:
        for process in servers + workers:
            stop(process)


def bench_mailq(url: str, args: argparse.Namespace, sink: SmtpSink) -> dict:
    """The load into `args.processes` `mailq smtp` sharing a port, relayed by `args.workers` workers."""
    with mailq_relay(url, args, sink) as (port, _, _):
        return drained(run_load(port, args, lambda: sink_count(sink), sink_count(sink), RECIPIENT))


def ratios(result: dict) -> dict[str, dict[str, float]]:
    """Each mailq deployment's rates over Postfix's."""
    postfix = result["postfix"]
    return {
        deployment: {
            rate: round(result[deployment][rate] / postfix[rate], 2)
            for rate in ("accepted_per_s", "drained_per_s")
        }
        for deployment in ("embedded", "distributed")
        if deployment in result
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", help="a distributed deployment that does not exist yet, measured as well")
    parser.add_argument("--mails", type=int, default=5000)
    parser.add_argument(
        "--url-mails", type=int, default=300, help="mails on --url (a network round trip a call)"
    )
    parser.add_argument("--sessions", type=int, default=20)
    parser.add_argument("--size", type=int, default=10240)
    parser.add_argument(
        "--processes", type=int, default=os.cpu_count() or 2, help="mailq smtp processes sharing the port"
    )
    parser.add_argument("--workers", type=int, default=1, help="`mailq worker --relay` processes")
    parser.add_argument(
        "--worker-threads", type=int, default=4, help="deliveries at a time in each worker (--threads)"
    )
    parser.add_argument("--no-postfix", action="store_true", help="measure mailq only")
    args = parse_args(parser, {"mails": 200, "url_mails": 30, "sessions": 5})
    result = {}
    with SmtpSink(free_port()) as sink:
        if not args.no_postfix:
            result["postfix"] = bench_postfix(args, sink)
            print(f"postfix: {json.dumps(result['postfix'])}", flush=True)
        with fresh_deployment("relay", None) as deployment:
            result["embedded"] = bench_mailq(deployment.url, args, sink)
        print(f"mailq, embedded: {json.dumps(result['embedded'])}", flush=True)
        if args.url is not None:
            with fresh_deployment("relay", args.url) as deployment:
                result["distributed"] = bench_mailq(deployment.url, replace_mails(args, args.url_mails), sink)
            print(f"mailq, {args.url.split(':')[0]}: {json.dumps(result['distributed'])}", flush=True)
    if not args.no_postfix:
        result["ratio"] = ratios(result)
        for deployment, each in result["ratio"].items():
            print(
                f"mailq ({deployment}) over Postfix: accepted {each['accepted_per_s']}x, drained "
                f"{each['drained_per_s']}x"
            )
    print(json.dumps(result))


if __name__ == "__main__":
    main()
