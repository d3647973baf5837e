"""The backend calls that one enqueue and one dequeue + done() make, by kind, and their timings: what
queue_throughput.py breaks mailq's time and the floor's down by, and those breakdowns as tables.

Not a benchmark itself. A kind is the runtime's call, `<backend>.<protocol method>` (the view, the blob
tables, the content, the broker, the delayed mails: see `TIMED` in queue_turns.py); the floor
(queue_floor.py) files its bare calls under the kind they stand for, so that the two breakdowns line up.
The kinds group by the backend they go to (the metadata store, the content, the broker), the rest of a
mail's time being the caller's own work.
"""

from __future__ import annotations

ENQUEUE = (
    "blob_tables.current",
    "content.put",
    "blob_tables.add_blobs",
    "blob_tables.add_references",
    "view.insert",
    "broker.publish",
)
DEQUEUE_DONE = (
    "broker.receive",
    "view.is_live",
    "content.get",
    "view.mark_done",
    "blob_tables.current",
    "blob_tables.add_deletions",
    "blob_tables.remove_references",
    "broker.ack",
)


class Timings:
    """Seconds and calls per call kind, of one thread's calls (the single-thread phases)."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self.calls: dict[str, int] = {}

    def add(self, kind: str, seconds: float) -> None:
        self.seconds[kind] = self.seconds.get(kind, 0.0) + seconds
        self.calls[kind] = self.calls.get(kind, 0) + 1


# The backend each kind of call goes to, by the kind's first part.
BACKENDS = {
    "view": "metadata",
    "blob_tables": "metadata",
    "delayed_mails": "metadata",
    "content": "content",
    "broker": "broker",
}


def grouped(table: dict[str, list[float]], names: dict[str, str], own: str) -> dict[str, float]:
    """Milliseconds per mail by backend, from a breakdown's table (kind: [ms, calls], "outside these
    calls", "total"): `names` names each backend ("metadata": "Cassandra" ...), `own` the time outside
    every call."""
    groups = {name: 0.0 for name in names.values()}
    for kind, (spent, _) in table.items():
        if kind in ("outside these calls", "total"):
            continue
        groups[names[BACKENDS[kind.split(".")[0]]]] += spent
    groups[own] = table["outside these calls"][0]
    groups["total"] = table["total"][0]
    return {name: round(spent, 3) for name, spent in groups.items()}


def breakdown(timings: Timings, mails: int, wall: float, kinds: tuple[str, ...]) -> dict[str, list[float]]:
    """Milliseconds and calls per mail by call kind, the named kinds first, and what the calls leave."""
    ordered = [kind for kind in kinds if kind in timings.seconds]
    ordered += sorted(set(timings.seconds) - set(ordered), key=lambda kind: -timings.seconds[kind])
    table = {
        kind: [round(timings.seconds[kind] * 1e3 / mails, 3), round(timings.calls[kind] / mails, 2)]
        for kind in ordered
    }
    table["outside these calls"] = [round((wall - sum(timings.seconds.values())) * 1e3 / mails, 3), 0]
    table["total"] = [round(wall * 1e3 / mails, 3), 0]
    return table


def print_breakdown(name: str, tables: dict[str, dict[str, list[float]]]) -> None:
    columns = list(tables)
    print(f"  {name:<32}" + "".join(f"{column + ' ms (calls)':>20}" for column in columns))
    for kind in dict.fromkeys(kind for table in tables.values() for kind in table):
        cells = ""
        for column in columns:
            spent, calls = tables[column].get(kind, (None, 0))
            cell = "" if spent is None else f"{spent:8.2f} " + (f"{f'({calls:g})':>7}" if calls else " " * 7)
            cells += f"{cell:>20}"
        print(f"    {kind:<30}{cells}")
