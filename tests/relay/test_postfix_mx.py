"""Remote delivery to a private Postfix as the remote MX: STARTTLS, a Maildir delivery, and a 550 5.1.1
for one recipient of the same transaction, returned to the sender with that status."""

from __future__ import annotations

from mailq_servers.postfix import PrivatePostfix
from tests.smtp.helpers import free_port

from .conftest import inbox, send, statuses, wait_until


def test_a_postfix_mx_takes_one_recipient_and_refuses_the_other(
    runtime, start_worker, certificate, relay_log
):
    port = free_port()
    with PrivatePostfix(port, ["bob@pf.test"], tls=certificate) as postfix:
        send(runtime, "bob@pf.test", "nobody@pf.test")
        worker = start_worker(transport={"pf.test": f"127.0.0.1:{port}"})
        wait_until(lambda: postfix.delivered("bob@pf.test"))
        wait_until(lambda: inbox(runtime))
        wait_until(lambda: runtime.queue("spool").size() == 0)
        stats = worker.stop()
        (copy,) = postfix.delivered("bob@pf.test")
    assert b"with ESMTPS id" in copy  # the session went over STARTTLS
    assert b"Subject: for far away" in copy
    assert statuses(relay_log, "bob@pf.test") == ["sent"]
    assert statuses(relay_log, "nobody@pf.test") == ["bounced"]
    (notice,) = inbox(runtime)
    (block,) = notice.get_payload()[1].get_payload()[1:]
    assert block["Final-Recipient"] == "rfc822; nobody@pf.test"
    assert (block["Action"], block["Status"]) == ("failed", "5.1.1")
    assert "User unknown in virtual mailbox table" in " ".join(block["Diagnostic-Code"].split())
    assert (stats.delivered, stats.bounced) == (2, 1)  # the mail, and the notification to alice


def test_mails_to_one_destination_share_one_session(runtime, start_worker, relay_log):
    port = free_port()
    with PrivatePostfix(port, ["bob@pf.test"]) as postfix:
        for _ in range(3):
            send(runtime, "bob@pf.test")
        worker = start_worker(transport={"pf.test": f"127.0.0.1:{port}"})
        wait_until(lambda: len(postfix.delivered("bob@pf.test")) == 3)
        wait_until(lambda: runtime.queue("spool").size() == 0)
        worker.stop()
        wait_until(lambda: postfix.sessions())
        assert postfix.sessions() == ["ehlo=1 mail=3 rcpt=3 data=3 rset=2 quit=1 commands=13"]
    assert statuses(relay_log, "bob@pf.test") == ["sent"] * 3
