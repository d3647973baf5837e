"""`mailq smtp` spoken to by smtplib: the extensions, who may send to whom, a 250 only for a mail the
queue holds, and every bad input refused with the standard reply and nothing enqueued."""

from __future__ import annotations

import random
import smtplib
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from functools import partial

import pytest
from aiosmtpd.smtp import SMTP

from mailq_runtime.smtp.access import Authenticator
from mailq_runtime.smtp.handler import RECEIVED_RESERVE
from mailq_runtime.smtp.protocol import _PLAIN_ADDRESS, SessionTemplate, SmtpSession
from mailq_runtime.smtp.server import run
from mailq_runtime.worker import run_worker

from .conftest import DOMAIN, HOSTNAME, QUEUE, USER, make_store, serving
from .helpers import MESSAGE, SENDER, Raw, client


def test_ehlo_offers_size_8bitmime_smtputf8_pipelining_and_enhanced_status_codes(running):
    with client(running.port) as smtp:
        features = smtp.esmtp_features
        assert int(features["size"]) == running.queue.max_message_size - RECEIVED_RESERVE
        assert {"8bitmime", "smtputf8", "pipelining", "enhancedstatuscodes"} <= set(features)
        # Neither without a certificate: no STARTTLS, and AUTH is only offered over TLS.
        assert "starttls" not in features and "auth" not in features


def test_a_mail_for_a_local_user_is_enqueued_before_its_250_with_a_received_header(backend):
    url = backend.url()
    make_store(url)
    with serving(url) as running, client(running.port) as smtp:
        code, reply = smtp.mail(SENDER)
        assert code == 250
        assert smtp.rcpt(USER)[0] == 250
        code, reply = smtp.data(MESSAGE)
        assert code == 250 and reply.startswith(b"2.0.0 Ok: queued as ")
        enqueue_id = reply.split()[-1].decode()
        # The 250 came after the enqueue returned: the queue holds the mail now.
        [item] = list(running.queue.browse())
        assert (item.enqueue_id, item.sender, item.recipients) == (enqueue_id, SENDER, [USER])
        dequeued = running.queue.dequeue(timeout=10)
        assert dequeued is not None
        received, rest = dequeued.mail.message.split(b"\r\n\t", 1)
        assert received == b"Received: from client.example (unknown[127.0.0.1])"
        assert rest.startswith(f"by {HOSTNAME} (mailq) with ESMTP id ".encode())
        assert f"for <{USER}>;".encode() in rest
        assert dequeued.mail.message.endswith(MESSAGE)
        assert dequeued.mail.remote_addr == "127.0.0.1"
        dequeued.done()


def test_the_null_sender_and_several_recipients(running):
    with client(running.port) as smtp:
        assert smtp.sendmail("<>", [USER, "carol@remote.example"], MESSAGE) == {}
    [item] = list(running.queue.browse())
    assert item.sender is None and item.recipients == [USER, "carol@remote.example"]


def test_an_unknown_local_user_gets_550_5_1_1_and_nothing_is_enqueued(running):
    with client(running.port) as smtp:
        smtp.mail(SENDER)
        code, reply = smtp.rcpt(f"nobody@{DOMAIN}")
        assert code == 550 and reply.startswith(b"5.1.1 <nobody@example.org>: Recipient address rejected")
        # The domain in another case is still local; the user is compared case-insensitively.
        assert smtp.rcpt("Alice@EXAMPLE.org")[0] == 250
    assert running.size() == 0 and running.runtime.queues() == []


def test_relay_from_the_host_itself_and_never_from_another_address(running):
    with client(running.port, source="127.0.0.2") as smtp:
        smtp.mail(SENDER)
        code, reply = smtp.rcpt("carol@remote.example")
        assert (code, reply) == (554, b"5.7.1 <carol@remote.example>: Relay access denied")
        # A local user is still accepted from anywhere.
        assert smtp.rcpt(USER)[0] == 250
        smtp.rset()
        with pytest.raises(smtplib.SMTPRecipientsRefused):
            smtp.sendmail(SENDER, ["dave@remote.example"], MESSAGE)
    assert running.size() == 0
    with client(running.port) as smtp:
        assert smtp.sendmail(SENDER, ["carol@remote.example"], MESSAGE) == {}
    assert running.size() == 1


