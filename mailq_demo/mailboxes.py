"""The mailbox part of `mailq demo`: deliver the queue into INBOXes, then use the mailboxes a little.

Reading, flagging, archiving and expunging go through record 23's three writes each; expunging releases
blob references and appends deletions; the rotation gives the next reference generation and GC iteration,
which is what lets the garbage collector of record 39 look at this generation two rotations later.
`inject_counter_faults` makes a few of those operations die between their writes, as a crash would, so
that the counter recomputation has something to repair.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import asdict

from mailq_runtime.errors import UnknownMailbox
from mailq_runtime.faults import AFTER_PROJECTION, AFTER_SOURCE_OF_TRUTH, InjectedFault
from mailq_runtime.mailbox import INBOX, SEEN, Mailbox
from mailq_runtime.model import MailAddress
from mailq_runtime.runtime import Runtime
from mailq_runtime.worker import run_worker

ARCHIVE = "Archive"
# The worker stops once no mail has come for this long: the queue is drained (delayed mails aside).
_IDLE_SECONDS = 1.0


def deliver_and_maintain(
    runtime: Runtime, queue_name: str, users: Collection[str], report: Callable[[str], None]
) -> dict:
    """Deliver `queue_name` to the local users (their domains are the local ones), then per user: mark
    half the INBOX read, flag the first message, archive the last, expunge the one before it. Rotates the
    reference generation and returns the figures (the demo counts the tables' rows itself)."""
    users = _users(users)
    stats = run_worker(
        runtime, queue_name, local_domains={user.domain for user in users}, idle_timeout=_IDLE_SECONDS
    )
    report(
        f"delivered {stats.delivered} mail(s) as {stats.appended} message(s); {stats.dead_lettered} "
        f"dead-lettered, {stats.retried} retried; {runtime.queue(queue_name).size()} left in {queue_name}"
    )
    use = use_mailboxes(runtime, users, report)
    generation, iteration = runtime.generations.rotate()
    report(f"rotated to reference generation {generation}, GC iteration {iteration}")
    return {
        "worker": asdict(stats),
        **use,
        "reference_generation": generation,
        "gc_iteration": iteration,
    }


def _users(users: Collection[str]) -> list[MailAddress]:
    return [MailAddress(MailAddress(user).lower()) for user in users]


def use_mailboxes(runtime: Runtime, users: Collection[str], report: Callable[[str], None]) -> dict:
    """Per user: mark half the INBOX read, flag the first message, archive the last, expunge the one
    before it. Returns how many of each."""
    mailboxes = runtime.mailboxes
    seen = flagged = archived = expunged = 0
    for user in users:
        try:
            inbox = mailboxes.get(user, INBOX)
        except UnknownMailbox:  # no mail came for this user
            continue
        messages = mailboxes.list_messages(inbox)
        for entry in messages[: len(messages) // 2]:
            mailboxes.set_flags(inbox, entry.uid, add=[SEEN])
            seen += 1
        if messages:
            mailboxes.set_flags(inbox, messages[0].uid, add=["\\Flagged"])
            flagged += 1
        if len(messages) >= 2:
            mailboxes.move(inbox, messages[-1].uid, mailboxes.get_or_create(user, ARCHIVE))
            archived += 1
        if len(messages) >= 3:
            expunged += mailboxes.expunge(inbox, [messages[-2].uid])
        counters = mailboxes.counters(inbox)
        report(f"{user}: INBOX holds {counters.count} message(s), {counters.unseen} unseen")
    report(f"marked {seen} read, flagged {flagged}, archived {archived}, expunged {expunged}")
    return {"seen": seen, "flagged": flagged, "archived": archived, "expunged": expunged}


def inject_counter_faults(
    runtime: Runtime, users: Collection[str], report: Callable[[str], None]
) -> list[dict[str, str]]:
    """Make one operation in each of four users' INBOXes die between two of its writes (record 23's
    failure): mark read after the projection (the unseen counter stays high), move after the source of
    truth (both projections and both counters behind), mark read after the source of truth (projection
    outdated, counter behind) and expunge after the projection (count too high). Users with fewer than two
    unread messages are skipped. Returns the faults that fired."""
    mailboxes = runtime.mailboxes

    def mark_read(inbox: Mailbox, uid: int) -> None:
        mailboxes.set_flags(inbox, uid, add=[SEEN])

    def archive(inbox: Mailbox, uid: int) -> None:
        mailboxes.move(inbox, uid, mailboxes.get_or_create(inbox.user, ARCHIVE))

    def expunge(inbox: Mailbox, uid: int) -> None:
        mailboxes.expunge(inbox, [uid])

    plan = [
        ("mark read", mark_read, AFTER_PROJECTION),
        ("archive", archive, AFTER_SOURCE_OF_TRUTH),
        ("mark read", mark_read, AFTER_SOURCE_OF_TRUTH),
        ("expunge", expunge, AFTER_PROJECTION),
    ]
    fired = []
    for user in _users(users):
        if not plan:
            break
        try:
            inbox = mailboxes.get(user, INBOX)
        except UnknownMailbox:
            continue
        unread = [entry.uid for entry in mailboxes.list_messages(inbox) if SEEN not in entry.flags]
        if len(unread) < 2:
            continue
        name, operation, point = plan.pop(0)
        mailboxes.faults.arm(point)
        try:
            operation(inbox, unread[-1])
        except InjectedFault:
            fired.append({"user": str(user), "operation": name, "point": point})
            report(f"{user}: {name} died {point.replace('_', ' ')}")
        finally:
            mailboxes.faults.disarm()  # armed points fire once; never leave one for a later operation
    return fired
