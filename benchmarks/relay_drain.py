"""A destination back from an outage, drained within its limits: N mails queued
for one destination while it is down (nothing listens on its port: each attempt is deferred on the
retry schedule), then it comes back; the time until the queue is empty, with the connections and the
rate measured at the destination.

    .venv/bin/python benchmarks/relay_drain.py [--url URL] [--mails N] [--rate R] [--concurrency C]
                                               [--processes P] [--threads T] [--timeout SECONDS]

`--processes` `mailq worker --relay` processes of `--threads` threads each serve a fresh embedded data dir
next to the repository (or the deployment --url names, which must not exist yet), with a transport entry
to the destination, `--destination-concurrency C --destination-rate R/s`, and the retry schedule shrunk
to `--retry-first` 30 s doubling up to `--retry-longest` 60 s (any shorter, the workers spend the outage
retrying the first mails deferred: the embedded broker serves the oldest mails first, due retries
included). The destination is
an SMTP sink on loopback (mailq_servers.counting_sink) that counts the sessions open at once and when
each mail arrived. The outage lasts until every mail has been tried and deferred once; then the sink
starts, and the clock runs until the queue is empty. Fails (exit 1) if the sink saw more sessions than
C or more than R mails in one second (+1: a mail sent at a window's very end arrives in the next).
Prints one line per phase, then one JSON object as the last line.
"""

from __future__ import annotations

import argparse
import json
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

REPOSITORY = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPOSITORY))

from deployments import fresh_deployment  # noqa: E402
from quick import parse_args  # noqa: E402
from smtp_load import free_port  # noqa: E402

from mailq_runtime import Runtime  # noqa: E402
from mailq_runtime.model import Mail  # noqa: E402
from mailq_servers.counting_sink import counting_sink  # noqa: E402

DOMAIN, QUEUE = "drain.test", "spool"
MESSAGE = b"From: bench@example.org\r\nSubject: drain\r\n\r\n" + (b"x" * 98 + b"\r\n") * 10


def wait_for(condition: Callable[[], bool], timeout: float, what: str) -> float:
    """Seconds until `condition` held; SystemExit past `timeout` (the run is bounded)."""
    started = time.monotonic()
    while not condition():
        if time.monotonic() - started > timeout:
            raise SystemExit(f"relay_drain: {what} did not happen within {timeout:.0f} s")
        time.sleep(0.25)
    return time.monotonic() - started


def deferred(runtime: Runtime) -> int:
    """The destination's mails waiting for a retry, from the by-domain counters."""
    shapes = [shape for shape in runtime.queue(QUEUE).overviews.by_domain() if shape.domain == DOMAIN]
    return shapes[0].total("deferred") if shapes else 0


def workers(url: str, args: argparse.Namespace, port: int, log: Path) -> list[subprocess.Popen]:
    command = [sys.executable, "-m", "mailq_cli", "--url", url, "--json", "worker", "--queue", QUEUE]
    command += ["--domain", "example.org", "--relay", "--transport", f"{DOMAIN}=127.0.0.1:{port}"]
    command += ["--retry-first", args.retry_first, "--retry-longest", args.retry_longest]
    command += ["--hostname", "bench.example.org"]
    command += ["--threads", str(args.threads), "--destination-concurrency", str(args.concurrency)]
    command += ["--destination-rate", f"{args.rate}/s"]
    with log.open("ab") as out:
        return [
            subprocess.Popen(command, stdout=subprocess.PIPE, stderr=out, cwd=REPOSITORY)
            for _ in range(args.processes)
        ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", help="a deployment that does not exist yet (default: a fresh embedded one)")
    parser.add_argument("--mails", type=int, default=10_000)
    parser.add_argument("--rate", type=int, default=100, help="the destination's mails a second")
    parser.add_argument("--concurrency", type=int, default=4, help="the destination's connections")
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--threads", type=int, default=4)
    parser.add_argument("--timeout", type=float, default=900, help="bound of each phase, in seconds")
    parser.add_argument("--retry-first", default="30s", help="the workers' first retry")
    parser.add_argument("--retry-longest", default="60s", help="the workers' longest retry")
    quick = {"mails": 40, "processes": 1, "threads": 2, "retry_first": "2s", "retry_longest": "4s"}
    args = parse_args(parser, {**quick, "timeout": 120})
    port = free_port()
    with fresh_deployment("relay-drain", args.url) as deployment:
        url = deployment.url
        log = Path(tempfile.mkstemp(prefix="relay-drain-", suffix=".log")[1])
        print(f"workers' log: {log}", flush=True)
        with Runtime.open(url, create=True) as runtime:
            started = time.monotonic()
            queue = runtime.queue(QUEUE)
            for n in range(args.mails):
                queue.enqueue(Mail((f"user{n}@{DOMAIN}",), MESSAGE, sender="bench@example.org"))
            print(f"queued {args.mails} mails in {time.monotonic() - started:.1f} s", flush=True)
            running = workers(url, args, port, log)
            try:
                outage = wait_for(
                    lambda: deferred(runtime) >= args.mails, args.timeout, "every mail deferred"
                )
                print(f"destination down: every mail deferred once after {outage:.1f} s", flush=True)
                with counting_sink(port) as sink:
                    drain = wait_for(lambda: queue.size() == 0, args.timeout, "the drain")
                    arrivals = sink.arrivals
                print(f"destination up: drained in {drain:.1f} s", flush=True)
            finally:
                for worker in running:
                    worker.send_signal(signal.SIGTERM)
                stats = [json.loads(worker.communicate(timeout=60)[0] or "{}") for worker in running]
    received = len(arrivals)
    span = arrivals[-1] - arrivals[0] if received > 1 else 0.0
    result = {
        "mails": args.mails,
        "drain_seconds": round(drain, 2),
        "outage_seconds": round(outage, 2),
        "limit_connections": args.concurrency,
        "limit_rate_per_second": args.rate,
        "most_connections_seen": sink.most_sessions,
        "most_mails_in_a_second": sink.most_in_a_second(),
        "rate_at_sink_per_second": round((received - 1) / span, 1) if span else None,
        "received": received,
        "throttled": sum(s.get("throttled", 0) for s in stats),
        "retried": sum(s.get("retried", 0) for s in stats),
        "within_limits": sink.most_sessions <= args.concurrency and sink.most_in_a_second() <= args.rate + 1,
    }
    print(json.dumps(result))
    if not result["within_limits"] or received < args.mails:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