def test_a_declared_size_over_the_limit_gets_552_at_mail_from(running):
    limit = int(client(running.port).esmtp_features["size"])
    with client(running.port) as smtp:
        code, reply = smtp.mail(SENDER, [f"SIZE={limit + 1}"])
        assert code == 552 and reply.startswith(b"5.3.4")
        assert smtp.mail(SENDER, [f"SIZE={limit}"])[0] == 250
    assert running.size() == 0


def test_an_actual_size_over_the_limit_gets_552_at_the_end_of_data(tmp_path):
    url = f"embedded://{tmp_path / 'small'}?max_message_size=4096"
    make_store(url)
    with serving(url) as running, client(running.port) as smtp:
        smtp.mail(SENDER)
        smtp.rcpt(USER)
        code, _ = smtp.data(MESSAGE + (b"x" * 80 + b"\r\n") * 60)
        assert code == 552
        # The session goes on: a mail within the limit is taken.
        assert smtp.sendmail(SENDER, [USER], MESSAGE) == {}
        assert running.size() == 1


def test_too_many_recipients_get_452_4_5_3(serve):
    with serve(max_recipients=2) as running, client(running.port) as smtp:
        smtp.mail(SENDER)
        assert smtp.rcpt(USER)[0] == 250
        assert smtp.rcpt("carol@remote.example")[0] == 250
        code, reply = smtp.rcpt("dave@remote.example")
        assert (code, reply) == (452, b"4.5.3 Error: too many recipients")
        smtp.rset()
        assert running.size() == 0


@pytest.mark.parametrize(
    "line, code",
    [
        (b"RCPT TO:<alice example.org>", 501),  # no @: not an address
        (b"RCPT TO:<alice@exa mple.org>", 501),
        (b"RCPT TO:<" + b"a" * 65 + b"@example.org>", 553),  # a local part over 64 octets
        (b"RCPT TO:<alice@" + b"d" * 64 + b".org>", 501),  # a label over 63 octets
        (b"RCPT TO:<" + b"a" * 60 + b"@" + b"d" * 460 + b">", 500),  # a command line over 512 octets
    ],
)
def test_malformed_or_overlong_addresses_are_refused(running, line, code):
    raw = Raw(running.port).greeted()
    assert raw.command(b"MAIL FROM:<bob@elsewhere.example>\r\n").startswith("250")
    reply = raw.command(line + b"\r\n")
    assert reply.startswith(f"{code} 5."), reply
    assert raw.command(b"DATA\r\n").startswith("503")
    raw.close()
    assert running.size() == 0


def test_a_malformed_sender_is_refused(running):
    raw = Raw(running.port).greeted()
    assert raw.command(b"MAIL FROM:<bob@@elsewhere>\r\n")[:3] in ("501", "553")
    assert raw.command(b"MAIL FROM:<" + b"b" * 65 + b"@elsewhere.example>\r\n").startswith("553 5.1.3")
    raw.close()


def test_a_bare_lf_in_a_command_gets_521_and_the_connection_closes(running):
    raw = Raw(running.port).greeted()
    raw.send(b"MAIL FROM:<bob@elsewhere.example>\n")
    assert raw.reply() == "521 5.5.2 Error: bare <LF> received"
    assert raw.reply() == ""  # closed
    assert running.size() == 0


def test_a_nul_in_a_command_gets_500(running):
    raw = Raw(running.port).greeted()
    assert (
        raw.command(b"MAIL FROM:<bob\0@elsewhere.example>\r\n") == "500 5.5.2 Error: NUL character in command"
    )
    assert raw.command(b"RCPT TO:<alice@example.org>\r\n").startswith("503")
    raw.close()


def test_a_data_line_over_1000_octets_is_refused_and_nothing_enqueued(running):
    raw = Raw(running.port).greeted()
    raw.command(b"MAIL FROM:<bob@elsewhere.example>\r\n")
    raw.command(b"RCPT TO:<alice@example.org>\r\n")
    assert raw.command(b"DATA\r\n").startswith("354")
    reply = raw.command(b"Subject: long\r\n\r\n" + b"x" * 1001 + b"\r\n.\r\n")
    assert reply.startswith("500 5.5.2 Line too long")
    raw.close()
    assert running.size() == 0


