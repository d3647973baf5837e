"""`mailq worker`: deliver a queue's mails to the local recipients' INBOXes until stopped or idle."""

from __future__ import annotations

import argparse
import signal
import threading
from dataclasses import asdict

from mailq_runtime.runtime import Runtime
from mailq_runtime.worker import run_worker

from .arguments import count_argument, duration_argument
from .metrics_serving import add_metrics_argument, serving_metrics
from .output import Report


def _worker(args: argparse.Namespace) -> Report:
    stop = threading.Event()
    # SIGTERM and Ctrl-C ask for a graceful stop: the mail in hand is finished, then the worker returns.
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    # A worker serves a queue that exists: checked on a runtime that writes nothing, so that a mistyped
    # URL or queue name creates nothing; then opened as a creating command, registering the URL's
    # configuration as James's queue does at start-up.
    with Runtime.open(args.url) as existing:
        existing.queue(args.queue, create=False)
    with Runtime.open(args.url, create=True) as runtime, serving_metrics(args.metrics, runtime):
        stats = run_worker(
            runtime,
            args.queue,
            local_domains=args.domain,
            stop=stop,
            idle_timeout=args.idle_exit,
            retry_delay=args.retry_delay,
            max_attempts=args.max_attempts,
        )
    data = asdict(stats)
    return Report(
        data, [f"{args.queue}: " + ", ".join(f"{k.replace('_', ' ')} {v}" for k, v in data.items())]
    )


def add_worker_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("worker", help="deliver a queue's mails to the local recipients' INBOXes")
    parser.add_argument("--queue", default="spool", help="the queue to serve (default: spool)")
    parser.add_argument(
        "--domain",
        action="append",
        required=True,
        metavar="DOMAIN",
        help="a local domain; repeat it for more (other recipients are dead-lettered)",
    )
    parser.add_argument(
        "--idle-exit",
        type=duration_argument("idle_exit"),
        metavar="DURATION",
        help="return once the queue stayed empty this long, e.g. 30s (default: serve until stopped)",
    )
    parser.add_argument(
        "--retry-delay",
        default="5m",
        type=duration_argument("retry_delay"),
        metavar="DURATION",
        help="delay before a retry",
    )
    parser.add_argument(
        "--max-attempts", type=count_argument("max_attempts"), default=5, metavar="N", help="then dead-letter"
    )
    add_metrics_argument(parser)
    parser.set_defaults(handler=_worker)
