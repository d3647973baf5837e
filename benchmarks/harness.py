"""What the Spark maintenance benchmarks (gc.py, counters.py) share: a fresh embedded data dir next to the
repository, bulk generation inside SQLite, Spark sessions at a given master, and timing.

Not a benchmark itself; imported by the scripts of this directory (run as `.venv/bin/python benchmarks/X.py`,
which puts this directory on sys.path).
"""

from __future__ import annotations

import os
import shutil
import sqlite3
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import closing, contextmanager
from dataclasses import dataclass
from importlib.resources import files
from pathlib import Path
from typing import TypeVar

os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
# The interpreter of every Python worker (the data source's readers) comes from this variable when the
# session starts: it must be this one, where mailq and pyarrow are installed.
os.environ["PYSPARK_PYTHON"] = sys.executable

from pyspark.sql import SparkSession  # noqa: E402

from mailq_runtime.stores.embedded import DATABASE_FILE  # noqa: E402
from resources.spark import spark_config  # noqa: E402

REPOSITORY = Path(__file__).resolve().parent.parent
T = TypeVar("T")

# A numbers table of 4096 rows: `SEQUENCE` cross-joins it with itself, which SQLite walks as a nested loop
# in C, about 30x cheaper a row than a recursive CTE (measured: 1M rows in 0.02 s against 0.6 s).
_DIGITS = 4096
SEQUENCE = (
    f"(SELECT i FROM (SELECT (a.k * {_DIGITS} + b.k) * {_DIGITS} + c.k AS i FROM temp.k AS a, temp.k AS b, "
    f"temp.k AS c WHERE a.k <= :n / {_DIGITS * _DIGITS} AND a.k * {_DIGITS} + b.k <= :n / {_DIGITS}) "
    "WHERE i < :n)"
)
"""A subquery of the rows (i) for i in 0 .. n - 1, in order; bind `n`."""


@contextmanager
def data_dir(label: str) -> Iterator[Path]:
    """A fresh embedded data dir inside the repository (same disk as a real one; .gitignore'd), removed at
    the end whatever happens."""
    path = Path(tempfile.mkdtemp(prefix=f".bench-{label}-", dir=REPOSITORY))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@contextmanager
def bulk_connection(path: Path) -> Iterator[sqlite3.Connection]:
    """A connection to a new store at `path` with the runtime's schema, set up for bulk loading: no journal
    (nothing to roll back into: a failed generation is thrown away), no syncs, a 4 GiB page cache so the
    indexes being built stay in memory. The database is left in WAL mode, as the runtime keeps it."""
    with closing(sqlite3.connect(path / DATABASE_FILE, isolation_level=None)) as connection:
        connection.executescript(files("mailq_runtime.stores").joinpath("embedded_schema.sql").read_text())
        connection.execute("PRAGMA journal_mode=OFF")
        connection.execute("PRAGMA synchronous=OFF")
        connection.execute("PRAGMA cache_size=-4000000")
        connection.execute("PRAGMA temp_store=MEMORY")
        connection.execute("CREATE TEMP TABLE k (k INTEGER PRIMARY KEY)")
        connection.executemany("INSERT INTO temp.k VALUES (?)", ((i,) for i in range(_DIGITS)))
        yield connection
        connection.execute("PRAGMA journal_mode=WAL")


def insert(connection: sqlite3.Connection, label: str, sql: str, **parameters: int) -> float:
    """Run one INSERT ... SELECT in its own transaction; print and return its seconds."""
    start = time.perf_counter()
    connection.execute("BEGIN")
    rows = connection.execute(sql, parameters).rowcount
    connection.execute("COMMIT")
    seconds = time.perf_counter() - start
    print(f"  {label:<18} {rows:>12,} rows in {seconds:6.1f} s ({rows / max(seconds, 1e-9):,.0f} rows/s)")
    return seconds


