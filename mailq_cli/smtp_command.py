"""`mailq smtp`: the ESMTP server of mailq_runtime/smtp on a queue of the store, until SIGTERM or Ctrl-C.
The server's modules (and aiosmtpd) are imported once the command runs, so the other commands start
without them."""

from __future__ import annotations

import argparse
import asyncio
import signal
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mailq_runtime.errors import InvalidInput
from mailq_runtime.model import QueueName, normalise_domains, parse_duration
from mailq_runtime.runtime import Runtime
from mailq_runtime.smtp.defaults import COMMAND_TIMEOUT, DEFAULT_NETWORKS

from .arguments import checked_argument, count_argument, parse_listen
from .log_lines import logging_to_stderr
from .metrics_serving import add_metrics_argument, serving_metrics
from .output import Report

if TYPE_CHECKING:
    from mailq_runtime.smtp.server import ServerOptions, SmtpServer


def _options(args: argparse.Namespace) -> ServerOptions:
    """The server's options, every one checked before the store is opened."""
    from mailq_runtime.smtp.access import load_credentials, parse_networks, tls_context
    from mailq_runtime.smtp.handler import Policy
    from mailq_runtime.smtp.server import ServerOptions, default_hostname

    if (args.tls_cert is None) != (args.tls_key is None):
        raise InvalidInput("--tls-cert and --tls-key go together")
    tls = None if args.tls_cert is None else tls_context(args.tls_cert, args.tls_key)
    credentials = load_credentials(args.auth_file)
    if credentials and tls is None:
        raise InvalidInput(
            "AUTH is only offered over TLS: give --tls-cert and --tls-key with the credentials"
        )
    policy = Policy(
        hostname=args.hostname or default_hostname(),
        local_domains=normalise_domains(args.domain),
        networks=parse_networks(args.networks or DEFAULT_NETWORKS),
        max_recipients=args.max_recipients,
    )
    return ServerOptions(
        policy=policy,
        queue=args.queue,
        tls=tls,
        credentials=credentials,
        max_sessions=args.max_sessions,
        timeout=args.timeout,
        drain=args.drain,
        reuse_port=args.reuse_port,
    )


async def _serve(server: SmtpServer, address: tuple[str, int]) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    # SIGTERM and Ctrl-C stop accepting; the sessions in DATA finish, then the command returns.
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    await server.serve(address, stop, lambda bound: None)


def _smtp(args: argparse.Namespace) -> Report:
    from mailq_runtime.smtp.server import SmtpServer, run

    address = parse_listen(args.listen)
    options = _options(args)
    # The store must exist: a mistyped URL never starts an empty one. The queue is made by its first mail.
    with Runtime.open(args.url) as runtime, serving_metrics(args.metrics, runtime):
        server = SmtpServer(runtime, options)
        with logging_to_stderr("mailq_runtime.smtp", "smtpd"):
            run(_serve(server, address))
    data = {"queue": args.queue, "sessions": server.sessions_served, "accepted": server.handler.accepted}
    return Report(
        data,
        [f"smtp stopped: {data['sessions']} sessions, {data['accepted']} mails accepted into {args.queue}"],
    )


def _seconds(name: str) -> Any:
    return checked_argument(lambda text: parse_duration(text, name) / 1_000_000)


def add_smtp_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("smtp", help="accept mail by SMTP into a queue (250 once it is enqueued)")
    parser.add_argument(
        "--listen", default="127.0.0.1:2525", metavar="HOST:PORT", help="default 127.0.0.1:2525"
    )
    parser.add_argument(
        "--domain",
        action="append",
        required=True,
        metavar="DOMAIN",
        help="a local domain; repeat it for more",
    )
    parser.add_argument("--queue", default="spool", type=checked_argument(QueueName), help="default spool")
    parser.add_argument(
        "--networks",
        action="append",
        metavar="CIDR",
        help=f"clients that may relay to other domains; repeat it, it replaces the default "
        f"({' '.join(DEFAULT_NETWORKS)})",
    )
    parser.add_argument(
        "--hostname", help="the server's name in replies and Received headers (default: FQDN)"
    )
    parser.add_argument("--tls-cert", type=Path, metavar="FILE", help="PEM certificate for STARTTLS")
    parser.add_argument("--tls-key", type=Path, metavar="FILE", help="PEM key for STARTTLS")
    parser.add_argument(
        "--auth-file",
        type=Path,
        metavar="FILE",
        help="user:password lines for AUTH PLAIN/LOGIN over TLS (default: $MAILQ_SMTP_AUTH)",
    )
    parser.add_argument(
        "--max-sessions",
        type=count_argument("max_sessions"),
        default=100,
        metavar="N",
        help="concurrent sessions; more get 421 4.7.0 (default 100)",
    )
    parser.add_argument(
        "--max-recipients",
        type=count_argument("max_recipients"),
        default=1000,
        metavar="N",
        help="recipients of one mail; more get 452 4.5.3 (default 1000, as Postfix)",
    )
    parser.add_argument(
        "--timeout",
        type=_seconds("timeout"),
        default=COMMAND_TIMEOUT,
        metavar="DURATION",
        help="how long a client may stay silent (default 5m, RFC 5321 4.5.3.2)",
    )
    parser.add_argument(
        "--drain",
        type=_seconds("drain"),
        default=30.0,
        metavar="DURATION",
        help="at SIGTERM, how long sessions in DATA may take to finish (default 30s)",
    )
    parser.add_argument(
        "--reuse-port", action="store_true", help="share the port with other processes (SO_REUSEPORT)"
    )
    add_metrics_argument(parser)
    parser.set_defaults(handler=_smtp)
