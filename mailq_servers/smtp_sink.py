"""Postfix's smtp-sink on a loopback port, as the remote MX of remote delivery's tests: it takes mail
and writes each transaction to a file, or answers chosen commands with 4xx or 5xx, or waits before
answering DATA (`man smtp-sink`: -r, -f, -w, -d).

Started per test by the fixtures that need it (tests/relay/conftest.py), as the DNS server."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from email.parser import BytesHeaderParser
from pathlib import Path

from .base import LOOPBACK, Place, port_answers, wait_for
from .system_packages import system_program


@dataclass(frozen=True)
class Dumped:
    """The envelope of one transaction the sink took, as the client wrote MAIL and RCPT's arguments."""

    sender: str
    recipients: tuple[str, ...]


class SmtpSink:
    """smtp-sink on `host`:`port` (a loopback address); `soft` and `hard` are commands answered 4xx and
    5xx (e.g. "RCPT"), `data_wait` the seconds it waits before answering DATA; without `pipelining` it
    does not announce PIPELINING, so a client sends one command at a time. A context manager;
    `dumped()` reads what it took so far."""

    def __init__(
        self,
        port: int,
        *,
        host: str | None = None,
        place: Place = LOOPBACK,
        soft: Sequence[str] = (),
        hard: Sequence[str] = (),
        data_wait: int = 0,
        pipelining: bool = True,
    ) -> None:
        # On this machine's loopback, or on a host of the bed (its address unless `host` says another).
        self.host = host or place.address
        self.place = place
        self.port = port
        self.options: list[str] = []
        if soft:
            self.options += ["-r", ",".join(soft)]
        if hard:
            self.options += ["-f", ",".join(hard)]
        if data_wait:
            self.options += ["-w", str(data_wait)]
        if not pipelining:
            self.options.append("-p")
        self.directory: Path | None = None
        self._taken: list[Dumped] = []  # what a stopped sink took
        self._process: subprocess.Popen | None = None

    def __enter__(self) -> SmtpSink:
        program = system_program("smtp-sink")
        # Out of the caller's private temporary directories: as root, smtp-sink writes as `nobody`.
        self.directory = Path(tempfile.mkdtemp(prefix="mailq-smtp-sink-"))
        dump, log = self.directory / "dump", self.directory / "smtp-sink.log"
        dump.mkdir()
        argv = [program, "-d", f"{dump}/%Y%m%d%H%M%S.", *self.options]
        if os.geteuid() == 0:
            self.directory.chmod(0o755)
            dump.chmod(0o777)
            argv += ["-u", "nobody"]
        with log.open("ab") as out:
            self._process = subprocess.Popen(
                self.place.command([*argv, f"{self.host}:{self.port}", "64"]),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=out,
            )
        process = self._process
        wait_for(
            "smtp-sink",
            lambda: port_answers(self.port, self.host),
            alive=lambda: process.poll() is None,
            logs=[log],
            timeout=20,
        )
        return self

    def __exit__(self, *exception: object) -> None:
        if self._process is not None:
            self._process.terminate()
            self._process.wait(10)
            self._process = None
        if self.directory is not None:
            self._taken = self.dumped()
            shutil.rmtree(self.directory, ignore_errors=True)
            self.directory = None

    def dumped(self) -> list[Dumped]:
        """The transactions taken so far, oldest first (a transaction still being written may be
        partial); once the sink stopped, those it took."""
        if self.directory is None:
            return list(self._taken)
        files = sorted((self.directory / "dump").iterdir(), key=lambda path: path.stat().st_mtime)
        return [_read(path) for path in files]


def _read(path: Path) -> Dumped:
    headers = BytesHeaderParser().parsebytes(path.read_bytes())
    return Dumped(headers.get("X-Mail-Args", ""), tuple(headers.get_all("X-Rcpt-Args", [])))
