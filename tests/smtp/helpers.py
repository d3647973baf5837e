"""Clients for the SMTP tests: smtplib's, and a raw socket for what no well-behaved client sends."""

from __future__ import annotations

import smtplib
import socket

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