def spark_session(master: str, driver_memory: str) -> SparkSession:
    """A session at `master` with the pipeline's own settings (resources/spark.py, environment overrides
    left out so that runs are comparable). The driver memory only takes effect in the first session of the
    process, which starts the JVM; later sessions share it."""
    builder = SparkSession.builder
    for key, value in spark_config({}).items():
        builder = builder.config(key, value)
    spark = (
        builder.master(master)
        .appName("mailq-benchmark")
        .config("spark.driver.memory", driver_memory)
        .config("spark.ui.showConsoleProgress", "false")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def timed(action: Callable[[], T]) -> tuple[float, T]:
    start = time.perf_counter()
    result = action()
    return time.perf_counter() - start, result


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def ratio(slow: float, fast: float) -> float:
    """How many times faster `fast` is than `slow` (> 1: faster)."""
    return slow / fast if fast > 0 else float("inf")


def rounded(value: object) -> object:
    """JSON-friendly figures: floats to 3 decimals, containers recursively."""
    if isinstance(value, float):
        return round(value, 3)
    if isinstance(value, dict):
        return {key: rounded(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [rounded(item) for item in value]
    return value


def load_average() -> float:
    """The 1-minute load average: on a shared 2-core machine, what else ran during a measure."""
    return os.getloadavg()[0]


_TICK = os.sysconf("SC_CLK_TCK")


def tree_cpu_seconds() -> float:
    """CPU seconds used so far by this process and all its descendants (the Spark JVM and its Python
    workers; reaped children count through their parent's cutime/cstime), from /proc. Unlike wall time,
    hardly inflated by other work on the machine: the figure to compare methods by when the cores are
    shared."""
    stats: dict[int, tuple[int, int]] = {}  # pid -> (parent, ticks)
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat", "rb") as stat:
                fields = stat.read().rsplit(b")", 1)[1].split()
        except OSError:  # gone meanwhile
            continue
        # After the command: state, ppid, ..., utime (11), stime, cutime, cstime (14), counted from 0.
        stats[int(entry.name)] = (int(fields[1]), sum(int(value) for value in fields[11:15]))
    children: dict[int, list[int]] = {}
    for pid, (parent, _) in stats.items():
        children.setdefault(parent, []).append(pid)
    total, pending = 0, [os.getpid()]
    while pending:
        pid = pending.pop()
        total += stats.get(pid, (0, 0))[1]
        pending.extend(children.get(pid, []))
    return total / _TICK


def _busy_seconds() -> float:
    """CPU seconds the whole machine has been busy (all cores), from the first line of /proc/stat."""
    with open("/proc/stat", "rb") as stat:
        fields = [int(value) for value in stat.readline().split()[1:]]
    # user nice system idle iowait irq softirq steal ...: all but idle and iowait
    return (sum(fields[:8]) - fields[3] - fields[4]) / _TICK


@dataclass(frozen=True)
class Measure:
    wall: float  # seconds
    cpu: float  # CPU seconds of this process tree (the method's own work)
    others: float  # cores the rest of the machine kept busy meanwhile, on average


def describe(seen: Measure) -> str:
    return f"{seen.wall:.1f} s (cpu {seen.cpu:.1f} s, others {seen.others:.2f} cores)"


def measure(action: Callable[[], T]) -> tuple[Measure, T]:
    cpu, busy, start = tree_cpu_seconds(), _busy_seconds(), time.perf_counter()
    result = action()
    wall = time.perf_counter() - start
    cpu = tree_cpu_seconds() - cpu
    others = max(0.0, _busy_seconds() - busy - cpu) / wall if wall > 0 else 0.0
    return Measure(wall, cpu, others), result


def wait_for_quiet(timeout: float, max_others: float = 0.3, window: float = 2.0) -> float:
    """Wait (up to `timeout` seconds) until the rest of the machine uses less than `max_others` cores over
    a `window`, so that a timed run has the cores it asks for; returns the cores last seen busy."""
    deadline = time.monotonic() + timeout
    while True:
        seen, _ = measure(lambda: time.sleep(window))
        if seen.others < max_others or time.monotonic() >= deadline:
            return seen.others


class Runs:
    """The timed runs of one method: each waits for a quiet machine first (up to `quiet_wait` seconds),
    then records wall time, its own CPU time and what the rest of the machine used meanwhile."""

    def __init__(self, quiet_wait: float) -> None:
        self.quiet_wait = quiet_wait
        self.measures: list[Measure] = []

    def run(self, action: Callable[[], T]) -> T:
        if self.quiet_wait > 0:
            wait_for_quiet(self.quiet_wait)
        seen, result = measure(action)
        self.measures.append(seen)
        return result

    @property
    def last(self) -> Measure:
        return self.measures[-1]

    def summary(self, prefix: str) -> dict[str, object]:
        """`<prefix>_s`: the median wall time; `_cpu_s`: the median CPU seconds; `_cores`: the median
        cores the method kept busy (CPU / wall); `_others_cores`: the other work seen during each run."""
        walls = [m.wall for m in self.measures]
        return {
            f"{prefix}_s": median(walls),
            f"{prefix}_runs_s": walls,
            f"{prefix}_cpu_s": median([m.cpu for m in self.measures]),
            f"{prefix}_cores": median([m.cpu / m.wall for m in self.measures if m.wall > 0]),
            f"{prefix}_others_cores": [m.others for m in self.measures],
        }
