"""What the runtime contract tests share: a controllable clock and mail builders (the deployments they run
on are in backends.py, the hooks they answer in probes.py)."""

from __future__ import annotations

from mailq_runtime import Mail
from mailq_runtime.clock import MICROS_PER_SECOND


class FakeClock:
    """Microseconds since the epoch that move only when the test says so. Starts on a whole hour,
    so slice boundaries fall on round numbers whatever the slice window."""

    def __init__(self, start_seconds: int = 1_700_002_800) -> None:
        self.now = start_seconds * MICROS_PER_SECOND

    def __call__(self) -> int:
        return self.now

    def advance(self, seconds: float) -> int:
        self.now += round(seconds * MICROS_PER_SECOND)
        return self.now


def make_mail(
    name: str | None = None,
    *,
    sender: str | None = "sender@example.com",
    recipients: tuple[str, ...] = ("rcpt@example.com",),
    body: bytes = b"Hello.\r\n",
    **fields,
) -> Mail:
    message = b"Subject: test\r\nFrom: sender@example.com\r\n\r\n" + body
    if name is not None:
        fields["name"] = name
    return Mail(recipients=recipients, message=message, sender=sender, **fields)
