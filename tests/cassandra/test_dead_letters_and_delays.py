"""Dead letters and delayed mails: the Cassandra DAOs answer as the embedded ones do, delays of centuries
and a flush included."""

from __future__ import annotations

from mailq_runtime.clock import LATEST
from mailq_runtime.stores.records import DeadLetter, DelayedMail

from .conftest import Tables, same_on_both

HOUR = 3600 * 1_000_000
T0 = 1_700_002_800 * 1_000_000


def letter(queue: str, n: int, reason: str = "550 unknown user") -> DeadLetter:
    return DeadLetter(queue, f"{T0:016x}{n:016x}", reason, T0 + n, f'{{"mail": {n}}}')


def test_dead_letters_as_the_embedded_ones(both):
    def scenario(t: Tables) -> list:
        d = t.dead_letters
        for n in (3, 1, 2):
            d.add(letter("spool", n))
        d.add(letter("other", 1))
        d.add(letter("spool", 2, reason="content missing"))  # dead again: replaces
        seen = [
            d.list("spool"),
            d.summary("spool").count,
            d.summary("other").count,
            d.summary("nope").count,
            d.list("nope"),
        ]
        seen += [d.get("spool", letter("spool", 2).enqueue_id), d.get("spool", "f" * 32)]
        d.remove("spool", letter("spool", 1).enqueue_id)
        d.remove("spool", "f" * 32)
        return [*seen, d.list("spool"), d.summary("spool").count, d.list("other")]

    seen = same_on_both(both, scenario)
    spool_2 = letter("spool", 2, reason="content missing")
    assert seen == [
        [letter("spool", 1), spool_2, letter("spool", 3)],
        3,
        1,
        0,
        [],
        spool_2,
        None,
        [spool_2, letter("spool", 3)],
        2,
        [letter("other", 1)],
    ]


def test_delayed_mails_come_due_in_order_across_hours_and_centuries(both):
    first = DelayedMail("spool", "a" * 32, T0 + 10, 5, "p1")
    same_time = DelayedMail("spool", "0" * 32, T0 + 10, 9, "p2")
    next_hour = DelayedMail("spool", "b" * 32, T0 + HOUR + 1, 5, "p3")
    again = DelayedMail("spool", "a" * 32, T0 + 3 * HOUR, 5, "p1 again")
    centuries = DelayedMail("spool", "c" * 32, LATEST, 0, "p4")
    other = DelayedMail("other", "d" * 32, T0, 5, "p5")

    def scenario(t: Tables) -> list:
        d = t.delayed_mails
        for mail in (centuries, again, next_hour, first, same_time, other):
            d.add(mail)
        seen = [d.due("spool", T0, 10), d.due("spool", T0 + 10, 10), d.due("spool", T0 + 4 * HOUR, 3)]
        seen += [d.due("spool", T0 + 4 * HOUR, 1), d.due("spool", T0 + 4 * HOUR, 0), d.all("spool")]
        for mail in (same_time, first, next_hour):
            d.remove(mail)
        d.remove(first)
        # The emptied hours are well in the past now.
        seen += [d.due("spool", T0 + 9 * HOUR, 10), d.due("spool", T0 + 9 * HOUR, 10), d.all("spool")]
        d.add(DelayedMail("spool", "e" * 32, T0 + 10 * HOUR, 5, "p6"))
        seen += [d.due("spool", T0 + 10 * HOUR, 10), d.due("spool", LATEST, 10), d.all("other"), d.all("x")]
        return seen

    seen = same_on_both(both, scenario)
    assert seen[:6] == [
        [],
        [same_time, first],
        [same_time, first, next_hour],
        [same_time],
        [],
        [same_time, first, next_hour, again, centuries],
    ]
    assert seen[6:9] == [[again], [again], [again, centuries]]
    later = DelayedMail("spool", "e" * 32, T0 + 10 * HOUR, 5, "p6")
    assert seen[9:] == [[again, later], [again, later, centuries], [other], []]
