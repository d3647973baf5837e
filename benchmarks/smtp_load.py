"""The load of the SMTP measures (smtp_end_to_end.py, relay.py): `mailq` processes on a deployment,
`smtp-source` (Postfix's load generator) beside one smtplib client timing each end-of-DATA reply, and
the ports the servers listen on.

Not a benchmark itself; imported by the scripts of this directory.
"""

from __future__ import annotations

import argparse
import os
import smtplib
import socket
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

REPOSITORY = Path(__file__).resolve().parents[1]
USER, DOMAIN, SENDER = "alice@example.org", "example.org", "bench@sender.example"
HELD_SESSIONS = 200


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def mailq(url: str, *argv: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "mailq_cli", "--url", url, *argv],
        cwd=REPOSITORY,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env={**os.environ, "PYTHONPATH": str(REPOSITORY)},
    )


def stop(process: subprocess.Popen) -> None:
    process.terminate()
    process.wait(120)


class LatencyProbe:
    """One smtplib session sending mails to `recipient` one after the other while the load runs, timing
    each reply to the end of DATA."""

    def __init__(self, port: int, size: int, recipient: str) -> None:
        self.port = port
        self.recipient = recipient
        self.message = b"Subject: probe\r\n\r\n" + (b"p" * 78 + b"\r\n") * (size // 80)
        self.latencies: list[float] = []
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        with smtplib.SMTP("127.0.0.1", self.port, timeout=120) as smtp:
            smtp.ehlo("probe.example")
            while not self.done.is_set():
                smtp.mail(SENDER)
                smtp.rcpt(self.recipient)
                started = time.perf_counter()
                code, _ = smtp.data(self.message)
                if code == 250:
                    self.latencies.append(time.perf_counter() - started)

    @contextmanager
    def running(self) -> Iterator[LatencyProbe]:
        self.thread.start()
        try:
            yield self
        finally:
            self.done.set()
            self.thread.join(120)

    def percentiles(self) -> dict[str, float]:
        cuts = statistics.quantiles(self.latencies, n=100) if len(self.latencies) > 1 else [0.0] * 99
        return {"p50_ms": round(cuts[49] * 1000, 2), "p99_ms": round(cuts[98] * 1000, 2)}


def run_load(
    port: int, args: argparse.Namespace, delivered: Callable[[], int], before: int, recipient: str = USER
) -> dict:
    """smtp-source's load and the latency probe on `port`, to `recipient`; returns the rates once every
    mail is delivered."""
    probe = LatencyProbe(port, args.size, recipient)
    started = time.perf_counter()
    with probe.running():
        subprocess.run(
            ["smtp-source", "-s", str(args.sessions), "-m", str(args.mails), "-l", str(args.size)]
            + ["-f", SENDER, "-t", recipient, f"127.0.0.1:{port}"],
            check=True,
        )
    accepted_at = time.perf_counter()
    expected = before + args.mails + len(probe.latencies)
    while delivered() < expected:
        time.sleep(0.05)
    ended = time.perf_counter()
    total = args.mails + len(probe.latencies)
    return {
        "mails": total,
        "accepted_per_s": round(total / (accepted_at - started), 1),
        "end_to_end_per_s": round(total / (ended - started), 1),
        **probe.percentiles(),
    }


def start_servers(url: str, port: int, processes: int) -> list[subprocess.Popen]:
    """`processes` `mailq smtp` sharing `port` (SO_REUSEPORT: the kernel spreads the connections), each
    room for the held sessions."""
    command = ["smtp", "--listen", f"127.0.0.1:{port}", "--domain", DOMAIN, "--reuse-port"]
    return [mailq(url, *command, "--max-sessions", str(HELD_SESSIONS + 10)) for _ in range(processes)]


def wait_for_listeners(port: int, count: int, seconds: float = 60) -> None:
    """Until `count` sockets listen on `port` (the kernel's table: a connection reaches only one)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        lines = Path("/proc/net/tcp").read_text().splitlines()[1:]
        fields = (line.split() for line in lines)
        if sum(1 for f in fields if f[1].endswith(f":{port:04X}") and f[3] == "0A") >= count:
            return
        time.sleep(0.1)
    raise RuntimeError(f"fewer than {count} processes listen on 127.0.0.1:{port}")


def replace_mails(args: argparse.Namespace, mails: int) -> argparse.Namespace:
    return argparse.Namespace(**{**vars(args), "mails": mails})
