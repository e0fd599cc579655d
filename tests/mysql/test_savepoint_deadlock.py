"""A deadlock met inside a savepoint (``begin_nested``, as the framework's inserts that may
race use) rolls the whole transaction back, and SQLAlchemy's rollback to the savepoint then
fails with 1305: a lock conflict like the deadlock behind it, retried, never a crash (an
instance starting on Galera beside another exited on it: both created the tenant's rows)."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest
from sqlalchemy import text
from sqlalchemy.exc import OperationalError

from messaging import ConflictRetrySettings, Database
from messaging.store._retry import is_transient, lock_conflict, retry_transient

TABLE = "sp_deadlock"


@pytest.fixture
def rows(db: Database) -> Iterator[str]:
    table = f"{db.schema.prefix}{TABLE}"
    with db.transaction() as conn:
        conn.execute(text(f"CREATE TABLE {table} (id INT PRIMARY KEY, v INT) ENGINE=InnoDB"))
        conn.execute(text(f"INSERT INTO {table} VALUES (1, 0), (2, 0)"))
    yield table
    with db.transaction() as conn:
        conn.execute(text(f"DROP TABLE {table}"))


def _heavier_opponent(db: Database, table: str, holding: threading.Event) -> None:
    """Takes row 2 and many more changes (InnoDB picks the lighter transaction as the
    deadlock's victim), then row 1."""
    with db.transaction() as conn:
        conn.execute(text(f"UPDATE {table} SET v = v + 1 WHERE id = 2"))
        for i in range(10, 60):
            conn.execute(text(f"INSERT INTO {table} VALUES ({i}, 0)"))
        holding.set()
        conn.execute(text(f"UPDATE {table} SET v = v + 1 WHERE id = 1"))


def test_a_deadlock_inside_a_savepoint_is_a_retried_lock_conflict(db: Database, rows: str) -> None:
    attempts: list[BaseException] = []

    def attempt() -> None:
        holding = threading.Event()
        opponent = threading.Thread(target=_heavier_opponent, args=(db, rows, holding))
        with db.transaction() as conn:
            conn.execute(text(f"UPDATE {rows} SET v = v + 1 WHERE id = 1"))
            if not attempts:  # the first attempt meets the deadlock, inside a savepoint
                opponent.start()
                assert holding.wait(10)
                try:
                    with conn.begin_nested():
                        conn.execute(text(f"UPDATE {rows} SET v = v + 1 WHERE id = 2"))
                finally:
                    opponent.join(10)

    def retried(exc: BaseException) -> None:
        attempts.append(exc)

    retry_transient(attempt, ConflictRetrySettings(), what="test", on_retry=retried)
    assert len(attempts) == 1
    (error,) = attempts
    assert isinstance(error, OperationalError) and "1305" in str(error.orig)  # SAVEPOINT gone
    assert is_transient(error) and lock_conflict(error) == "deadlock"
    with db.read() as conn:
        assert conn.execute(text(f"SELECT v FROM {rows} WHERE id = 1")).scalar_one() == 2