def test_a_client_gone_in_the_middle_of_data_leaves_nothing_and_the_next_one_is_served(running):
    raw = Raw(running.port).greeted()
    raw.command(b"MAIL FROM:<bob@elsewhere.example>\r\n")
    raw.command(b"RCPT TO:<alice@example.org>\r\n")
    assert raw.command(b"DATA\r\n").startswith("354")
    raw.send(b"Subject: cut\r\n\r\nhalf a mail\r\n")
    raw.close()
    with client(running.port) as smtp:
        assert smtp.sendmail(SENDER, [USER], MESSAGE) == {}
    [item] = list(running.queue.browse())
    assert item.sender == SENDER and running.size() == 1


def test_a_silent_client_gets_421_4_4_2_also_in_the_middle_of_data(serve):
    with serve(timeout=0.5) as running:
        idle = Raw(running.port).greeted()
        assert idle.reply().startswith("421 4.4.2 ")
        assert idle.reply() == ""
        slow = Raw(running.port).greeted()
        slow.command(b"MAIL FROM:<bob@elsewhere.example>\r\n")
        slow.command(b"RCPT TO:<alice@example.org>\r\n")
        assert slow.command(b"DATA\r\n").startswith("354")
        slow.send(b"Subject: slow\r\n")
        assert slow.reply().startswith("421 4.4.2 ")
        assert running.size() == 0


def test_sessions_over_the_limit_get_421_4_7_0(serve):
    with serve(max_sessions=2) as running:
        first, second = client(running.port), client(running.port)
        with pytest.raises(smtplib.SMTPConnectError) as refused:
            client(running.port)
        assert refused.value.smtp_code == 421 and refused.value.smtp_error.startswith(b"4.7.0 ")
        first.quit()
        # A session that ended frees its place.
        deadline = time.monotonic() + 10
        while len(running.server.sessions) > 1 and time.monotonic() < deadline:
            time.sleep(0.01)
        with client(running.port) as third:
            assert third.noop()[0] == 250
        second.quit()


def test_the_store_must_exist(tmp_path):
    from mailq_runtime import NoStore

    with pytest.raises(NoStore):
        with serving(f"embedded://{tmp_path / 'none'}"):
            pass
    assert not (tmp_path / "none").exists()


def test_mails_accepted_for_local_users_are_delivered_by_the_worker(backend):
    url = backend.url()
    make_store(url)
    with serving(url) as running:
        with client(running.port) as smtp:
            for number in range(3):
                smtp.sendmail(SENDER, [USER], MESSAGE.replace(b"hello", f"hello {number}".encode()))
        stats = run_worker(running.runtime, QUEUE, local_domains=[DOMAIN], idle_timeout=2)
        assert stats.delivered == 3
        mailboxes = running.runtime.mailboxes
        inbox = mailboxes.get(USER, "INBOX")
        messages = [mailboxes.read(inbox.id, entry.uid) for entry in mailboxes.list_messages(inbox.id)]
        assert sorted(m.split(b"Subject: ")[1].split(b"\r\n")[0] for m in messages) == [
            b"hello 0",
            b"hello 1",
            b"hello 2",
        ]
        assert all(m.startswith(b"Received: from client.example") for m in messages)


def test_an_enqueue_under_way_does_not_hold_the_other_sessions(running):
    """The enqueue runs in the thread pool: while one waits (here made to take a second), the other
    sessions are answered and their enqueues run beside it."""
    queue = running.server.handler.queue
    enqueue = queue.enqueue

    def slow_enqueue(mail):
        time.sleep(1.0)
        return enqueue(mail)

    queue.enqueue = slow_enqueue
    try:
        started = time.monotonic()
        with ThreadPoolExecutor(4) as pool:
            sent = [pool.submit(_send_one, running.port) for _ in range(4)]
            time.sleep(0.3)
            with client(running.port) as other:
                answered = time.monotonic()
                assert other.noop()[0] == 250
                # Answered while every enqueue still sleeps: no enqueue holds the event loop.
                assert time.monotonic() - answered < 0.7
            assert all(future.result() == {} for future in sent)
        assert time.monotonic() - started < 3.7  # four one-second enqueues side by side, not one by one
    finally:
        queue.enqueue = enqueue
    assert running.size() == 4


def _send_one(port: int) -> dict:
    with client(port) as smtp:
        return smtp.sendmail(SENDER, [USER], MESSAGE)


