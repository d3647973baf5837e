"""`mailq smtp` and swaks (the Debian package, which the harness installs when the machine lacks it):
pipelining, 8-bit content kept byte for byte, STARTTLS with AUTH from an address that may not relay
otherwise, and the refusals swaks reports."""

from __future__ import annotations

import subprocess
from functools import cache

from mailq_runtime.smtp.access import tls_context
from mailq_servers.system_packages import system_program

from .conftest import USER
from .helpers import SENDER


@cache
def swaks_program() -> str:
    return system_program("swaks")


def swaks(port: int, *options: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            swaks_program(),
            "--server",
            f"127.0.0.1:{port}",
            "--from",
            SENDER,
            "--helo",
            "swaks.example",
            *options,
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_pipelining_and_eight_bit_content_arrive_byte_for_byte(running, tmp_path):
    body = "Grüße aus Köln: ½ € ✓".encode()
    data = tmp_path / "mail.eml"
    data.write_bytes(
        b"Subject: =?utf-8?q?gr=C3=BC=C3=9Fe?=\r\nContent-Type: text/plain; charset=utf-8\r\n\r\n" + body
    )
    ran = swaks(running.port, "--to", USER, "--pipeline", "--data", f"@{data}")
    assert ran.returncode == 0, ran.stdout
    assert "PIPELINING" in ran.stdout and "<** " not in ran.stdout
    item = running.queue.dequeue(timeout=10)
    assert item is not None and item.mail.message.endswith(body + b"\r\n")
    item.done()


def test_swaks_reports_an_unknown_user_and_a_refused_relay(running):
    unknown = swaks(running.port, "--to", "nobody@example.org")
    assert unknown.returncode == 24 and "<** 550 5.1.1 <nobody@example.org>" in unknown.stdout
    relay = swaks(running.port, "--to", "carol@remote.example", "--local-interface", "127.0.0.2")
    assert (
        relay.returncode == 24 and "<** 554 5.7.1 <carol@remote.example>: Relay access denied" in relay.stdout
    )
    quit_early = swaks(running.port, "--to", USER, "--quit-after", "RCPT")
    assert quit_early.returncode == 0
    assert running.size() == 0


def test_starttls_and_auth_let_swaks_relay_from_elsewhere(serve, certificate):
    credentials = {"relay": b"pass word"}
    with serve(tls=tls_context(*certificate), credentials=credentials) as running:
        options = ("--to", "carol@remote.example", "--local-interface", "127.0.0.2", "--tls")
        for mechanism in ("PLAIN", "LOGIN"):
            ran = swaks(
                running.port,
                *options,
                "--auth",
                mechanism,
                "--auth-user",
                "relay",
                "--auth-password",
                "pass word",
            )
            assert ran.returncode == 0, ran.stdout
            assert "235 2.7.0 Authentication successful" in ran.stdout
        wrong = swaks(
            running.port, *options, "--auth", "PLAIN", "--auth-user", "relay", "--auth-password", "nope"
        )
        assert wrong.returncode == 28 and "535 5.7.8" in wrong.stdout
        assert running.size() == 2
