"""What a session reads: its command lines, checked before aiosmtpd's parser sees them, and DATA's message in
blocks as the client sent it, rather than aiosmtpd's read, list append and checks for each of its lines
(130 of them in a 10 KiB mail), with aiosmtpd's limits and replies."""

from __future__ import annotations

import asyncio

from aiosmtpd.smtp import SMTP

# A DATA line longer than this with its CRLF gets 500 (RFC 5321 4.5.3.1.6: 998 octets, CRLF, a
# transparent dot); a longer one still than OVERRUN overran aiosmtpd's stream limit before any other check.
LINE_LIMIT = SMTP.line_length_limit
OVERRUN = LINE_LIMIT + 2
LINE_TOO_LONG = "500 Line too long (see RFC5321 4.5.3.1.6)"
TOO_MUCH_DATA = "552 Error: Too much mail data"
END = b"\r\n.\r\n"
# The reader's buffer while the message comes: the stream pauses the socket past twice this, which at the
# command lines' limit it would do several times a message.
DATA_BUFFER = 64 * 1024


class BareLineFeed(Exception):
    """A command line ended in LF alone: the client's framing cannot be trusted (SMTP smuggling)."""


class NulInCommand(Exception):
    """A command line held a NUL byte."""


def refusal(lines: bytes | bytearray, offset: int, size_limit: int | None) -> str | None:
    """The reply the first offending line of `lines` (whole lines, each with its CRLF, the first `offset`
    octets into the message) earns, in aiosmtpd's order: a line that overruns, then the size, then a line
    over the limit."""
    split = lines.split(b"\r\n")[:-1]
    over_size = bool(size_limit) and offset + len(lines) > size_limit  # type: ignore[operator]
    if not over_size and max(map(len, split), default=0) + 2 <= LINE_LIMIT:
        return None
    end = offset
    for line in split:
        length = len(line) + 2
        end += length
        if length > OVERRUN:
            return LINE_TOO_LONG
        if size_limit and end > size_limit:
            return TOO_MUCH_DATA
        if length > LINE_LIMIT:
            return LINE_TOO_LONG
    return None


def message_end(data: bytearray, searched: int, at_start: bool) -> tuple[int, int] | None:
    """Where the message in `data` ends, searched from `searched`: its length and the octets up to the
    end of the lone dot's line; `at_start` if `data` begins with the message's first line."""
    if at_start and data.startswith(b".\r\n"):
        return 0, 3
    found = data.find(END, searched)
    return None if found < 0 else (found + 2, found + len(END))


def unstuffed(message: bytearray) -> bytes:
    """The message without the dot a client puts before each line that starts with one (RFC 5321 4.5.2)."""
    if message.startswith(b"."):
        del message[0]
    return bytes(message.replace(b"\r\n.", b"\r\n"))


class SessionReader(asyncio.StreamReader):
    """A session's stream. Built on StreamReader's buffer and wait, as its own readuntil is: the message
    is taken from the buffer up to the lone dot, and what follows it (a pipelined command) stays."""

    async def readuntil(self, separator: bytes = b"\n") -> bytes:
        line = await super().readuntil(separator)
        if separator == b"\n":
            if not line.endswith(b"\r\n"):
                raise BareLineFeed()
            if b"\0" in line:
                raise NulInCommand()
        return line

    async def read_message(self, size_limit: int | None) -> bytes | str:
        """DATA's message up to the lone dot line, dot-unstuffed, or the refusal it earns (a reply, once
        the lone dot is read, as aiosmtpd replies). A refused message is not kept past its refusal."""
        line_limit, self._limit = self._limit, DATA_BUFFER
        try:
            return await self._read_message(size_limit)
        finally:
            self._limit = line_limit
            self._maybe_resume_transport()

    async def _read_message(self, size_limit: int | None) -> bytes | str:
        data = bytearray()  # the message from its start; once refused, only its last octets
        checked = 0  # data[:checked] are whole lines found within the limits
        refused: str | None = None
        while True:
            if self._exception is not None:
                raise self._exception
            searched = max(len(data) - len(END) + 1, 0)
            data += self._buffer
            self._buffer.clear()
            end = message_end(data, searched, at_start=refused is None)
            if end is not None:
                length, consumed = end
                self._buffer += data[consumed:]
                if refused is not None:
                    return refused
                message = data[:length]
                return refusal(message[checked:], checked, size_limit) or unstuffed(message)
            if refused is None:
                whole = data.rfind(b"\r\n", checked) + 2
                if whole > 1:
                    refused = refusal(data[checked:whole], checked, size_limit)
                    checked = whole
                if refused is None and len(data) - checked > OVERRUN - 1:
                    refused = LINE_TOO_LONG
            if refused is not None:
                # Only what may hold the start of the lone dot's line is kept.
                del data[: -len(END) + 1]
            if self._eof:
                raise asyncio.IncompleteReadError(bytes(data), None)
            await self._wait_for_data("read_message")
