"""Clients for the SMTP tests: smtplib's, and a raw socket for what no well-behaved client sends."""

from __future__ import annotations

import io
import signal
import smtplib
import socket
import subprocess
import sys
import threading
from contextlib import redirect_stderr, redirect_stdout

SENDER = "bob@elsewhere.example"
MESSAGE = b"Subject: hello\r\nFrom: bob@elsewhere.example\r\n\r\nHi Alice.\r\n"


def client(port: int, source: str | None = None) -> smtplib.SMTP:
    """smtplib connected and greeted with EHLO; `source` the loopback address it connects from."""
    smtp = smtplib.SMTP(
        "127.0.0.1",
        port,
        local_hostname="client.example",
        timeout=30,
        source_address=(source, 0) if source else None,
    )
    smtp.ehlo()
    return smtp


class Raw:
    """A socket that speaks bytes as given, and reads the server's replies line by line."""

    def __init__(self, port: int, source: str = "127.0.0.1") -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=30, source_address=(source, 0))
        self.buffer = b""

    def reply(self) -> str:
        """The next whole reply (its last line); '' once the server closed the connection."""
        while True:
            while b"\r\n" in self.buffer:
                line, self.buffer = self.buffer.split(b"\r\n", 1)
                if line[3:4] != b"-":
                    return line.decode()
            chunk = self.sock.recv(65536)
            if not chunk:
                return ""
            self.buffer += chunk

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def command(self, line: bytes) -> str:
        self.send(line)
        return self.reply()

    def greeted(self) -> Raw:
        assert self.reply().startswith("220 ")
        assert self.command(b"EHLO client.example\r\n").startswith("250 ")
        return self

    def close(self) -> None:
        self.sock.close()


def mailq(*argv: str) -> tuple[int, str, str]:
    """`mailq ARGV` in this process; returns the exit status, stdout and stderr."""
    from mailq_cli.main import main

    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        status = main(list(argv))
    return status, out.getvalue(), err.getvalue()


def assert_one_line(result: tuple[int, str, str], *words: str) -> None:
    status, out, err = result
    assert (status, out) == (2, ""), result
    assert err.startswith("mailq: error: ") and err.count("\n") == 1, err
    for word in words:
        assert word in err, err


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class SmtpProcess:
    """`mailq smtp` in a process of its own (`command` its argv, maybe behind `unshare`), started and
    waited for until it listens."""

    def __init__(self, command: list[str], port: int, env: dict[str, str] | None = None) -> None:
        self.port = port
        self.process = subprocess.Popen(
            command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
        )
        self.log: list[str] = []
        assert self.process.stderr is not None
        for line in self.process.stderr:
            self.log.append(line)
            if "listening on" in line:
                break
        else:
            raise AssertionError(f"mailq smtp did not start: {''.join(self.log)}")
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.process.stderr is not None
        for line in self.process.stderr:
            self.log.append(line)

    def stop(self, timeout: float = 60) -> tuple[int, str]:
        """SIGTERM, then the exit status and stdout."""
        self.process.send_signal(signal.SIGTERM)
        assert self.process.stdout is not None
        out = self.process.stdout.read()  # stderr is the reader thread's
        self.process.wait(timeout)
        self._reader.join(10)
        return self.process.returncode, out


def mailq_command(url: str, *argv: str) -> list[str]:
    return [sys.executable, "-m", "mailq_cli", "--url", url, *argv]
