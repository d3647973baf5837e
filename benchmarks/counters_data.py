"""The data of the counters benchmark (counters.py), the same on both deployments, from the same formulas:
the mailboxes (0.1% of them empty), the messages spread evenly over the others with time-ordered ids as the
runtime makes them, 20% unseen; 0.05% of the projection entries orphan (no source-of-truth entry), 0.05%
missing, 0.2% outdated (other flags); the counters right except for 3% of the mailboxes (count or unseen
off) and 0.1% with no counters row.

Embedded, it is generated inside SQLite, tables written in their primary key's order (message_id_table by
mailbox as Cassandra clusters it, imap_uid_table by message id), the secondary index built after; on
Cassandra it is loaded with concurrent prepared inserts (counters by increments).

Not a benchmark itself; imported by counters.py.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from importlib.resources import files
from pathlib import Path

import numpy as np
from deployments import Deployment
from harness import SEQUENCE, bulk_connection, insert, load

from assets.mailboxes import SEEN
from mailq_runtime.stores.cassandra import CassandraStore

# Ids as MessageId.generate / MailboxId.generate make them: 16 hex digits of microseconds, 16 of a counter.
_T0 = 1_700_000_000_000_000
_MESSAGE_SEQUENCE = 0x3C6EF372FE94F82A
_MAILBOX_SEQUENCE = 0x1B873593A54FF53A
_NAMES = ("INBOX", "Sent", "Drafts", "Trash", "Archive")
# Per message i: f picks the flags (f >= 80: unseen), d the projection's defect. Both are bijections of
# i modulo 100 and 10000, so the shares are exact; the same formulas run in SQL and in numpy.
_FLAGS_MULTIPLIER = 2_654_435_761
_DEFECT_MULTIPLIER = 40_503
_FLAGS = ((60, "\\Seen"), (72, "\\Flagged \\Seen"), (80, "\\Answered \\Seen"), (95, ""), (100, "\\Flagged"))
_UNSEEN_FROM = 80
_ORPHAN, _MISSING, _OUTDATED = (0, 5), (5, 10), (10, 30)  # ranges of d out of 10000
# Per mailbox j, c = (j * _DRIFT_MULTIPLIER) % 1000 picks the counters' defect.
_DRIFT_MULTIPLIER = 7919
_COUNT_DRIFT, _UNSEEN_DRIFT, _NO_COUNTERS = (0, 20), (20, 30), (30, 31)  # ranges of c out of 1000


def message_id_sql(i: str) -> str:
    return f"printf('%016x%016x', {_T0} + ({i}) * 7, {_MESSAGE_SEQUENCE} + ({i}))"


def mailbox_id(j: int) -> str:
    return f"{_T0 - 10**12 + j * 1000:016x}{_MAILBOX_SEQUENCE + j:016x}"


def mailbox_id_sql(j: str) -> str:
    return f"printf('%016x%016x', {_T0 - 10**12} + ({j}) * 1000, {_MAILBOX_SEQUENCE} + ({j}))"


def flags_sql(f: str) -> str:
    cases = " ".join(f"WHEN {f} < {bound} THEN '{flags}'" for bound, flags in _FLAGS[:-1])
    return f"CASE {cases} ELSE '{_FLAGS[-1][1]}' END"


def message_id(i: int) -> str:
    return f"{_T0 + i * 7:016x}{_MESSAGE_SEQUENCE + i:016x}"


def flags(f: int) -> str:
    return next(value for bound, value in _FLAGS if f < bound)


@dataclass(frozen=True)
class Dataset:
    messages: int
    mailboxes: list[str]
    drifting: frozenset[str]  # mailbox ids whose counters are wrong or missing
    inconsistencies: dict[str, int]  # projection entries by kind
    rows: dict[str, int]  # per table
    seconds: dict[str, float]  # generation (embedded) or load (Cassandra), per table


def generate(deployment: Deployment, messages: int, mailboxes: int) -> Dataset:
    if deployment.distributed:
        return _in_cassandra(deployment.cassandra, messages, mailboxes)
    return _in_sqlite(deployment.data_dir, messages, mailboxes)


def _mailbox_ids(mailboxes: int) -> list[str]:
    return [mailbox_id(j) for j in range(mailboxes)]


def _counters(
    count: Sequence[int], unseen: Sequence[int], mailboxes: int
) -> tuple[list[tuple[str, int, int]], frozenset[str]]:
    """The counters rows (mailbox id, count, unseen) from the true counts with the generated drift, and the
    mailboxes that drift (a wrong row or none)."""
    rows, drifting = [], set()
    for j in range(mailboxes):
        c = (j * _DRIFT_MULTIPLIER) % 1000
        observed = (int(count[j]), int(unseen[j]))
        if _COUNT_DRIFT[0] <= c < _COUNT_DRIFT[1]:
            observed = (observed[0] + 1 + j % 3, observed[1])
        elif _UNSEEN_DRIFT[0] <= c < _UNSEEN_DRIFT[1]:
            observed = (observed[0], observed[1] - 1 if observed[1] else observed[1] + 1)
        elif _NO_COUNTERS[0] <= c < _NO_COUNTERS[1]:
            drifting.add(mailbox_id(j))
            continue
        if observed != (count[j], unseen[j]):
            drifting.add(mailbox_id(j))
        rows.append((mailbox_id(j), *observed))
    return rows, frozenset(drifting)


def _in_sqlite(path: Path, messages: int, mailboxes: int) -> Dataset:
    """The big tables by INSERT ... SELECT inside SQLite (one transaction each, in primary key order); the
    100K counters from numpy, which computes the true counts with the same formulas."""
    used = max(1, mailboxes - mailboxes // 1000)  # the last 0.1% stay empty
    per_mailbox = math.ceil(messages / used)
    seconds: dict[str, float] = {}
    f, d = f"(i * {_FLAGS_MULTIPLIER}) % 100", f"(i * {_DEFECT_MULTIPLIER}) % 10000"
    print(f"generating {messages:,} messages in {mailboxes:,} mailboxes ...")
    with bulk_connection(path) as db:
        # The secondary index is built once at the end, by a sort, rather than by 10M random inserts.
        db.execute("DROP INDEX imap_uid_mailbox")
        seconds["mailboxes"] = insert(
            db,
            "mailboxes",
            "INSERT INTO mailboxes (mailbox_id, user, name, next_uid) "
            f"SELECT {mailbox_id_sql('i')}, printf('user%07d@example.com', i / {len(_NAMES)}), "
            f"CASE i % {len(_NAMES)} {' '.join(f'WHEN {k} THEN {n!r}' for k, n in enumerate(_NAMES))} END, "
            f"{per_mailbox + 1} FROM {SEQUENCE}",
            n=mailboxes,
        )
        seconds["imap_uid_table"] = insert(
            db,
            "imap_uid_table",
            "INSERT INTO imap_uid_table (message_id, mailbox_id, uid, flags) "
            f"SELECT {message_id_sql('i')}, {mailbox_id_sql(f'i % {used}')}, i / {used} + 1, {flags_sql(f)} "
            f"FROM {SEQUENCE} WHERE {d} >= {_ORPHAN[1]}",
            n=messages,
        )
        # Mailbox by mailbox (k = j * per_mailbox + uid - 1), as Cassandra clusters the projection.
        outdated = f"{d} >= {_OUTDATED[0]} AND {d} < {_OUTDATED[1]}"
        seconds["message_id_table"] = insert(
            db,
            "message_id_table",
            "INSERT INTO message_id_table (mailbox_id, uid, message_id, flags) "
            f"SELECT {mailbox_id_sql(f'i % {used}')}, i / {used} + 1, {message_id_sql('i')}, "
            f"CASE WHEN {outdated} THEN CASE WHEN {f} >= {_UNSEEN_FROM} THEN '{SEEN}' ELSE '' END "
            f"ELSE {flags_sql(f)} END "
            f"FROM (SELECT (i % {per_mailbox}) * {used} + i / {per_mailbox} AS i FROM {SEQUENCE}) "
            f"WHERE i < {messages} AND NOT ({d} >= {_MISSING[0]} AND {d} < {_MISSING[1]})",
            n=used * per_mailbox,
        )
        start = time.perf_counter()
        db.executescript(files("mailq_runtime.stores.embedded").joinpath("schema.sql").read_text())
        seconds["imap_uid_mailbox index"] = time.perf_counter() - start
        print(f"  {'imap_uid_mailbox':<18} index built in {seconds['imap_uid_mailbox index']:6.1f} s")

        # The true counters, with the same formulas.
        i = np.arange(messages, dtype=np.int64)
        defect = (i * _DEFECT_MULTIPLIER) % 10000
        in_truth = defect >= _ORPHAN[1]
        unseen = ((i * _FLAGS_MULTIPLIER) % 100) >= _UNSEEN_FROM
        count = np.bincount(i[in_truth] % used, minlength=mailboxes)
        unseen_count = np.bincount(i[in_truth & unseen] % used, minlength=mailboxes)
        inconsistencies = {
            "orphan_projection_entry": int((defect < _ORPHAN[1]).sum()),
            "missing_projection_entry": int(((defect >= _MISSING[0]) & (defect < _MISSING[1])).sum()),
            "outdated_projection_entry": int(((defect >= _OUTDATED[0]) & (defect < _OUTDATED[1])).sum()),
        }
        del i, defect, in_truth, unseen
        rows, drifting = _counters(count, unseen_count, mailboxes)
        start = time.perf_counter()
        db.execute("BEGIN")
        db.executemany("INSERT INTO mailbox_counters (mailbox_id, count, unseen) VALUES (?, ?, ?)", rows)
        db.execute("COMMIT")
        seconds["mailbox_counters"] = time.perf_counter() - start
        print(f"  {'mailbox_counters':<18} {len(rows):>12,} rows in {seconds['mailbox_counters']:6.1f} s")
    print(f"generated in {sum(seconds.values()):.1f} s")
    tables = {
        "mailboxes": mailboxes,
        "imap_uid_table": messages - inconsistencies["orphan_projection_entry"],
        "message_id_table": messages - inconsistencies["missing_projection_entry"],
        "mailbox_counters": len(rows),
    }
    return Dataset(messages, _mailbox_ids(mailboxes), drifting, inconsistencies, tables, seconds)


def _in_cassandra(store: CassandraStore, messages: int, mailboxes: int) -> Dataset:
    used = max(1, mailboxes - mailboxes // 1000)  # the last 0.1% stay empty
    per_mailbox = math.ceil(messages / used)
    truth, projection = [], []
    count, unseen = [0] * mailboxes, [0] * mailboxes
    kinds = dict.fromkeys(
        ("orphan_projection_entry", "missing_projection_entry", "outdated_projection_entry"), 0
    )
    for i in range(messages):
        f, d = (i * _FLAGS_MULTIPLIER) % 100, (i * _DEFECT_MULTIPLIER) % 10000
        j, uid, own = i % used, i // used + 1, flags(f)
        if d >= _ORPHAN[1]:
            truth.append((message_id(i), mailbox_id(j), uid, own))
            count[j] += 1
            unseen[j] += f >= _UNSEEN_FROM
        else:
            kinds["orphan_projection_entry"] += 1
        if _MISSING[0] <= d < _MISSING[1]:
            kinds["missing_projection_entry"] += 1
            continue
        if _OUTDATED[0] <= d < _OUTDATED[1]:
            kinds["outdated_projection_entry"] += 1
            own = SEEN if f >= _UNSEEN_FROM else ""
        projection.append((mailbox_id(j), uid, message_id(i), own))
    counters, drifting = _counters(count, unseen, mailboxes)
    print(f"loading {messages:,} messages in {mailboxes:,} mailboxes ...")
    seconds = {
        "mailboxes": load(
            store,
            "mailboxes",
            "INSERT INTO mailboxes (mailbox_id, user, name, next_uid) VALUES (?, ?, ?, ?)",
            (
                (
                    mailbox_id(j),
                    f"user{j // len(_NAMES):07d}@example.com",
                    _NAMES[j % len(_NAMES)],
                    per_mailbox + 1,
                )
                for j in range(mailboxes)
            ),
        ),
        "imap_uid_table": load(
            store,
            "imap_uid_table",
            "INSERT INTO imap_uid_table (message_id, mailbox_id, uid, flags) VALUES (?, ?, ?, ?)",
            truth,
        ),
        "message_id_table": load(
            store,
            "message_id_table",
            "INSERT INTO message_id_table (mailbox_id, uid, message_id, flags) VALUES (?, ?, ?, ?)",
            projection,
        ),
        "mailbox_counters": load(
            store,
            "mailbox_counters",
            # One writer's share a mailbox (stores/cassandra/tallies.py).
            "INSERT INTO mailbox_counters (mailbox_id, writer, count, unseen) VALUES (?, 'data', ?, ?)",
            ((mailbox, count, unseen) for mailbox, count, unseen in counters),
        ),
    }
    rows = {
        "mailboxes": mailboxes,
        "imap_uid_table": len(truth),
        "message_id_table": len(projection),
        "mailbox_counters": len(counters),
    }
    return Dataset(messages, _mailbox_ids(mailboxes), drifting, kinds, rows, seconds)
