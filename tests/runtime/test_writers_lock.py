"""The embedded store's writers take turns across processes on its writers' lock
(stores/embedded/writers.py): a writer waiting for another process's transaction starts as that one ends,
not at SQLite's next poll (up to 100 ms later), and every way a transaction ends lets the next writer in."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from mailq_runtime.stores.embedded import EmbeddedStore

HOLD_SECONDS = 0.54  # SQLite's busy handler polls every 100 ms by then: at 0.528 s, then 0.628 s
TURNS = 3
# A process that holds a write transaction HOLD_SECONDS, TURNS times, printing when each one ended.
_HOLDER = """
import sys, time
from pathlib import Path
from mailq_runtime.stores.embedded import EmbeddedStore
store = EmbeddedStore(Path(sys.argv[1]), create=False)
signals, hold = Path(sys.argv[2]), float(sys.argv[3])
for turn in range(int(sys.argv[4])):
    with store.transaction() as db:
        db.execute("INSERT INTO rows VALUES (?)", (f"holder {turn}",))
        (signals / str(turn)).touch()
        time.sleep(hold)
    print(time.monotonic(), flush=True)
    time.sleep(0.3)  # the other writer's turn
store.close()
"""


def _store(path: Path) -> EmbeddedStore:
    store = EmbeddedStore(path)
    with store.transaction() as db:
        db.execute("CREATE TABLE IF NOT EXISTS rows (name TEXT)")
    return store


def _wait_for(path: Path) -> None:
    deadline = time.monotonic() + 30
    while not path.exists():
        assert time.monotonic() < deadline, f"no {path.name} from the holder"
        time.sleep(0.005)


@pytest.mark.alone  # times another process's wake-up: measured with the machine to itself
def test_a_writer_waiting_for_another_process_starts_as_its_transaction_ends(tmp_path):
    store = _store(tmp_path / "data")
    signals = tmp_path / "signals"
    signals.mkdir()
    holder = subprocess.Popen(
        [sys.executable, "-c", _HOLDER, str(tmp_path / "data"), str(signals), str(HOLD_SECONDS), str(TURNS)],
        stdout=subprocess.PIPE,
        text=True,
        env={"PYTHONPATH": ":".join(sys.path)},
    )
    try:
        lags, waits = [], []
        for turn in range(TURNS):
            _wait_for(signals / str(turn))
            asked = time.monotonic()
            with store.transaction() as db:
                entered = time.monotonic()
                db.execute("INSERT INTO rows VALUES (?)", (f"waiter {turn}",))
            ended = float(holder.stdout.readline())
            lags.append(entered - ended)
            waits.append(entered - asked)
        assert holder.wait(30) == 0
    finally:
        holder.kill()
        store.close()
    assert min(waits) > HOLD_SECONDS / 2  # each waited for the holder's transaction
    assert max(lags) < 0.03, lags  # and began as it ended, not at the next poll


@pytest.mark.parametrize("ending", ["commit", "rollback"])
def test_every_end_of_a_transaction_lets_another_writer_in(tmp_path, ending):
    first, second = _store(tmp_path / "data"), EmbeddedStore(tmp_path / "data", create=False)
    try:
        with pytest.raises(ValueError) if ending == "rollback" else _nothing():
            with first.transaction() as db:
                db.execute("INSERT INTO rows VALUES ('first')")
                if ending == "rollback":
                    raise ValueError("undone")
        # A second store in this process has a lock of its own, as another process would.
        written = threading.Event()

        def write() -> None:
            with second.transaction() as db:
                db.execute("INSERT INTO rows VALUES ('second')")
            written.set()

        threading.Thread(target=write, daemon=True).start()
        assert written.wait(10), f"the writers' lock was kept after a {ending}"
        names = {name for (name,) in second.read("SELECT name FROM rows")}
        assert names == ({"first", "second"} if ending == "commit" else {"second"})
    finally:
        first.close()
        second.close()


class _nothing:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None
