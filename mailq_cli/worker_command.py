"""`mailq worker`: deliver a queue's mails to the local recipients' INBOXes until stopped or idle, and
with `--relay`, the other recipients' by SMTP (remote delivery, `mailq_runtime.relay`)."""

from __future__ import annotations

import argparse
import signal
import socket
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import closing
from dataclasses import asdict

from mailq_runtime.errors import InvalidInput
from mailq_runtime.relay import RemoteDelivery, RetrySchedule, Router
from mailq_runtime.relay.limits import (
    DEFAULT_CONCURRENCY,
    DestinationLimits,
    Limiter,
    Rate,
    parse_concurrency,
)
from mailq_runtime.runtime import Runtime
from mailq_runtime.worker import WorkerStats, run_worker

from .arguments import checked_argument, count_argument, duration_argument
from .log_lines import logging_to_stderr
from .metrics_serving import add_metrics_argument, serving_metrics
from .output import Report


def _transport_entry(text: str) -> tuple[str, str]:
    domain, separator, target = text.partition("=")
    if not separator:
        raise InvalidInput(f"invalid transport entry {text!r}: DOMAIN=HOST:PORT")
    return domain, target


def _checked(check: Callable[[str], object]) -> Callable[[str], str]:
    """Checks a limit while parsing and keeps its text, which the API reads the same way."""

    def keep(text: str) -> str:
        check(text)
        return text

    return checked_argument(keep)


def _domain_entry(kind: str, check: Callable[[str], object]) -> Callable[[str], tuple[str, str]]:
    """DOMAIN=VALUE, the value checked as `check` reads it."""

    def parse(text: str) -> tuple[str, str]:
        domain, separator, value = text.partition("=")
        if not separator:
            raise InvalidInput(f"invalid {kind} entry {text!r}: DOMAIN={kind.upper()}")
        check(value)
        return domain, value

    return checked_argument(parse)


def _limits(args: argparse.Namespace) -> DestinationLimits:
    domains: dict[str, dict[str, str]] = {}
    for domain, value in args.domain_concurrency or ():
        domains.setdefault(domain, {})["concurrency"] = value
    for domain, value in args.domain_rate or ():
        domains.setdefault(domain, {})["rate"] = value
    return DestinationLimits.of(args.destination_concurrency, args.destination_rate, domains)


def _relay(args: argparse.Namespace) -> Callable[[Runtime, Limiter], RemoteDelivery] | None:
    """Remote delivery on a runtime and its process's limiter, its options checked before any runtime
    opens."""
    if not args.relay:
        return None
    router = Router(dict(args.transport or ()), args.resolver, args.mx_port)
    schedule = RetrySchedule.of(args.retry_first, args.retry_longest, args.max_age)
    queue, hostname = args.queue, args.hostname
    return lambda runtime, limiter: RemoteDelivery(
        runtime.queue(queue), router, schedule, hostname, runtime.clock, limiter
    )


