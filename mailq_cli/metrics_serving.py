"""`--metrics HOST:PORT` of the long-running commands (`mailq worker`, `mailq smtp`): Prometheus's text
format at http://HOST:PORT/metrics while the command runs, mailq_runtime/metrics.py's families and the
queue sizes of the command's runtime read at each scrape.

Off unless asked: a fixed default port would clash as soon as two workers run on one host (one per
queue is the usual set-up), and an address an operator did not choose should not open. The address is
the operator's: loopback for a Prometheus on the same host, another interface for a remote one."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterator
from contextlib import contextmanager

from prometheus_client import REGISTRY, start_http_server

from mailq_runtime.errors import InvalidInput
from mailq_runtime.metrics import QueueSizes
from mailq_runtime.runtime import Runtime

from .arguments import checked_argument, parse_listen


def add_metrics_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--metrics",
        type=checked_argument(parse_listen),
        metavar="HOST:PORT",
        help="serve Prometheus metrics at http://HOST:PORT/metrics, e.g. 127.0.0.1:9464 (default: none)",
    )


@contextmanager
def serving_metrics(address: tuple[str, int] | None, runtime: Runtime) -> Iterator[tuple[str, int] | None]:
    """Serve the metrics on `address` (port 0: any free one, said on stderr) while inside, giving the
    address bound; nothing when None."""
    if address is None:
        yield None
        return
    host, port = address
    try:
        server, thread = start_http_server(port, host)
    except OSError as error:
        raise InvalidInput(f"cannot serve metrics on {host}:{port}: {error.strerror or error}") from None
    sizes = QueueSizes(runtime)
    REGISTRY.register(sizes)
    bound_host, bound_port = server.server_address[:2]
    print(f"metrics at http://{bound_host}:{bound_port}/metrics", file=sys.stderr, flush=True)
    try:
        yield bound_host, bound_port
    finally:
        server.shutdown()
        server.server_close()
        thread.join()
        REGISTRY.unregister(sizes)
