"""What the Spark maintenance benchmarks (gc.py, counters.py, gc_churn.py) share: a fresh embedded data dir
next to the repository, bulk generation inside SQLite, a concurrent loader of Cassandra tables, Spark
sessions at a given master (local or the harness's cluster), and timing.

Not a benchmark itself; imported by the scripts of this directory (run as `.venv/bin/python benchmarks/X.py`,
which puts this directory on sys.path).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import secrets
import shutil
import sqlite3
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import closing, contextmanager
from dataclasses import dataclass, field
from importlib.resources import files
from pathlib import Path
from typing import TypeVar

import numpy as np

os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
# The interpreter of every Python worker (the data source's readers) comes from this variable when the
# session starts: it must be this one, where mailq and pyarrow are installed.
os.environ["PYSPARK_PYTHON"] = sys.executable

from pyspark.sql import SparkSession  # noqa: E402
from quick import parse_args  # noqa: E402

from assets.spark.bloom import filter_bits  # noqa: E402
from mailq_runtime.stores.cassandra import CassandraStore  # noqa: E402
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


# Requests in flight while loading, and rows a request: unlogged batches of rows of any partitions, which a
# single node applies locally, cost the driver and the server one request for many rows (4 KiB or so, under
# Cassandra's batch size warning). Measured here under load: 1 300 rows/s one row a request.
_LOAD_CONCURRENCY = 64
_LOAD_BATCH = 32
_LOAD_CHUNK = 20_000
_LOAD_ATTEMPTS = 5


def load(
    store: CassandraStore, label: str, cql: str, rows: Iterable[Sequence], batch: int = _LOAD_BATCH
) -> float:
    """Insert `rows` with one prepared statement, concurrently and `batch` rows a request (1 for counter
    updates, which a logged or unlogged batch refuses), in chunks so that the parameters are made as they
    go; print and return the seconds. A request that times out is sent again (a few times) unless it
    updates counters, where a timed-out increment may have been applied."""
    from cassandra import OperationTimedOut, WriteTimeout
    from cassandra.concurrent import execute_concurrent
    from cassandra.query import BatchStatement, BatchType

    timeouts = (OperationTimedOut, WriteTimeout)

    statement = store.statement(cql)

    def requests(chunk: list[Sequence]) -> Iterator[tuple]:
        for first in range(0, len(chunk), batch):
            if batch == 1:
                yield statement, chunk[first]
                continue
            request = BatchStatement(BatchType.UNLOGGED)
            for parameters in chunk[first : first + batch]:
                request.add(statement, parameters)
            yield request, ()

    def send(pending: list[tuple]) -> None:
        # A node busy flushing or compacting times a write out now and then; the inserts are idempotent,
        # so the requests that timed out are sent again, a few times.
        for attempt in range(_LOAD_ATTEMPTS):
            results = execute_concurrent(
                store.session, pending, concurrency=_LOAD_CONCURRENCY, raise_on_first_error=False
            )
            failed = [(sent, error) for sent, (ok, error) in zip(pending, results, strict=True) if not ok]
            if not failed:
                return
            retry = batch > 1 and all(isinstance(error, timeouts) for _, error in failed)
            if attempt == _LOAD_ATTEMPTS - 1 or not retry:
                raise failed[0][1]
            pending = [request for request, _ in failed]
            time.sleep(1)

    start, count, chunk = time.perf_counter(), 0, []
    for row in (*rows, None):
        if row is not None:
            chunk.append(row)
        if chunk and (row is None or len(chunk) == _LOAD_CHUNK):
            send(list(requests(chunk)))
            count += len(chunk)
            chunk = []
    seconds = time.perf_counter() - start
    print(f"  {label:<18} {count:>12,} rows in {seconds:6.1f} s ({count / max(seconds, 1e-9):,.0f} rows/s)")
    return seconds


@contextmanager
def bulk_connection(path: Path) -> Iterator[sqlite3.Connection]:
    """A connection to a new store at `path` with the runtime's schema, set up for bulk loading: no journal
    (nothing to roll back into: a failed generation is thrown away), no syncs, a 4 GiB page cache so the
    indexes being built stay in memory. The database is left in WAL mode, as the runtime keeps it."""
    with closing(sqlite3.connect(path / DATABASE_FILE, isolation_level=None)) as connection:
        connection.executescript(files("mailq_runtime.stores.embedded").joinpath("schema.sql").read_text())
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


# A master `cluster[N]`: the harness's standalone cluster ($MAILQ_SPARK_MASTER), N cores of it (an executor
# of one core on each of N workers).
_CLUSTER = re.compile(r"cluster\[(\d+)\]")


def master_cores(master: str) -> int:
    """The cores a master gives the tasks: local[N] and cluster[N] name them."""
    found = re.fullmatch(r"(?:local|cluster)\[(\d+)\]", master)
    if found is None:
        raise SystemExit(f"benchmark: unknown master {master!r}: local[N] or cluster[N]")
    return int(found.group(1))


def spark_session(master: str, driver_memory: str) -> SparkSession:
    """A session at `master` with the pipeline's own settings (resources/spark.py, environment overrides
    left out so that runs are comparable). The driver memory only takes effect in the first session of the
    process, which starts the JVM; later sessions share it."""
    builder = SparkSession.builder
    for key, value in spark_config({}).items():
        builder = builder.config(key, value)
    cluster = _CLUSTER.fullmatch(master)
    if cluster is None:
        builder = builder.master(master)
    else:
        url = os.environ.get("MAILQ_SPARK_MASTER")
        if not url:
            raise SystemExit(
                f"benchmark: {master} needs $MAILQ_SPARK_MASTER: "
                'eval "$(.venv/bin/python -m mailq_servers env)" first'
            )
        builder = (
            builder.master(url)
            .config("spark.cores.max", cluster.group(1))
            .config("spark.executor.cores", "1")
            # The first job starts once every executor asked for has registered, so it has all its cores.
            .config("spark.scheduler.minRegisteredResourcesRatio", "1.0")
            .config("spark.scheduler.maxRegisteredResourcesWaitingTime", "120s")
            # The executors' Python workers import this checkout's readers, not the installed copy.
            .config("spark.executorEnv.PYTHONPATH", str(REPOSITORY))
        )
    spark = (
        builder.appName("mailq-benchmark")
        .config("spark.driver.memory", driver_memory)
        .config("spark.ui.showConsoleProgress", "false")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    return spark


# The projections at scale: on this many cores.
PROJECTED_CORES = (8, 32, 128)


def arguments(
    parser: argparse.ArgumentParser, defaults: dict[str, tuple[object, object]], quick: dict[str, object]
) -> argparse.Namespace:
    """Parse the options of a Spark maintenance benchmark: `parser`'s own and those they all take (--url,
    --runs, --masters, --driver-memory, --quiet-wait, --quick, which takes `quick`'s sizes on one local
    core). An option left out takes its `defaults` value (embedded, distributed) for the deployment of
    --url; `masters` becomes the checked list, and `verify` the master whose results are checked (local[2]
    when measured, else the last)."""
    parser.add_argument("--url", help="a deployment that does not exist yet (default: a fresh embedded one)")
    parser.add_argument("--runs", type=int, default=3, help="timed runs of each method per master (median)")
    parser.add_argument(
        "--masters", help="local[N] or cluster[N] (the harness's Spark cluster), comma-separated"
    )
    parser.add_argument("--driver-memory", default="4g")
    parser.add_argument(
        "--quiet-wait",
        type=float,
        help="seconds a timed run may wait for the rest of the machine to go quiet (0: never wait)",
    )
    quick_run = {"runs": 1, "masters": "local[1]", "driver_memory": "1g", "quiet_wait": 0.0}
    args = parse_args(parser, {**quick_run, **quick})
    distributed = args.url is not None and args.url.startswith("cassandra://")
    for name, values in defaults.items():
        if getattr(args, name) is None:
            setattr(args, name, values[distributed])
    args.masters = [master.strip() for master in args.masters.split(",") if master.strip()]
    for master in args.masters:
        master_cores(master)
    args.verify = "local[2]" if "local[2]" in args.masters else args.masters[-1]
    return args


def projection(per_master: dict[str, dict], rates: dict[str, float], rows: int) -> dict:
    """`rows` read at scale from the rate per core of the cluster's widest measure (else the widest local
    one: executors apart from the driver, as on a real cluster), assuming linear scaling."""
    basis = max(per_master, key=lambda m: (m.startswith("cluster"), per_master[m]["cores"]))
    rate = rates[basis]
    return {
        "basis": basis,
        "rows": rows,
        "rows_per_s_per_core": rate,
        "core_seconds": rows / rate,
        "hours_on_cores": {str(n): rows / rate / n / 3600 for n in PROJECTED_CORES},
    }


def print_outcome(figures: dict) -> None:
    """The end of a maintenance benchmark's report: the checks, the ratios, the targets, then all the
    figures as one JSON object, the last line."""
    print(f"verification: {figures['verification']}")
    for name, value in figures["ratios"].items():
        print(f"{name}: {value:.2f}")
    for name, met in figures["targets"].items():
        print(f"target {name}: {'met' if met else 'MISSED'}")
    print(json.dumps(rounded(figures)))


def print_projection(figures: dict) -> None:
    print(
        f"projection ({figures['basis']}): {figures['rows']:,} rows at "
        f"{figures['rows_per_s_per_core']:,.0f} rows/s/core = {figures['core_seconds']:,.0f} core-seconds: "
        + ", ".join(f"{h:.2f} h on {n} cores" for n, h in figures["hours_on_cores"].items())
    )


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


_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_FMIX1 = np.uint64(0xFF51AFD7ED558CCD)
_FMIX2 = np.uint64(0xC4CEB9FE1A85EC53)
_LOW32 = np.uint64(0xFFFFFFFF)


@dataclass
class NumpyBloom:
    """Guava's/Spark's Bloom filter (k positions by double hashing h1 + i*h2 of one 64-bit hash, m bits)
    over numpy arrays, fed and probed a batch at a time: the single-process James of the GC benchmarks. One
    byte per bit: 8x the memory of packed bits (96 MB for 10M items at 1%), but setting 70M positions by
    fancy indexing took 1.8 s against 6.8 s for np.bitwise_or.at on packed bytes."""

    expected: int
    fpp: float
    salt: np.uint64 = field(default_factory=lambda: np.uint64(secrets.randbits(64)))

    def __post_init__(self) -> None:
        self.bits = filter_bits(self.expected, self.fpp)
        self.hashes = max(1, round(self.bits / self.expected * math.log(2)))
        self.array = np.zeros(self.bits, np.bool_)

    def hash_rows(self, ids: np.ndarray) -> np.ndarray:
        """A salted 64-bit hash of each row of an (n, width) byte matrix: the row's 8-byte words folded in
        by multiply-xorshift, then murmur3's finaliser. Vectorised over the rows: a few numpy passes per
        word, where a per-id Python hash costs a call each."""
        rows, width = ids.shape
        words = -(-width // 8)
        padded = np.zeros((rows, words * 8), np.uint8)
        padded[:, :width] = ids
        view = padded.view("<u8")
        h = np.full(rows, self.salt, np.uint64)
        for j in range(words):
            h ^= view[:, j]
            h *= _GOLDEN
            h ^= h >> np.uint64(29)
        h ^= h >> np.uint64(33)
        h *= _FMIX1
        h ^= h >> np.uint64(33)
        h *= _FMIX2
        h ^= h >> np.uint64(33)
        return h

    def positions(self, hashes: np.ndarray) -> Iterator[np.ndarray]:
        low, high = hashes & _LOW32, hashes >> np.uint64(32)
        for i in range(1, self.hashes + 1):
            yield (low + np.uint64(i) * high) % np.uint64(self.bits)

    def put(self, hashes: np.ndarray) -> None:
        for position in self.positions(hashes):
            self.array[position] = True

    def might_contain(self, hashes: np.ndarray) -> np.ndarray:
        present = np.ones(len(hashes), np.bool_)
        for position in self.positions(hashes):
            present &= self.array[position]
        return present