def _worker(args: argparse.Namespace) -> Report:
    args.hostname = args.hostname or socket.getfqdn()
    relay = _relay(args)
    limits = _limits(args)
    stop = threading.Event()
    # SIGTERM and Ctrl-C ask for a graceful stop: the mail in hand is finished, then the worker returns.
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    # A worker serves a queue that exists: checked on a runtime that writes nothing, so that a mistyped
    # URL or queue name creates nothing; then opened as a creating command, registering the URL's
    # configuration as James's queue does at start-up.
    with Runtime.open(args.url) as existing:
        existing.queue(args.queue, create=False)
    # Every line of the runtime's, not only the worker's: the queue's notes on a broker away and remote
    # delivery's lines are the operator's too.
    with (
        Runtime.open(args.url, create=True) as runtime,
        logging_to_stderr("mailq_runtime", "worker"),
        serving_metrics(args.metrics, runtime),
        closing(Limiter(runtime.queue_backends.destinations, limits, runtime.clock)) as limiter,
    ):

        def serve() -> WorkerStats:
            # One per thread, its sessions the thread's own; the limiter is the process's.
            remote = None if relay is None else relay(runtime, limiter)
            try:
                return run_worker(
                    runtime,
                    args.queue,
                    local_domains=args.domain,
                    stop=stop,
                    idle_timeout=args.idle_exit,
                    retry_delay=args.retry_delay,
                    max_attempts=args.max_attempts,
                    relay=remote,
                    hostname=args.hostname,
                )
            except BaseException:
                stop.set()  # the others finish their mail in hand and return: the command fails whole
                raise
            finally:
                if remote is not None:
                    remote.close()

        if args.threads == 1:
            stats = serve()
        else:
            with ThreadPoolExecutor(args.threads, thread_name_prefix="worker") as pool:
                served = [pool.submit(serve) for _ in range(args.threads)]
            stats = WorkerStats.total([each.result() for each in served])
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
        help="a local domain; repeat it for more (its addresses without a mailbox are bounced, other "
        "domains' recipients dead-lettered)",
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
    parser.add_argument(
        "--hostname",
        help="this host's name in the notifications of bounces and in remote delivery's EHLO (default: FQDN)",
    )
    relay = parser.add_argument_group("remote delivery")
    relay.add_argument(
        "--relay", action="store_true", help="deliver the other domains' recipients by SMTP (MX look-up)"
    )
    relay.add_argument(
        "--transport",
        action="append",
        type=checked_argument(_transport_entry),
        metavar="DOMAIN=HOST:PORT",
        help="send a domain's mail to this host rather than its MX, as Postfix's transport_maps; repeat it",
    )
    relay.add_argument("--resolver", metavar="HOST:PORT", help="the DNS server to ask (default: the system)")
    relay.add_argument(
        "--mx-port", type=int, default=25, metavar="PORT", help="the mail exchangers' port (default: 25)"
    )
    relay.add_argument(
        "--retry-first",
        default="300s",
        type=duration_argument("retry_first"),
        metavar="DURATION",
        help="the first delay after a passing failure, doubling with the mail's age (default: 300s)",
    )
    relay.add_argument(
        "--retry-longest",
        default="4000s",
        type=duration_argument("retry_longest"),
        metavar="DURATION",
        help="the longest delay between attempts (default: 4000s)",
    )
    relay.add_argument(
        "--max-age",
        default="5d",
        type=duration_argument("max_age"),
        metavar="DURATION",
        help="then a deferred mail is returned to its sender (default: 5d)",
    )
    relay.add_argument(
        "--destination-concurrency",
        default=DEFAULT_CONCURRENCY,
        type=_checked(parse_concurrency),
        metavar="N",
        help="connections open at a time per destination, across every worker of the deployment "
        f"(default: {DEFAULT_CONCURRENCY}, as Postfix; 0: no limit)",
    )
    relay.add_argument(
        "--destination-rate",
        type=_checked(Rate.parse),
        metavar="RATE",
        help="mails per destination and second (N or N/s), minute (N/m) or hour (N/h), across every "
        "worker of the deployment (default: no limit)",
    )
    relay.add_argument(
        "--domain-concurrency",
        action="append",
        type=_domain_entry("concurrency", parse_concurrency),
        metavar="DOMAIN=N",
        help="a domain's own --destination-concurrency; repeat it",
    )
    relay.add_argument(
        "--domain-rate",
        action="append",
        type=_domain_entry("rate", Rate.parse),
        metavar="DOMAIN=RATE",
        help="a domain's own --destination-rate; repeat it",
    )
    parser.add_argument(
        "--threads",
        type=count_argument("threads"),
        default=1,
        metavar="N",
        help="deliver N mails at a time (default: 1, in queue order); their commits are shared on the "
        "embedded store",
    )
    add_metrics_argument(parser)
    parser.set_defaults(handler=_worker)
