"""SQLite's one write lock (a real file, two connections): a batch's deferred transaction
reads while another connection writes and commits, then takes the lock to write
(:func:`take_write_lock`); without it, its first write would be refused at once for a
snapshot gone stale, which is why the batches take it explicitly. A saga's handlers run
without it too."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import attrs
import pytest
from sqlalchemy import select
from sqlalchemy.exc import OperationalError

from messaging import Database, MessageStore, message
from messaging.store._database import reads_unlocked, take_write_lock
from projections.testing import open_cluster
from sagas import SagaContext, saga, start


@pytest.fixture
def sqlite_db(tmp_path: Path) -> Iterator[Database]:
    db = Database(f"sqlite:///{tmp_path}/x.db")
    with db.transaction() as conn:
        conn.exec_driver_sql("CREATE TABLE t (x INTEGER)")
    yield db
    db.dispose()


def _write(db: Database, x: int) -> float:
    """Seconds another connection took to write ``x`` and commit."""
    began = time.monotonic()
    with db.transaction() as conn:
        conn.exec_driver_sql(f"INSERT INTO t VALUES ({x})")
    return time.monotonic() - began


def _values(db: Database) -> list[int]:
    with db.read() as conn:
        return [row[0] for row in conn.exec_driver_sql("SELECT x FROM t ORDER BY x")]


def test_a_deferred_transaction_reads_while_another_writes_then_takes_the_lock(
    sqlite_db: Database,
) -> None:
    db = sqlite_db
    with db.transaction(deferred=True) as conn:
        assert reads_unlocked(conn)
        assert conn.exec_driver_sql("SELECT count(*) FROM t").scalar_one() == 0  # its read
        assert _write(db, 1) < 1.0  # the application is not kept waiting meanwhile
        take_write_lock(conn)
        assert not reads_unlocked(conn)
        conn.exec_driver_sql("INSERT INTO t VALUES (2)")
        assert conn.exec_driver_sql("SELECT count(*) FROM t").scalar_one() == 2  # sees 1
    assert _values(db) == [1, 2]


def test_without_taking_the_lock_a_stale_read_cannot_write(sqlite_db: Database) -> None:
    db = sqlite_db
    locked = pytest.raises(OperationalError, match="database is locked")
    with locked, db.transaction(deferred=True) as conn:
        conn.exec_driver_sql("SELECT count(*) FROM t").scalar_one()
        _write(db, 1)
        conn.exec_driver_sql("INSERT INTO t VALUES (2)")  # refused at once: stale
    assert _values(db) == [1]


def test_a_transaction_that_wrote_keeps_its_writes_when_asked_to_take_the_lock(
    sqlite_db: Database,
) -> None:
    db = sqlite_db
    with db.transaction(deferred=True) as conn:
        conn.exec_driver_sql("INSERT INTO t VALUES (1)")  # took the lock by itself
        take_write_lock(conn)  # nothing to do: not committed early, not lost
        conn.exec_driver_sql("INSERT INTO t VALUES (2)")
    assert _values(db) == [1, 2]
    with pytest.raises(RuntimeError), db.transaction(deferred=True) as conn:
        conn.exec_driver_sql("INSERT INTO t VALUES (3)")
        take_write_lock(conn)
        raise RuntimeError("rolled back")
    assert _values(db) == [1, 2]  # 3 rolled back with the rest: not committed early


_BLOCKED, _RELEASE = threading.Event(), threading.Event()


@message("test.lock.trip")
@attrs.define(frozen=True)
class TripStarted:
    trip_id: str


@attrs.define
class TripState:
    legs: int = 0


@saga("lock-trips", topics="lock-trips", correlate_by="trip_id", state=TripState, partitions=1)
class LockTrips:
    @start
    def started(self, event: TripStarted, ctx: SagaContext) -> None:
        _BLOCKED.set()
        _RELEASE.wait(30)  # a slow handler: a call to a service that takes its time
        ctx.state = TripState(legs=1)


def test_a_saga_handler_runs_without_the_write_lock(tmp_path: Path) -> None:
    """While a saga's handler runs (here: until released), the application's own append
    on the same SQLite file commits at once; the saga's batch then commits its state."""
    url = f"sqlite:///{tmp_path}/sagas.db"
    with open_cluster([LockTrips], database_url=url) as cluster:
        cluster.join("i0")
        cluster.append("lock-trips", "t1", [TripStarted("t1")])
        poller = threading.Thread(target=cluster.poll, args=("i0",))
        poller.start()
        try:
            assert _BLOCKED.wait(30), "the handler never ran"
            application = Database(url, table_prefix=cluster.db.schema.prefix)
            began = time.monotonic()
            MessageStore(application).append_committed("lock-trips", "t2", [TripStarted("t2")])
            took = time.monotonic() - began
            application.dispose()
        finally:
            _RELEASE.set()
            poller.join(30)
        assert took < 1.0, f"the application's append waited {took:.2f} s for the handler"
        with cluster.db.read() as conn:
            sagas = cluster.db.schema.sagas
            keys = conn.execute(select(sagas.c.saga_key).where(sagas.c.saga == "lock-trips"))
            assert list(keys.scalars()) == ["t1"]