def test_sessions_from_the_template_hold_what_aiosmtpds_constructor_gives_each_bound_to_itself(running):
    """A session takes aiosmtpd's state from its server's template (inspected once) rather than from
    aiosmtpd's constructor: the same attributes and values, its commands and AUTH mechanisms its own."""
    handler, metrics = running.server.handler, running.server.metrics
    settings = {"hostname": HOSTNAME, "authenticator": Authenticator({"carol": b"secret"})}

    async def made() -> tuple[SmtpSession, SmtpSession, SmtpSession]:
        template = SessionTemplate(handler, set(), lambda: False, metrics, **settings)
        reference = SmtpSession.__new__(SmtpSession)
        SMTP.__init__(reference, handler, **settings)
        return SmtpSession(template), SmtpSession(template), reference

    first, second, reference = run(made())
    assert set(vars(reference)) <= set(vars(first))
    bound = {"_smtp_methods", "_auth_methods", "loop", "_loop", "_closed", "_stream_reader_wr"}
    bound |= {"_strong_reader", "_client_connected_cb", "command_size_limits"}
    for name in set(vars(reference)) - bound:
        assert getattr(first, name) == getattr(reference, name), name
    assert first._smtp_methods.keys() == reference._smtp_methods.keys()
    assert all(method.__self__ is first for method in first._smtp_methods.values())
    assert first._auth_methods.keys() == reference._auth_methods.keys() == {"LOGIN", "PLAIN"}
    assert all(mechanism.method.__self__ is first for mechanism in first._auth_methods.values())
    assert first._stream_reader is not second._stream_reader
    assert first.command_size_limits is not second.command_size_limits


@pytest.mark.parametrize(
    "arg",
    [
        "<alice@example.org>",
        "<Alice.B-C+tag=1_x@Sub.Example-1.org> SIZE=10240 BODY=8BITMIME",
        "<alice@example.org>SIZE=1",
        "<alice@example.org> \t SIZE=1 ",
        "<alice@example.org> (a comment) SIZE=1",
        "<alice@example.org>(a comment)",
        "<" + "a" * 64 + "@example.org>",
        "<" + "a" * 65 + "@example.org>",
        "<a.b.c@d>",
        "<a..b@example.org>",
        "<.a@example.org>",
        "<a@example.org.>",
        "<a@[127.0.0.1]>",
        '<"quoted local"@example.org>',
        "<a@b@c>",
        "<@relay.example:alice@example.org>",
        "<>",
        "alice@example.org",
        "<alice@example.org",
        "<alice example.org>",
        "<ålice@exämple.org>",
    ],
)
def test_an_address_is_taken_as_aiosmtpd_takes_it(arg):
    """A plain address skips the email package's parser: the same address and parameters either way."""
    session = SmtpSession.__new__(SmtpSession)
    assert session._getaddr(arg) == SMTP._getaddr(session, arg)


def test_addresses_made_at_random_are_taken_as_aiosmtpd_takes_them():
    session = SmtpSession.__new__(SmtpSession)
    pick = random.Random(24)
    words = [
        "alice",
        "B0b",
        "x",
        "a-b",
        "c_d",
        "e+f",
        "g=h",
        ".",
        ".",
        "@",
        "@",
        "é",
        " ",
        "(",
        '"',
        "[",
        ":",
    ]
    taken = 0
    for _ in range(3000):
        local = "".join(pick.choices(words[:7] + words[7:9], k=pick.randint(1, 4)))
        domain = "".join(pick.choices(words[:2] + words[7:8], k=pick.randint(1, 4)))
        arg = f"<{local}@{domain}>" if pick.random() < 0.7 else "<" + "".join(pick.choices(words, k=6)) + ">"
        arg += pick.choice(["", " SIZE=1", " \t BODY=8BITMIME", "(c)", " (c) X"])
        taken += _PLAIN_ADDRESS.match(arg) is not None
        assert outcome(session._getaddr, arg) == outcome(partial(SMTP._getaddr, session), arg), arg
    assert taken > 300  # both ways are compared


def outcome(getaddr: Callable[[str], object], arg: str) -> object:
    """What `getaddr` returns, or the class of what it raises: the email package's parser fails on some
    input with an AttributeError of its own, whichever way it is called."""
    try:
        return getaddr(arg)
    except Exception as error:
        return type(error)
