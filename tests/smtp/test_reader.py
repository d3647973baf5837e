"""DATA's message read in blocks: the lone dot found wherever the client's writes cut it, dot-unstuffed,
what follows it left for the next command, and aiosmtpd's refusals (a line too long, too much data) in its
order."""

from __future__ import annotations

import asyncio

import pytest

from mailq_runtime.smtp.reader import LINE_TOO_LONG, TOO_MUCH_DATA, SessionReader
from mailq_runtime.smtp.server import run


def read(chunks: list[bytes], size_limit: int | None = None) -> tuple[bytes | str, bytes]:
    """The message `read_message` returns when the client's bytes arrive in `chunks`, each once the reader
    waits, and the command line read after it."""

    async def reading() -> tuple[bytes | str, bytes]:
        reader = SessionReader(limit=1001)
        waiting = asyncio.ensure_future(reader.read_message(size_limit))
        for chunk in chunks:
            await asyncio.sleep(0)
            reader.feed_data(chunk)
        reader.feed_data(b"QUIT\r\n")
        return await waiting, await reader.readuntil()

    return run(reading())


def cuts(data: bytes) -> list[list[bytes]]:
    """`data` as one write, and cut in two at each position."""
    return [[data]] + [[data[:at], data[at:]] for at in range(1, len(data))]


def test_the_message_ends_at_the_lone_dot_wherever_the_writes_cut_it_and_is_dot_unstuffed():
    sent = b"Subject: dots\r\n\r\n..leading dot\r\n.\r\n"
    for chunks in cuts(sent + b"MAIL FROM:<a@b.example>\r\n"):
        message, _ = read(chunks)
        assert message == b"Subject: dots\r\n\r\n.leading dot\r\n", chunks


def test_what_follows_the_lone_dot_is_the_next_command():
    async def reading() -> tuple[bytes | str, bytes, bytes]:
        reader = SessionReader(limit=1001)
        reader.feed_data(b"a\r\n.\r\nRSET\r\nQUIT\r\n")
        return await reader.read_message(None), await reader.readuntil(), await reader.readuntil()

    assert run(reading()) == (b"a\r\n", b"RSET\r\n", b"QUIT\r\n")


@pytest.mark.parametrize("sent", [b".\r\n", b"..\r\n.\r\n", b"x\r\n.\r\n"])
def test_a_short_message_in_any_cut(sent):
    expected = {b".\r\n": b"", b"..\r\n.\r\n": b".\r\n", b"x\r\n.\r\n": b"x\r\n"}[sent]
    for chunks in cuts(sent):
        assert read(chunks)[0] == expected, chunks


def test_a_dot_not_alone_on_its_line_does_not_end_the_message():
    message, _ = read([b"a.\r\n.b\r\n. \r\n", b".\r\n"])
    assert message == b"a.\r\nb\r\n \r\n"


def test_lines_of_1001_octets_pass_and_longer_ones_get_500_once_the_lone_dot_is_read():
    fits = b"x" * 999 + b"\r\n"
    assert read([fits, b".\r\n"])[0] == fits
    too_long = b"x" * 1000 + b"\r\n"
    for chunks in ([too_long + b".\r\n"], [too_long[:500], too_long[500:] + b"more\r\n", b".\r\n"]):
        message, after = read(chunks)
        assert (message, after) == (LINE_TOO_LONG, b"QUIT\r\n")


def test_a_line_without_an_end_is_too_long_and_its_octets_are_not_kept():
    message, after = read([b"x" * 5000, b"y" * 5000, b"\r\n.\r\n"])
    assert (message, after) == (LINE_TOO_LONG, b"QUIT\r\n")


def test_a_message_over_the_size_limit_gets_552_and_the_first_offence_decides():
    line = b"x" * 78 + b"\r\n"
    assert read([line * 10 + b".\r\n"], size_limit=800)[0] == line * 10
    assert read([line * 10 + b".\r\n"], size_limit=799)[0] == TOO_MUCH_DATA
    assert read([line * 5, line * 50, b".\r\n"], size_limit=1000)[0] == TOO_MUCH_DATA
    # A line too long before the limit is reached, then the size: the line decides; the other way, the size.
    long = b"x" * 1200 + b"\r\n"
    assert read([line + long + line * 100 + b".\r\n"], size_limit=2000)[0] == LINE_TOO_LONG
    assert read([line * 30 + long + b".\r\n"], size_limit=2000)[0] == TOO_MUCH_DATA
